"""The scheduler: the document's results, newest first, computed off the caller's thread.

No Qt here: events go to a callback, which the window's adapter (attnviz.ui.compute)
turns into signals. The flow:

- ``submit(Request(version, scenario, shown))`` after every change of the document. The
  newest request replaces a pending one; a running one is dropped at its next step
  (between heads). A small scenario is computed at once and whole, on the caller's
  thread: the very numbers of ``forward.compute``.
- A request is computed from the last complete result (``reuse.Plan``: exact reuse), the
  shown head first (``HeadReady``), then every other head and the mix (``LayerReady``).
  A ``HeadResult`` holds one head and no mix: it cannot pass for a complete result.
- ``ask(Query(name, version, run))``: anything a view needs beyond the document's result
  (the shown head under another mask, each head's share of the mix, an explanation):
  ``run`` is given the version's ``Results`` and its value comes back as ``Answered``.
  A query waits for its version's shown head (or its layer, ``needs_layer``); a newer
  query of the same name replaces a pending one; a query of an older version is dropped.
- ``complete(request)``: the whole layer of a version, made on the calling thread if the
  scheduler has not made it (exports).

Events of a version older than the newest submitted are still delivered; the adapter
drops them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from attnviz.core.maths.backward import Gradients
from attnviz.core.maths.forward import head_count
from attnviz.core.maths.losses import gradients
from attnviz.core.maths.results import HeadResult, Result
from attnviz.core.maths.reuse import Base, Plan, compute_from
from attnviz.core.maths.scenario import Scenario

TORCH_ENGINES = {"torch-float64": "float64", "torch-float32": "float32"}


@dataclass(frozen=True, eq=False)
class Request:
    """Compute version ``version`` of the document, ``scenario``, head ``shown`` first,
    with the NumPy reference or a torch engine."""

    version: int
    scenario: Scenario
    shown: int = 0
    engine: str = "numpy"


@dataclass(frozen=True, eq=False)
class HeadReady:
    version: int
    result: HeadResult


@dataclass(frozen=True, eq=False)
class LayerReady:
    version: int
    result: Result


@dataclass(frozen=True, eq=False)
class Answered:
    version: int
    name: str
    value: Any


@dataclass(frozen=True, eq=False)
class Failed:
    version: int
    message: str
    name: str = ""  # the query that failed ("": the document's computation)


Event = HeadReady | LayerReady | Answered | Failed


class Results:
    """What a query may ask for, of one version: the scenario, its heads and layer, and
    the same under other settings (another mask, say), each made once, from the base."""

    def __init__(self, scenario: Scenario, base: Base | None):
        self.scenario, self._base = scenario, base
        self._plans: dict[object, Plan] = {}
        self._layers: dict[object, Result] = {}
        self._gradients: Gradients | None = None

    def under(self, **settings: object) -> Scenario:
        """The scenario with some settings changed (itself when none change)."""
        current = self.scenario.settings
        if all(getattr(current, k) == v for k, v in settings.items()):
            return self.scenario
        return self.scenario.with_settings(**settings)

    def plan(self, **settings: object) -> Plan:
        s = self.under(**settings)
        plan = self._plans.get(s.settings)
        if plan is None:
            plan = self._plans[s.settings] = Plan(s, self._base)
        return plan

    def head(self, h: int, **settings: object) -> HeadResult:
        """Head h (its stages kept) of the scenario under these settings."""
        return self.plan(**settings).head_result(h)

    def layer(self, **settings: object) -> Result:
        """The whole layer of the scenario under these settings (the float64 reference,
        whatever engine the document is shown with)."""
        key = self.under(**settings).settings
        layer = self._layers.get(key)
        if layer is None:
            layer = self._layers[key] = self.plan(**settings).result()
        return layer

    def gradients(self) -> Gradients:
        """The gradients of the scenario's own loss (its settings'), from its layer: made
        once for every view that asks."""
        if self._gradients is None:
            self._gradients = gradients(self.scenario, None, self.layer())
        return self._gradients

    def keep(self, layer: Result) -> None:
        """The scenario's own layer, made by the scheduler (in float64, by NumPy)."""
        self._layers[self.scenario.settings] = layer


