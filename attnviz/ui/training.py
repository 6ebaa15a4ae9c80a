"""The window's training run: a thin Qt adapter over attnviz.core.maths.training_run.

The run steps on the window's worker pool, a chunk of about 40 ms at a time; each
chunk's ``Progress`` comes back to the UI thread, which draws its curves and puts the
trained layer in the document without an undo entry, so every view follows: at most
once a chunk, and only once the views have the layer shown before and have answered
every question about it. A click (a head or a cell picked) ends the chunk after its
step and holds the run a moment, so its answer is drawn at full speed. The run is one
undoable step: its entry ("Train N steps", from the scenario before it to the one
shown) is made with the first chunk and finished when the run pauses. An edit pauses
the run first; anything else that changes the document under it (undo, opening a
file) stops it.
"""

from __future__ import annotations

import threading

from PySide6.QtCore import QObject, QTimer, Signal

from attnviz.core.maths.explain import Explanation
from attnviz.core.maths.explain_step import explain_step
from attnviz.core.maths.scenario import Scenario, ScenarioError
from attnviz.core.maths.training_run import Progress, RunConfig, TrainingRun
from attnviz.core.session import SwapScenario
from attnviz.ui.commands import UndoCommand
from attnviz.ui.compute import ComputeService
from attnviz.ui.document import Document
from attnviz.ui.view_state import ViewState
from attnviz.ui.workers import SerialQueue

CHUNK_S = 0.04  # seconds of steps per chunk: a click waits for one step at most
QUIET_MS = 150  # after a click, the time its answer has before the run goes on


