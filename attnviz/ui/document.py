"""Document: the scenario, its undo stack and the latest Result, for one window.

State flows one way: a command on the undo stack calls ``set_cells`` or
``set_scenario``; the document recomputes (incrementally where it can) and emits
``resultChanged`` once with the new Result; every view redraws from that. Small
scenarios are computed at once; large ones on a worker thread, where a newer edit
supersedes an older one (a generation counter drops stale results).
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PySide6.QtCore import QObject, Signal
from PySide6.QtGui import QUndoStack

from attnviz.core.maths.engine import Result, compute, update
from attnviz.core.maths.scenario import WEIGHT_NAMES, Scenario
from attnviz.core.presets import worked_example

# Scenarios with at most this many score cells (heads × n²) are computed on the UI thread.
SYNC_SCORE_CELLS = 1 << 16
# The engines the views can show, and the torch dtype of each.
ENGINES = {"numpy": "", "torch-float64": "float64", "torch-float32": "float32"}


def computes_at_once(s: Scenario) -> bool:
    """Small enough to compute on the UI thread before the next frame."""
    return s.n_heads * s.n * s.n <= SYNC_SCORE_CELLS


@dataclass
class Dirty:
    """What changed since the last computed result, for an incremental update."""

    x_rows: set[int] = field(default_factory=set)
    heads: set[int] = field(default_factory=set)
    w_o: bool = False
    full: bool = False


@dataclass(frozen=True)
class Selection:
    """The cell the user picked in some view; the Inspector explains it.

    ``mask`` is set when the view shows the scenario under another mask strategy than
    its own (the Masks comparison); heads are 0-based, None for layer-wide matrices.
    """

    view: str
    head: int | None
    row: int
    col: int
    mask: str | None = None


class Document(QObject):
    """One scenario being edited: undo stack, file path, selected head, latest result."""

    scenarioChanged = Signal()  # the shape or anything beyond a few cells changed
    cellsChanged = Signal(str, object, int, int, int, int)  # name, head, row, col, rows, cols
    resultChanged = Signal(object)  # Result (a preview of the selected head first, when large)
    headChanged = Signal(int)
    pathChanged = Signal()
    busyChanged = Signal(bool)
    selectionChanged = Signal(object)  # Selection
    engineChanged = Signal(str)
    computeFailed = Signal(str)
    _computed = Signal(int, object, str, object)  # generation, Scenario, engine, Result
    _failed = Signal(int, str)  # generation, message

    def __init__(self, scenario: Scenario | None = None, parent: QObject | None = None):
        super().__init__(parent)
        self.scenario = scenario or worked_example()
        self.undo_stack = QUndoStack(self)
        self.path: Path | None = None
        self.head = 0
        self.selection: Selection | None = None
        self.engine = "numpy"
        self.result: Result = compute(self.scenario)
        self.result_scenario = self.scenario  # what self.result was computed from
        self._base = self.result  # the newest computed result, base for incremental updates
        self._dirty = Dirty()
        self._generation = 0
        self._busy = False
        self._preview_shown = threading.Event()
        self._preview_held = False
        self._pending = False  # changes not yet handed to the worker
        self._closed = False
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="attnviz-compute")
        self._computed.connect(self._on_computed)
        self._failed.connect(self._on_failed)

    # Edits (called by commands only) --------------------------------------------------

    def set_cells(
        self, name: str, head: int | None, row: int, col: int, values: np.ndarray
    ) -> None:
        values = np.atleast_2d(values)
        self.scenario = self.scenario.with_cells(name, head, row, col, values)
        rows, cols = values.shape
        if name == "X":
            self._dirty.x_rows.update(range(row, row + rows))
        elif name in WEIGHT_NAMES and head is not None:
            self._dirty.heads.add(head)
        else:
            self._dirty.w_o = True
        self.cellsChanged.emit(name, head, row, col, rows, cols)
        self._recompute()

    def set_scenario(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self._dirty.full = True
        if self.head >= self.n_heads:
            self.set_head(self.n_heads - 1)
        self.scenarioChanged.emit()
        self._recompute()

    def reset(self, scenario: Scenario, path: Path | None) -> None:
        """Start over on a scenario with no undo history (restoring autosaved work)."""
        self.undo_stack.clear()
        self.path = path
        self.set_scenario(scenario)
        self.undo_stack.setClean()
        self.pathChanged.emit()

    def set_path(self, path: Path | None, clean: bool = True) -> None:
        """The file the document is saved in; clean marks the current state as saved."""
        self.path = path
        if clean:
            self.undo_stack.setClean()
        self.pathChanged.emit()

    def set_head(self, head: int) -> None:
        head = max(0, min(head, self.n_heads - 1))
        if head != self.head:
            self.head = head
            self.headChanged.emit(head)

    def select(self, selection: Selection | None) -> None:
        self.selection = selection
        self.selectionChanged.emit(selection)

    @property
    def n_heads(self) -> int:
        """Heads in the result: 1 with projections off."""
        return self.scenario.n_heads if self.scenario.settings.projections else 1

    @property
    def busy(self) -> bool:
        return self._busy

    # Recompute ----------------------------------------------------------------------

    def set_engine(self, engine: str) -> None:
        """Which engine the views show: "numpy" (float64, the reference) or
        "torch-float64" / "torch-float32" (on CUDA when present). torch loads on first use."""
        if engine not in ENGINES:
            raise ValueError(f"engine {engine!r}: expected one of {', '.join(ENGINES)}")
        if engine != self.engine:
            self.engine = engine
            self.engineChanged.emit(engine)
            self._dirty.full = True
            self._recompute()

    def _recompute(self) -> None:
        self._generation += 1
        s = self.scenario
        if self.engine == "numpy" and computes_at_once(s):
            self._dirty = Dirty()
            self._pending = False
            self._publish(compute(s), s)
            return
        self._pending = True
        if not self._busy:
            self._start()

    def _start(self) -> None:
        self._set_busy(True)
        self._pending = False
        job = (self._generation, self.scenario, self._base, self._dirty, self.head, self.engine)
        self._dirty = Dirty()
        self._pool.submit(self._work, *job)

    def _work(
        self, gen: int, s: Scenario, base: Result, dirty: Dirty, head: int, engine: str
    ) -> None:
        try:
            self._compute(gen, s, base, dirty, head, engine)
        except Exception as e:  # e.g. torch missing or out of memory: say so, keep going
            self._failed.emit(gen, f"{type(e).__name__}: {e}")

    def _compute(
        self, gen: int, s: Scenario, base: Result, dirty: Dirty, head: int, engine: str
    ) -> None:
        """On the worker thread: the shown head first (a preview), then the rest."""
        if engine != "numpy":
            from attnviz.core.maths.torch_engine import compute_torch

            self._computed.emit(gen, s, engine, compute_torch(s, "auto", ENGINES[engine]))
            return
        if dirty.full:
            self._computed.emit(gen, s, engine, compute(s))
            return
        args = (s, dirty.x_rows, dirty.heads, dirty.w_o)
        fresh: list[int] = []
        if dirty.x_rows or head in dirty.heads:
            self._preview_shown.clear()
            preview = update(base, *args, only=head)
            self._computed.emit(gen, s, engine, preview)
            if preview.complete:
                return
            # The rest would compete with the UI for the two cores: let it draw first.
            self._preview_shown.wait(timeout=1.0)
            base, fresh = preview, [head]
        self._computed.emit(gen, s, engine, update(base, *args, fresh=fresh))

    def _on_computed(self, gen: int, s: Scenario, engine: str, result: Result) -> None:
        if self._closed:
            return
        self._preview_held = False  # a view still drawing the last preview will not be waited for
        if result.complete and engine == "numpy":
            self._base = result  # incremental updates build on reference results only
        if gen != self._generation:  # superseded
            if result.complete:
                self._set_busy(False)
                if self._pending:
                    self._start()
            else:
                self._preview_shown.set()
            return
        if result.complete:
            self._set_busy(False)
        self._publish(result, s)
        if not result.complete and not self._preview_held:
            self._preview_shown.set()  # nobody is drawing it

    def _on_failed(self, gen: int, message: str) -> None:
        if self._closed:
            return
        self._set_busy(False)
        self._dirty.full = True  # the failed job's changes were taken: recompute everything
        if self.engine != "numpy":
            message += "; showing the NumPy engine instead"
            self.engine = "numpy"
            self.engineChanged.emit(self.engine)
            self._recompute()
        elif gen != self._generation or self._pending:
            self._start()
        self.computeFailed.emit(message)

    def hold_preview(self) -> None:
        """The preview just published will be drawn; call preview_drawn() once it is."""
        self._preview_held = True

    def preview_drawn(self) -> None:
        self._preview_held = False
        self._preview_shown.set()

    def _publish(self, result: Result, scenario: Scenario) -> None:
        if result.complete and self.engine == "numpy":
            self._base = result
        self.result, self.result_scenario = result, scenario
        self.resultChanged.emit(result)

    def _set_busy(self, busy: bool) -> None:
        if busy != self._busy:
            self._busy = busy
            self.busyChanged.emit(busy)

    def wait(self) -> None:
        """Block until pending computation has been published (for tests and scripts)."""
        from PySide6.QtCore import QCoreApplication

        while self._busy:
            QCoreApplication.processEvents()

    def close(self) -> None:
        self._closed = True
        self._preview_shown.set()
        self._pool.shutdown(wait=True, cancel_futures=True)
