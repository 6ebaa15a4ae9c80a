"""The compute service: a thin Qt adapter over the core scheduler (attnviz.core.scheduler).

Every change of the document (and of the engine) becomes a request for a new version;
the scheduler's events come back as signals on the UI thread, those of an older version
dropped: ``headReady`` (the shown head, before the rest), ``resultChanged`` (the whole
layer), ``answered`` (a view's query). ``result`` is the newest complete result.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QCoreApplication, QObject, QTimer, Signal

from attnviz.core.maths.results import HeadResult, Result
from attnviz.core.maths.reuse import compute_from
from attnviz.core.maths.scenario import Scenario
from attnviz.core.scheduler import (
    Answered,
    Event,
    Failed,
    HeadReady,
    LayerReady,
    Query,
    Request,
    Results,
    Scheduler,
)
from attnviz.core.session import Change
from attnviz.ui.document import Document
from attnviz.ui.view_state import ViewState


class ComputeService(QObject):
    """The newest results of the document, as signals."""

    headReady = Signal(object)  # HeadResult: the shown head of the newest version
    resultChanged = Signal(object)  # Result: the whole layer of the newest version
    answered = Signal(str, object)  # query name, its value (of the newest version)
    queryFailed = Signal(str, str)  # query name, why
    busyChanged = Signal(bool)
    computeFailed = Signal(str)
    _event = Signal(object)  # from the scheduler, on any thread

    def __init__(self, doc: Document, view: ViewState, parent: QObject | None = None):
        super().__init__(parent)
        self.doc, self.view = doc, view
        self.version = 0
        self.result: Result = compute_from(doc.scenario, None)
        self.result_scenario: Scenario = doc.scenario  # what self.result was computed from
        self.shown: HeadResult | None = None  # the newest version's shown head, if made
        self._request = Request(0, doc.scenario)
        self._busy = False
        self._closed = False
        self._traffic = 0  # questions asked and events received: wait() waits for quiet
        self._event.connect(self._on_event)
        self.scheduler = Scheduler(self._event.emit, later=lambda work: QTimer.singleShot(0, work))
        self.scheduler.adopt(self._request, self.result)
        doc.session.subscribe(self._on_change)
        view.engineChanged.connect(lambda _: self.refresh())
        view.headChanged.connect(self._on_head)

    @property
    def busy(self) -> bool:
        return self._busy

    @property
    def scenario(self) -> Scenario:
        """The scenario of the newest version (what the document holds)."""
        return self._request.scenario

    # Requests ---------------------------------------------------------------------------

    def _on_change(self, change: Change) -> None:
        if change.kind != "path":
            self.refresh()

    def refresh(self) -> None:
        """Compute the document as it is now (a new version)."""
        self.version += 1
        self.shown = None
        self._request = Request(self.version, self.doc.scenario, self.view.head, self.view.engine)
        self._set_busy(True)
        self._traffic += 1
        self.scheduler.submit(self._request)

    def _on_head(self, head: int) -> None:
        if self._busy:  # the newly shown head first, of what is being computed
            self._request = Request(self.version, self._request.scenario, head, self.view.engine)
            self.scheduler.submit(self._request)

    def ask(self, name: str, run: Callable[[Results], Any], needs_layer: bool = False) -> None:
        """Have the scheduler run run(results) for the newest version; ``answered`` (or
        ``queryFailed``) follows, with this name. A newer question of this name replaces
        one not yet answered."""
        self._traffic += 1
        self.scheduler.ask(Query(name, self.version, run, needs_layer))

    def complete_result(self) -> Result:
        """The whole layer of the newest version: made now if not yet (exports)."""
        if not self._busy:
            return self.result
        return self.scheduler.complete(self._request)

    def complete_getter(self) -> Callable[[], Result]:
        """A function giving the whole layer of the version current now, on any thread
        (an export made on a worker while the user edits on)."""
        request, scheduler = self._request, self.scheduler
        return lambda: scheduler.complete(request)

    # Events ----------------------------------------------------------------------------

    def _on_event(self, event: Event) -> None:
        self._traffic += 1
        if self._closed or event.version != self.version:
            return  # (an older version's: superseded)
        if isinstance(event, HeadReady):
            self.shown = event.result
            self.headReady.emit(event.result)
        elif isinstance(event, LayerReady):
            self.result, self.result_scenario = event.result, self._request.scenario
            self._set_busy(False)
            self.resultChanged.emit(event.result)
        elif isinstance(event, Answered):
            self.answered.emit(event.name, event.value)
        elif isinstance(event, Failed):
            self._failed(event)

    def _failed(self, event: Failed) -> None:
        if event.name:
            self.queryFailed.emit(event.name, event.message)
            return
        self._set_busy(False)
        if self.view.engine != "numpy":
            self.view.set_engine("numpy")  # computes again, through engineChanged
            self.computeFailed.emit(event.message + "; showing the NumPy engine instead")
            return
        self.computeFailed.emit(event.message)

    def _set_busy(self, busy: bool) -> None:
        if busy != self._busy:
            self._busy = busy
            self.busyChanged.emit(busy)

    def wait(self) -> None:
        """Block until every request and question so far is answered and its signal
        emitted (tests and scripts)."""
        while True:
            self.scheduler.wait()
            traffic = self._traffic
            idle = self.scheduler.idle()  # (then all it sent is posted to this thread)
            QCoreApplication.processEvents()  # (a view may ask something more)
            if idle and traffic == self._traffic:
                return

    def close(self) -> None:
        self._closed = True
        self.scheduler.close()