class Training(QObject):
    """Play, pause, step, reset and scrub a training run of the document's scenario."""

    progressed = Signal(object)  # Progress, or None after Reset
    runningChanged = Signal(bool)
    message = Signal(str)
    _chunk = Signal(int, object, bool, str)  # generation, Progress, final, error

    def __init__(
        self,
        doc: Document,
        compute: ComputeService,
        view_state: ViewState,
        parent: QObject | None = None,
    ):
        super().__init__(parent)
        self.doc, self.compute = doc, compute
        self.config = RunConfig()
        self.run: TrainingRun | None = None
        self.progress: Progress | None = None
        self.running = False
        self._queue = SerialQueue()
        self._stop = threading.Event()
        self._generation = 0
        self._start: Scenario | None = None  # the scenario before the open entry
        self._start_step = 0
        self._entry: SwapScenario | None = None
        self._undo_entry: UndoCommand | None = None  # the entry as the undo stack holds it
        self._target: int | None = None  # the step to stop at, if any
        self._waiting: Progress | None = None  # to show once the views have the last one
        self._in_flight = False  # a chunk is running
        self._hold = threading.Event()  # a click: the chunk ends after the step under way
        self._chunk.connect(self._deliver)
        doc.before_edit(self._before_edit)
        compute.busyChanged.connect(self._views_ready)
        compute.answered.connect(lambda *_: self._views_ready(compute.busy))
        self._quiet = QTimer(self)  # after a click: no new chunk or frame for a moment
        self._quiet.setSingleShot(True)
        self._quiet.setInterval(QUIET_MS)
        self._quiet.timeout.connect(lambda: self._views_ready(compute.busy))
        for clicked in (view_state.headChanged, view_state.selectionChanged):
            clicked.connect(self._clicked)

    # Commands -------------------------------------------------------------------------

    def configure(self, config: RunConfig) -> None:
        """The next run's settings (a run under way keeps its own)."""
        self.config = config

    def start(self, config: RunConfig | None = None, steps: int | None = None) -> None:
        """A new run from the document's scenario (forgetting the last one), played for
        ``steps`` steps or until paused."""
        if config is not None:
            self.config = config
        self.pause(wait=True)
        self.run = None
        self.play(steps)

    def play(self, steps: int | None = None) -> None:
        """Go on training (``steps`` more, or until paused). The run goes on where it
        stopped if the document still shows its latest layer and the settings are its
        own; otherwise a new run starts from what the document shows."""
        if self.running:
            return
        self._queue.wait()  # a chunk dropped by an edit may still be finishing its step
        if not self._continues():
            try:
                self.run = TrainingRun(self.doc.scenario, self.config)
            except ScenarioError as e:
                self.message.emit(f"Cannot train: {e}")
                return
            self.progress = self.run.progress()
            self.progressed.emit(self.progress)
        assert self.run is not None
        self._start, self._start_step, self._entry = self.doc.scenario, self.run.steps, None
        self.progress = self.run.progress()
        self._set_running(True)
        self._stop.clear()
        self._generation += 1
        self._target = None if steps is None else self.run.steps + max(1, steps)
        self._submit()

    def step(self, steps: int = 1) -> None:
        self.play(steps)

    def pause(self, wait: bool = False) -> None:
        """Stop after the step under way; the entry is finished when its last chunk
        (with the losses at that step) arrives, or now with ``wait``."""
        if not self.running:
            return
        self._stop.set()
        if wait:
            self._queue.wait()
            from PySide6.QtCore import QCoreApplication

            QCoreApplication.processEvents()

    def reset(self) -> None:
        """Forget the run (its curves and snapshots); the undo history stays."""
        self._halt()
        self.run, self.progress = None, None
        self.progressed.emit(None)

    def scrub(self, index: int) -> None:
        """Show snapshot ``index`` and make it the run's result (pausing first)."""
        if self.progress is None or not 0 <= index < len(self.progress.snapshots):
            return
        self.pause(wait=True)
        step, scenario = self.progress.snapshots[index]
        if self._entry is not None and self._entry_on_top():
            self._amend(scenario, self._text(step - self._start_step))
        elif self.doc.scenario is not scenario:
            self._start, self._start_step = self.doc.scenario, step
            self._push(SwapScenario(self.doc.scenario, scenario, f"Show training step {step}"))

    def step_of(self, view: str, head: int | None, row: int, col: int) -> Explanation | None:
        """The latest step of a trained entry (a cell of grid ``view``; under a task a
        cell of X is its token's row of E), written out; None when the document does not
        show the run's latest step or the matrix did not train."""
        progress, run = self.progress, self.run
        if progress is None or progress.last is None or run is None:
            return None
        if self.doc.scenario is not progress.scenario:
            return None
        last = progress.last
        task = run.main.task
        name, cell = view, (row, col) if head is None else (head, row, col)
        where = f"{view}[{row + 1},{col + 1}]" + ("" if head is None else f" (head {head + 1})")
        if view == "X" and task is not None and row < len(progress.scenario.tokens):
            token = progress.scenario.tokens[row]
            name, cell = "E", (task.vocabulary.index(token), col)
            where = f"E[{token},{col + 1}] (X row {row + 1})"
        try:
            return explain_step(last, name, cell, where)
        except (KeyError, IndexError, ValueError):
            return None

    def close(self) -> None:
        self._halt()
        self._queue.close()

    def wait(self) -> None:
        """Until the run has paused and its last chunk is shown (tests and scripts)."""
        from PySide6.QtCore import QCoreApplication

        while self.running:
            self._queue.wait()
            QCoreApplication.processEvents()

    # The chunks -----------------------------------------------------------------------

    def _submit(self) -> None:
        run, gen, stop, target, hold = (
            self.run,
            self._generation,
            self._stop,
            self._target,
            self._hold,
        )
        hold.clear()
        assert run is not None

        def chunk() -> None:
            try:
                left = None if target is None else target - run.steps
                run.advance(CHUNK_S, lambda: stop.is_set() or hold.is_set(), left)
                final = stop.is_set() or (target is not None and run.steps >= target)
                if final:
                    run.record()
                self._chunk.emit(gen, run.progress(), final, "")
            except Exception as e:  # shown to the user; the run stops where it was
                self._chunk.emit(gen, run.progress(), True, f"{type(e).__name__}: {e}")

        self._in_flight = True
        self._queue.submit(chunk)

    def _deliver(self, gen: int, progress: Progress, final: bool, error: str) -> None:
        if gen != self._generation or not self.running:
            return
        if error:
            self.message.emit(f"Training stopped: {error}")
        if self.doc.scenario is not self._shown():  # undone, opened, restored: not ours
            self._halt()
            return
        self.progress = progress
        self._in_flight = False
        if final:
            self._waiting = None
            self._show(progress)
            self._set_running(False)
        else:
            self._waiting = progress
            self._views_ready(self.compute.busy)
        self.progressed.emit(progress)

    def _clicked(self) -> None:
        """A head or a cell picked: the chunk ends after its step, and the run waits a
        moment, so that the answer is drawn at full speed before the next frame."""
        if self.running:
            self._hold.set()
            self._quiet.start()

    def _views_ready(self, busy: bool) -> None:
        """The views have the layer shown last and have answered what they asked about it
        (the Inspector's cell, say): show the newest, or train on."""
        if busy or not self.running or self._quiet.isActive():
            return
        if not self.compute.scheduler.idle():
            return
        if self._waiting is not None:
            progress, self._waiting = self._waiting, None
            self._show(progress)
        QTimer.singleShot(0, self._go_on)

    def _go_on(self) -> None:
        """The next chunk, once the views have answered everything asked of them (the
        chunk holds the interpreter while it runs: a click waits for it at most)."""
        if not self.running or self._in_flight or self._waiting is not None:
            return
        if self._quiet.isActive():
            return
        if self.compute.busy or not self.compute.scheduler.idle():
            return  # (asked again when the compute service answers)
        self._submit()

    def _shown(self) -> Scenario | None:
        return self._start if self._entry is None else self._entry.new

    def _show(self, progress: Progress) -> None:
        """The run's layer in the document: the run's one entry, made or moved on."""
        text = self._text(progress.step - self._start_step)
        if self._entry is not None:
            self._amend(progress.scenario, text)
        elif progress.step > self._start_step and self._start is not None:
            self._push(SwapScenario(self._start, progress.scenario, text))

    def _push(self, entry: SwapScenario) -> None:
        self._entry, self._undo_entry = entry, UndoCommand(self.doc.session, entry)
        self.doc.undo_stack.push(self._undo_entry)  # (not doc.push: that pauses the run)

    def _amend(self, scenario: Scenario, text: str) -> None:
        """Move the open entry on to ``scenario`` (the document shows it from now)."""
        assert self._entry is not None and self._undo_entry is not None
        self._entry.new, self._entry.text = scenario, text
        self._undo_entry.setText(text)
        self.doc.session.set_scenario(scenario)

    @staticmethod
    def _text(steps: int) -> str:
        return f"Train {steps} step{'s' if steps != 1 else ''}"

    def _entry_on_top(self) -> bool:
        stack = self.doc.undo_stack
        k = stack.index()
        return k == stack.count() and k > 0 and stack.command(k - 1) is self._undo_entry

    def _continues(self) -> bool:
        """Whether the document still shows the run's latest layer, and the run has the
        settings asked for (how often it evaluates aside)."""
        run = self.run
        if run is None or self.progress is None:
            return False
        return (
            run.config.same_run(self.config)
            and self.progress.step == run.steps
            and self.doc.scenario is run.scenario
        )

    def _before_edit(self) -> None:
        """An edit while training: the run stops where the document shows it, and its
        entry is closed there, before the edit goes on top."""
        if self.running:
            self._halt()

    def _halt(self) -> None:
        """Stop now, dropping the chunk under way (the document keeps what it shows)."""
        self._stop.set()
        self._generation += 1
        self._waiting = None
        self._in_flight = False
        self._set_running(False)

    def _set_running(self, on: bool) -> None:
        if on != self.running:
            self.running = on
            self.runningChanged.emit(on)