@dataclass(frozen=True, eq=False)
class Query:
    """Something a view needs of version ``version``: ``run(results)``, in core."""

    name: str
    version: int
    run: Callable[[Results], Any]
    needs_layer: bool = False


@dataclass(eq=False)
class _Job:
    """One request being computed: the heads made so far, then the layer."""

    request: Request
    results: Results
    heads: dict[int, Any] = field(default_factory=dict)
    layer: Result | None = None
    failed: bool = False
    shown_sent: bool = False

    @property
    def finished(self) -> bool:
        return self.layer is not None or self.failed

    @property
    def version(self) -> int:
        return self.request.version

    def next_head(self) -> int | None:
        """The shown head first, then the others in order; None when all are made."""
        count = head_count(self.request.scenario)
        shown = min(self.request.shown, count - 1)
        if shown not in self.heads:
            return shown
        return next((h for h in range(count) if h not in self.heads), None)


# Scenarios this small are computed on the caller's thread: before the next frame.
INLINE_SCORE_CELLS = 1 << 16
INLINE_WEIGHTS = 1 << 22
INLINE_PROJECTION_WORK = 1 << 26


def small(s: Scenario) -> bool:
    """Whether the whole layer is a fraction of a frame's work (a layer of a large model
    has few score cells but millions of weights to multiply)."""
    weights = s.weight_count
    return (
        s.n_heads * s.n * s.m <= INLINE_SCORE_CELLS
        and weights <= INLINE_WEIGHTS
        and weights * max(s.n, s.m) <= INLINE_PROJECTION_WORK
    )


# A scenario whose one head is this small has it made on the caller's thread first.
HEAD_INLINE_SCORE_CELLS = 1 << 18
HEAD_INLINE_WEIGHTS = 1 << 23


def one_head_small(s: Scenario) -> bool:
    """Whether one head's computation is a fraction of a frame's work (up to 512 × 512
    scores, a GPT-2-sized layer's weights)."""
    return s.n * s.m <= HEAD_INLINE_SCORE_CELLS and s.weight_count <= HEAD_INLINE_WEIGHTS


