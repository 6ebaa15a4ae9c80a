"""The compute service: the latest Result of the document, and results under other settings.

It follows the document's changes and the view state's engine. Small scenarios are
computed at once, on the UI thread; large ones on a worker, the shown head first (a
preview the views draw at once), then the other heads (published before the mix, which
views of heads alone draw), then the mix. Up to 512 tokens that preview is made
on the UI thread (a few milliseconds, and no hand-off to the worker and back). A
result older than the latest edit is dropped (a generation counter). ``result_for`` gives
any panel the result of a variant (another mask, say), computed once and cached, so
panels share it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

from PySide6.QtCore import QObject, QTimer, Signal

from attnviz.core.maths.changes import Changes, changes_between
from attnviz.core.maths.engine import Result, compute, update_with
from attnviz.core.maths.scenario import Scenario
from attnviz.core.session import Change
from attnviz.ui.document import Document
from attnviz.ui.view_state import ENGINES, ViewState
from attnviz.ui.workers import SerialQueue

# Scenarios with at most this many score cells (heads × n²), weights, and multiply-adds in
# the projections are computed on the UI thread.
SYNC_SCORE_CELLS = 1 << 16
SYNC_WEIGHTS = 1 << 22
SYNC_PROJECTION_WORK = 1 << 26
CACHED_RESULTS = 8
SYNC_PREVIEW_CELLS = 1 << 18
SYNC_PREVIEW_WEIGHTS = 1 << 23
PARTIAL_WAIT_S = 1.0  # the longest the rest waits for a partial result to be drawn


def previews_at_once(s: Scenario) -> bool:
    """Whether one head's update after an edit is a fraction of a frame's work (up to
    512 × 512 scores, a GPT-2-sized layer's weights; with projections, without which
    every edit is a full compute): then the shown head is updated on the UI thread, with
    no hand-off to the worker and back before it is drawn (2–3 ms, which matter only
    when the whole edit fits in a frame; larger heads keep the UI thread free)."""
    weights = s.weight_count
    cells, projections = s.n * s.m, s.settings.projections
    return projections and cells <= SYNC_PREVIEW_CELLS and weights <= SYNC_PREVIEW_WEIGHTS


def computes_at_once(s: Scenario) -> bool:
    """Small enough to compute on the UI thread before the next frame (a layer of a large
    model has few score cells but millions of weights to copy and multiply)."""
    weights = s.weight_count
    return (
        s.n_heads * s.n * s.m <= SYNC_SCORE_CELLS
        and weights <= SYNC_WEIGHTS
        and weights * max(s.n, s.m) <= SYNC_PROJECTION_WORK
    )


@dataclass
class _Job:
    """One computation: of the scenario, from base, for the changes in dirty."""

    gen: int
    scenario: Scenario
    base: Result
    dirty: Changes
    head: int  # the shown head
    engine: str
    done: list[int] = field(default_factory=list)  # heads of base already current
    preview: bool = True  # whether a preview of the shown head would be drawn


def _shows(job: _Job) -> bool:
    """Whether a preview of the shown head comes first: one would be drawn, and the
    job's changes touch that head."""
    dirty, kv = job.dirty, job.scenario.kv_head_of(job.head)
    touched = dirty.x_rows or dirty.kv_rows or job.head in dirty.heads
    return job.preview and bool(touched or kv in dirty.kv_heads | dirty.v_heads)


Key = tuple[object, ...]  # what names a scenario's result (_key)


def _key(s: Scenario) -> Key:
    """Scenarios are immutable and share unchanged arrays: identity of the arrays and the
    settings name a result."""
    return (*s.array_ids(), s.tokens, s.kv_tokens, s.settings)