class Scheduler:
    """Computes requests and queries on one worker thread (small ones inline) and tells
    ``deliver`` of each result, on the thread that made it."""

    def __init__(
        self,
        deliver: Callable[[Event], None],
        inline: Callable[[Scenario], bool] = small,
        head_inline: Callable[[Scenario], bool] = one_head_small,
        later: Callable[[Callable[[], None]], None] = lambda work: work(),
    ):
        """``later(work)``: runs work once the caller has done with what it is doing (the
        window: when its event loop next turns, after the drawing); at once by default."""
        self._deliver, self._inline, self._head_inline = deliver, inline, head_inline
        self._later = later
        self._lock = threading.Condition()
        self._pending: Request | None = None
        self._job: _Job | None = None
        self._queries: dict[str, Query] = {}
        self._base: Base | None = None
        self._closed = False
        self._busy = False  # the worker is running a step
        self._handing = 0  # jobs whose first head is made, waiting for `later` to hand over
        self._thread: threading.Thread | None = None

    # What callers do ------------------------------------------------------------------

    def submit(self, request: Request) -> None:
        """Compute this version (replacing any older request)."""
        if request.engine == "numpy" and self._inline(request.scenario):
            job = self._new_job(request)
            with self._lock:
                self._pending, self._job = None, job
            self._finish_inline(job)
            return
        with self._lock:
            current = self._job
            if current is not None and current.version == request.version:
                current.request = request  # the same version: another head shown first
                self._lock.notify_all()
                return
            base = self._base
        if request.engine == "numpy" and self._head_inline(request.scenario):
            self._first_head_here(request, base)
            return
        with self._lock:
            self._pending = request
            self._lock.notify_all()
        self._start()

    def _first_head_here(self, request: Request, base: Base | None) -> None:
        """The shown head made on the caller's thread (a fraction of a frame: no hand-off
        to the worker and back before it can be drawn), then the rest on the worker."""
        job = _Job(request, Results(request.scenario, base))
        with self._lock:
            self._pending = None
        head = min(request.shown, head_count(request.scenario) - 1)
        try:
            first = job.results.head(head)
        except Exception:  # e.g. out of memory: the worker tries it all, and says why
            with self._lock:
                self._pending = request
            self._start()
            return
        job.heads[head], job.shown_sent = first.one, True
        self._send(HeadReady(job.version, first))
        # The worker takes the rest up once the caller has done with this edit (drawn it):
        # meanwhile its work would hold the interpreter the caller's drawing needs.
        with self._lock:
            self._handing += 1
        self._later(lambda: self._hand_over(job))

    def _hand_over(self, job: _Job) -> None:
        """The worker goes on with job (unless a newer one came meanwhile)."""
        with self._lock:
            self._handing -= 1
            newer = self._pending is not None or (
                self._job is not None and self._job.version > job.version
            )
            if not newer:
                self._job = job
                self._lock.notify_all()
        self._start()

    def ask(self, query: Query) -> None:
        """Run query for its version, when that version's shown head (or layer) is made."""
        with self._lock:
            job = self._job
            inline = (
                job is not None
                and job.version == query.version
                and job.layer is not None
                and self._pending is None
                and self._inline(job.request.scenario)
            )
            if not inline:
                self._queries[query.name] = query
                newest = self._pending.version if self._pending else job.version if job else 0
                self._queries = {k: q for k, q in self._queries.items() if q.version >= newest}
                self._lock.notify_all()
        if inline:
            assert job is not None
            self._answer(job, query)
        else:
            self._start()

    def complete(self, request: Request) -> Result:
        """The whole layer of request's version: the scheduler's, or made here now."""
        with self._lock:
            job, base = self._job, self._base
        if job is not None and job.version == request.version and job.layer is not None:
            return job.layer
        return compute_from(request.scenario, base)

    def adopt(self, request: Request, layer: Result) -> None:
        """Take layer as request's complete result, made elsewhere (the first, at start)."""
        job = self._new_job(request)
        job.results.keep(layer)
        job.layer, job.shown_sent = layer, True
        with self._lock:
            self._pending, self._job = None, job
            if request.engine == "numpy":
                self._base = Base(request.scenario, layer)

    def idle(self) -> bool:
        """Whether nothing submitted is left to do (nor to hand over to the worker)."""
        with self._lock:
            return not self._busy and not self._has_work() and not self._handing

    def wait(self) -> None:
        """Block until the worker has done every request and query it has (tests,
        scripts; a job still to be handed over waits for the caller's ``later``)."""
        with self._lock:
            while self._busy or self._has_work():
                self._lock.wait()

    def close(self) -> None:
        """Stop; the running step finishes, nothing after it is delivered."""
        with self._lock:
            self._closed = True
            self._lock.notify_all()
        if self._thread is not None:
            self._thread.join()

    # The worker -------------------------------------------------------------------------

    def _start(self) -> None:
        with self._lock:
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(
                    target=self._work, name="attnviz-scheduler", daemon=True
                )
                self._thread.start()

    def _work(self) -> None:
        while True:
            with self._lock:
                while not self._closed and not self._has_work():
                    self._busy = False
                    self._lock.notify_all()
                    self._lock.wait()
                if self._closed:
                    self._busy = False
                    self._lock.notify_all()
                    return
                self._busy = True
                step = self._next_step()
            step()

    def _has_work(self) -> bool:
        """Under the lock: a newer request, a head or layer to make, or a query to run."""
        if self._pending is not None:
            return True
        job = self._job
        if job is None:
            return False
        return not job.finished or self._runnable_query(job) is not None

    def _next_step(self) -> Callable[[], None]:
        """Under the lock: what the worker does next (outside the lock)."""
        if self._pending is not None:
            request, self._pending = self._pending, None
            self._queries = {k: q for k, q in self._queries.items() if q.version >= request.version}
            return partial(self._begin, request, self._base)
        job = self._job
        assert job is not None
        query = self._runnable_query(job)
        if query is not None:
            del self._queries[query.name]
            return partial(self._answer, job, query)
        if job.request.engine != "numpy":
            return partial(self._torch, job)
        head = job.next_head()
        if head is not None:
            return partial(self._head, job, head)
        return partial(self._mix, job)

    def _runnable_query(self, job: _Job) -> Query | None:
        if job.failed:
            return None
        for query in self._queries.values():
            ready = job.layer is not None or (not query.needs_layer and job.shown_sent)
            if query.version == job.version and ready:
                return query
        return None

    @staticmethod
    def _new_job(request: Request) -> _Job:
        """A job made whole at once: small, so nothing is reused (compute()'s numbers)."""
        return _Job(request, Results(request.scenario, None))

    def _begin(self, request: Request, base: Base | None) -> None:
        job = _Job(request, Results(request.scenario, base))
        with self._lock:
            newer = self._pending is not None or (
                self._job is not None and self._job.version > request.version
            )
            if not newer:  # (else a newer one came meanwhile: it goes next, or is here)
                self._job = job

    def _current(self, job: _Job) -> bool:
        with self._lock:
            return self._job is job and self._pending is None and not self._closed

    def _head(self, job: _Job, h: int) -> None:
        try:
            shown = h == min(job.request.shown, head_count(job.request.scenario) - 1)
            if shown:
                first = job.results.head(h)
                job.heads[h] = first.one
            else:
                job.heads[h] = job.results.plan().head(h)
        except Exception as e:  # e.g. out of memory: said, and the job given up
            self._fail(job, e)
            return
        if shown and self._current(job):
            job.shown_sent = True
            self._send(HeadReady(job.version, first))

    def _mix(self, job: _Job) -> None:
        try:
            count = head_count(job.request.scenario)
            layer = job.results.plan().result([job.heads[h] for h in range(count)])
        except Exception as e:
            self._fail(job, e)
            return
        self._layer_done(job, layer)

    def _torch(self, job: _Job) -> None:
        from attnviz.core.maths.torch_engine import compute_torch

        try:
            layer = compute_torch(job.request.scenario, "auto", TORCH_ENGINES[job.request.engine])
        except Exception as e:  # e.g. torch missing
            self._fail(job, e)
            return
        self._layer_done(job, layer, reference=False)

    def _finish_inline(self, job: _Job) -> None:
        try:
            layer = job.results.layer()
        except Exception as e:
            self._fail(job, e)
            return
        self._layer_done(job, layer)

    def _layer_done(self, job: _Job, layer: Result, reference: bool = True) -> None:
        if reference:
            job.results.keep(layer)
        with self._lock:
            job.layer = layer
            job.shown_sent = True
            current = self._job is job and not self._closed
            if reference and current:
                self._base = Base(job.request.scenario, layer)
            self._lock.notify_all()
        if current:
            self._send(LayerReady(job.version, layer))

    def _answer(self, job: _Job, query: Query) -> None:
        try:
            value = query.run(job.results)
        except Exception as e:  # a view's question the scenario cannot answer: said
            self._send(Failed(query.version, f"{type(e).__name__}: {e}", query.name))
            return
        self._send(Answered(query.version, query.name, value))

    def _fail(self, job: _Job, e: Exception) -> None:
        with self._lock:
            job.failed = True
            self._lock.notify_all()
        self._send(Failed(job.version, f"{type(e).__name__}: {e}"))

    def _send(self, event: Event) -> None:
        with self._lock:
            if self._closed:
                return
        self._deliver(event)