class ComputeService(QObject):
    """The latest Result for the document, published once per change."""

    resultChanged = Signal(object)  # Result (a preview of the shown head first, when large)
    busyChanged = Signal(bool)
    computeFailed = Signal(str)
    _computed = Signal(int, object, str, object)  # generation, Scenario, engine, Result
    _failed = Signal(int, str)  # generation, message

    def __init__(self, doc: Document, view: ViewState, parent: QObject | None = None):
        super().__init__(parent)
        self.doc, self.view = doc, view
        self.result: Result = compute(doc.scenario)
        self.result_scenario = doc.scenario  # what self.result was computed from
        self._base = self.result  # the newest reference result, base for incremental updates
        self._dirty = Changes()
        self._generation = 0
        self._busy = False
        self._partial_shown = threading.Event()
        self._partial_held = False
        self._pending = False  # changes not yet handed to the worker
        self._held: _Job | None = None  # the rest of a preview's job, queued once it is drawn
        self._release = QTimer(self, singleShot=True, interval=int(PARTIAL_WAIT_S * 1000))
        self._release.timeout.connect(self._submit_held)
        self._closed = False
        # Whether a preview would be drawn now (the window says: while its pipeline is on
        # screen); when not, an edit's job goes to the worker whole, with no preview first.
        self.previews: Callable[[], bool] = lambda: True
        self._queue = SerialQueue()
        self._cache: OrderedDict[Key, tuple[Scenario, Result]] = OrderedDict()
        self._cache_lock = threading.Lock()
        self._underway: dict[Key, Future[Result]] = {}  # by result_for
        # The last head_result made as a preview, for result_for to complete: its key, and
        # the key, scenario and result it was updated from, and itself.
        self._head_made: tuple[Key, Key, Scenario, Result] | None = None
        self._document_key: Key | None = None
        self._remember(doc.scenario, self.result, document=True)
        self._computed.connect(self._on_computed)
        self._failed.connect(self._on_failed)
        doc.session.subscribe(self._on_change)
        view.engineChanged.connect(self._on_engine)

    @property
    def busy(self) -> bool:
        return self._busy

    # Results of variants ------------------------------------------------------------

    def result_for(self, s: Scenario) -> Result:
        """compute(s), cached: the document's own result when s is what it was computed
        from, else one computed once for every panel that asks. Safe on any thread.

        A result of a scenario that differs from s in cells alone (the last one asked for
        under another mask, say, before the document's latest edit) is updated to s
        rather than s computed anew, and s's takes its place. Asked for by two threads at
        once, it is computed once (the second waits for the first)."""
        key = _key(s)
        current: tuple[int, ...] = ()  # heads made already (head_result)
        with self._cache_lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key][1]
            waiting = self._underway.get(key)  # (another thread is computing it)
            if waiting is None:
                underway: Future[Result] = Future()
                self._underway[key] = underway
                near = self._near(s)
                made = self._head_made
                if made is not None and made[0] == key:  # its head made already: the rest
                    self._head_made = None
                    near, current = made[1:], made[3].fresh
        if waiting is not None:
            return waiting.result()
        try:
            if near is None:
                result = compute(s)
            else:
                near_key, old, base = near
                result = update_with(base, s, changes_between(old, s), current_heads=current)
            self._remember(s, result, replacing=None if near is None else near_key)
            underway.set_result(result)
            return result
        except BaseException as e:
            underway.set_exception(e)
            raise
        finally:
            with self._cache_lock:
                del self._underway[key]

    def has_near(self, s: Scenario) -> bool:
        """Whether head_result(s, …) is one head's work: a result of s, or of a scenario
        near it, is cached (and none of s is being made by another thread)."""
        key = _key(s)
        with self._cache_lock:
            if key in self._underway:
                return False
            return key in self._cache or self._near(s) is not None

    def head_result(self, s: Scenario, head: int) -> Result:
        """A result of s in which the given head is current, the others perhaps not (a
        preview, for a view of that head alone): a cached one, or that head updated from
        the newest cached result near s (result_for then makes the rest, not the head
        again); result_for(s) when none is near. Safe on any thread."""
        key = _key(s)
        with self._cache_lock:
            if key in self._cache:
                return self._cache[key][1]
            made = self._head_made
            if made is not None and made[0] == key and head in made[3].fresh:
                return made[3]
            near = None if key in self._underway else self._near(s)
        if near is None:
            return self.result_for(s)
        near_key, old, base = near
        preview = update_with(base, s, changes_between(old, s), preview_head=head)
        if preview.complete:  # (nothing else to make)
            self._remember(s, preview, replacing=near_key)
        else:
            with self._cache_lock:
                self._head_made = (key, near_key, old, preview)
        return preview

    def _near(self, s: Scenario) -> tuple[Key, Scenario, Result] | None:
        """The newest cached result (its key, scenario and result) of a scenario with s's
        settings and tokens, but not the document's (it stays for the views)."""
        same_kind = (s.settings, s.tokens, s.kv_tokens)
        for key, (old, result) in reversed(self._cache.items()):
            if key != self._document_key and (old.settings, old.tokens, old.kv_tokens) == same_kind:
                return key, old, result
        return None

    def _remember(
        self,
        s: Scenario,
        result: Result,
        document: bool = False,
        replacing: Key | None = None,
    ) -> None:
        """Cache the result of s; the document's (``document``) replaces its last one, and
        another the one it was updated from (``replacing``).

        Earlier results are not kept: at GPT-2 sizes each holds tens of megabytes, and
        while a cache of them filled up, every edit's arrays were fresh memory, paid for
        in page faults (5 ms an edit at n = 512)."""
        key = _key(s)
        with self._cache_lock:
            if document:
                replacing, self._document_key = self._document_key, key
            if replacing is not None and replacing != self._document_key:
                self._cache.pop(replacing, None)  # (never the document's: views show it)
            self._cache[key] = (s, result)  # s keeps the arrays (and so their ids) alive
            while len(self._cache) > CACHED_RESULTS:
                self._cache.popitem(last=False)

    # Following the document --------------------------------------------------------

    def _on_change(self, change: Change) -> None:
        if change.kind == "cells":
            rows = range(change.row, change.row + change.rows)
            self._dirty.note(change.name, change.head, rows)
        elif change.kind == "scenario":
            self._dirty.full = True
        else:
            return
        self._recompute()

    def _on_engine(self, _engine: str) -> None:
        self._dirty.full = True
        self._recompute()

    def _recompute(self) -> None:
        self._generation += 1
        s = self.doc.scenario
        if self.view.engine == "numpy" and computes_at_once(s):
            self._dirty = Changes()
            self._pending = False
            self._publish(compute(s), s)
            return
        self._pending = True
        if not self._busy:
            self._start()

    def _start(self) -> None:
        self._set_busy(True)
        self._pending = False
        s, dirty, head = self.doc.scenario, self._dirty, self.view.head
        job = _Job(
            self._generation, s, self._base, dirty, head, self.view.engine, preview=self.previews()
        )
        self._dirty = Changes()
        if job.engine == "numpy" and not dirty.full and previews_at_once(s) and _shows(job):
            try:
                preview = update_with(job.base, s, dirty, preview_head=head)
            except Exception:  # e.g. out of memory: the worker tries again, and says why
                preview = None
            if preview is not None:
                self._show_preview(preview, s)
                if preview.complete:
                    self._set_busy(False)
                    return
                job.base, job.done = preview, [head]
                if self._partial_held:  # queued once it is on screen (or after a while)
                    self._held = job
                    self._release.start()
                    return
        self._queue.submit(lambda: self._work(job))

    def _submit_held(self) -> None:
        """Queue the job held back while its preview was drawn."""
        self._release.stop()
        job, self._held = self._held, None
        if job is not None:
            self._queue.submit(lambda: self._work(job))

    def _work(self, job: _Job) -> None:
        try:
            self._compute(job)
        except Exception as e:  # e.g. torch missing or out of memory: say so, keep going
            self._failed.emit(job.gen, f"{type(e).__name__}: {e}")

    def _compute(self, job: _Job) -> None:
        """On the worker thread: the shown head first (a preview) unless it was shown
        already (job.done), then the other heads (published before the mix, for the views
        of heads alone), then the mix."""
        gen, s, base, dirty, engine = job.gen, job.scenario, job.base, job.dirty, job.engine
        if engine != "numpy":
            from attnviz.core.maths.torch_engine import compute_torch

            self._computed.emit(gen, s, engine, compute_torch(s, "auto", ENGINES[engine][0]))
            return
        if dirty.full:
            self._computed.emit(gen, s, engine, compute(s))
            return
        done = job.done  # (a preview made on the UI thread: queued once it was drawn)
        if not done and _shows(job):
            preview = update_with(base, s, dirty, preview_head=job.head)
            if preview.complete:
                self._computed.emit(gen, s, engine, preview)
                return
            self._publish_partial(gen, s, engine, preview)
            base, done = preview, [job.head]
        result = update_with(base, s, dirty, current_heads=done, mix=False)
        if not result.complete:  # every head current, the mix not yet
            self._publish_partial(gen, s, engine, result)
            result = update_with(result, s, dirty, current_heads=range(s.n_heads))
        self._computed.emit(gen, s, engine, result)

    def _publish_partial(self, gen: int, s: Scenario, engine: str, result: Result) -> None:
        """On the worker thread: publish a result that is not complete, then wait while a
        view draws it (PARTIAL_WAIT_S at most): the rest would compete with the UI for the
        two cores."""
        self._partial_shown.clear()
        self._computed.emit(gen, s, engine, result)
        self._partial_shown.wait(timeout=PARTIAL_WAIT_S)

    def _on_computed(self, gen: int, s: Scenario, engine: str, result: Result) -> None:
        if self._closed:
            return
        self._partial_held = False  # a view still drawing the last partial result: not waited for
        if result.complete and engine == "numpy":
            self._base = result  # incremental updates build on reference results only
        if gen != self._generation:  # superseded
            if result.complete:
                self._set_busy(False)
                if self._pending:
                    self._start()
            else:
                self._partial_shown.set()
            return
        if result.complete:
            self._set_busy(False)
        self._publish(result, s)
        if not result.complete and not self._partial_held:
            self._partial_shown.set()  # nobody is drawing it

    def _on_failed(self, gen: int, message: str) -> None:
        if self._closed:
            return
        self._set_busy(False)
        self._dirty.full = True  # the failed job's changes were taken: recompute everything
        if self.view.engine != "numpy":
            self.view.set_engine("numpy")  # recomputes, through engineChanged
            self.computeFailed.emit(message + "; showing the NumPy engine instead")
            return
        if gen != self._generation or self._pending:
            self._start()
        self.computeFailed.emit(message)

    # The handshake of partial results -------------------------------------------------

    def hold_partial(self) -> None:
        """The result just published before it was complete (a preview of the shown head,
        or every head before the mix) will be drawn; call partial_drawn() once it is.

        The rest (the other heads, or the mix) is computed after that (or after
        PARTIAL_WAIT_S without it), so that it is on screen before the cores are busy
        again; a preview made on the UI thread does not even wake the worker before then."""
        self._partial_held = True

    def partial_drawn(self) -> None:
        self._partial_held = False
        self._partial_shown.set()
        self._submit_held()

    def _show_preview(self, preview: Result, scenario: Scenario) -> None:
        """Publish a preview made on the UI thread (a view that will draw it says so:
        hold_partial, and _start holds the rest back until it is drawn)."""
        self._partial_held = False
        self._publish(preview, scenario)

    def _publish(self, result: Result, scenario: Scenario) -> None:
        if result.complete and self.view.engine == "numpy":
            self._base = result
            self._remember(scenario, result, document=True)
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
        self._release.stop()
        self._held = None  # (never to run)
        self._partial_shown.set()
        self._queue.close()
