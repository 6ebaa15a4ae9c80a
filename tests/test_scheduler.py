"""The scheduler (attnviz.core.scheduler), without Qt: versions, the shown head first,
superseded work dropped, queries, and every number equal to compute() of its version."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from attnviz.core.maths.forward import compute
from attnviz.core.maths.results import HeadResult, Result
from attnviz.core.maths.scenario import with_kv_heads
from attnviz.core.presets import random_scenario, worked_example
from attnviz.core.scheduler import (
    Answered,
    Failed,
    HeadReady,
    LayerReady,
    Query,
    Request,
    Scheduler,
)


class Events(list):
    """Every event delivered, with the thread it came on."""

    def __init__(self) -> None:
        super().__init__()
        self.threads: list[str] = []

    def __call__(self, event: object) -> None:
        self.append(event)
        self.threads.append(threading.current_thread().name)

    def of(self, kind: type) -> list:
        return [e for e in self if isinstance(e, kind)]


@pytest.fixture
def events():
    return Events()


@pytest.fixture
def scheduler(events):
    made = Scheduler(events)
    yield made
    made.close()


@pytest.fixture
def on_the_worker(events):
    """A scheduler that makes even the shown head on its worker."""
    made = Scheduler(events, head_inline=lambda s: False)
    yield made
    made.close()


def large(n: int = 96, seed: int = 0):
    """Big enough for the worker (not computed inline)."""
    return random_scenario(n=n, seed=seed)


def close(a: np.ndarray, b: np.ndarray) -> None:
    np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("where", ["here", "worker"])
def test_the_shown_head_comes_first_then_the_whole_layer(scheduler, on_the_worker, events, where):
    s = large()
    scheduler = on_the_worker if where == "worker" else scheduler
    scheduler.submit(Request(1, s, shown=5))
    if where == "here":  # (a head a fraction of a frame's work: made before submit returns)
        assert [type(e) for e in events] == [HeadReady]
        assert events.threads == [threading.current_thread().name]
    scheduler.wait()
    assert [type(e) for e in events] == [HeadReady, LayerReady]
    first, whole = events[0].result, events[1].result
    assert isinstance(first, HeadResult) and first.index == 5
    want = compute(s)
    close(first.one.weights, want.heads[5].weights)
    close(first.one.scores, want.heads[5].scores)  # (the stages of the head drawn first)
    close(whole.final, want.final)
    assert events.threads[-1] == "attnviz-scheduler"


def test_a_head_result_cannot_pass_for_the_layer(scheduler, events):
    scheduler.submit(Request(1, large(), shown=2))
    scheduler.wait()
    first = events.of(HeadReady)[0].result
    with pytest.raises(KeyError):
        first.matrix("final")
    with pytest.raises(KeyError):
        first.head(3)
    assert not isinstance(first, Result)


def test_a_small_scenario_is_computed_at_once_on_the_callers_thread(scheduler, events):
    s = worked_example()
    scheduler.submit(Request(1, s))
    assert [type(e) for e in events] == [LayerReady]  # before submit returned
    assert events.threads == [threading.current_thread().name]
    np.testing.assert_array_equal(events[0].result.final, compute(s).final)


def test_every_edit_ends_on_the_newest_version_and_its_numbers(scheduler, events):
    """Edits faster than the worker: every version gets at most its shown head and
    layer, versions arrive in order, and the last layer is that of the last edit."""
    s = large(seed=1)
    versions = [s]
    rng = np.random.default_rng(0)
    for v in range(1, 30):
        s = s.with_cells("X", None, int(rng.integers(s.n)), 0, rng.normal(size=(1, 3)))
        versions.append(s)
        scheduler.submit(Request(v, s, shown=v % s.n_heads))
    scheduler.wait()
    seen = [e.version for e in events]
    assert seen == sorted(seen)
    last = events.of(LayerReady)[-1]
    assert last.version == 29
    close(last.result.final, compute(versions[29]).final)
    for e in events.of(HeadReady):  # a head shown first is the head of its own version
        close(e.result.one.weights, compute(versions[e.version]).heads[e.result.index].weights)
    assert len(events.of(LayerReady)) < 29  # superseded versions were dropped


def test_a_superseded_request_stops_between_heads(events):
    """The worker runs the older request until its first head is done, then takes the
    newer one: no layer of the older version comes."""
    started = threading.Event()
    release = threading.Event()
    s1, s2 = large(seed=2), large(seed=3)

    def deliver(event: object) -> None:
        events(event)
        if isinstance(event, HeadReady) and event.version == 1:
            started.set()
            release.wait(5)

    scheduler = Scheduler(deliver, head_inline=lambda s: False)
    try:
        scheduler.submit(Request(1, s1))
        assert started.wait(5)
        scheduler.submit(Request(2, s2))
        release.set()
        scheduler.wait()
    finally:
        scheduler.close()
    assert [e.version for e in events.of(LayerReady)] == [2]
    close(events.of(LayerReady)[0].result.final, compute(s2).final)


def test_an_edit_reuses_the_last_layer_and_equals_compute(scheduler, events):
    s = with_kv_heads(large(seed=4), 4).with_settings(positional="rope")
    scheduler.submit(Request(1, s))
    scheduler.wait()
    for v, edited in enumerate(
        [
            s.with_cells("W_K", 1, 3, 2, np.array([[0.7]])),
            s.with_cells("W_V", 2, 0, 0, np.array([[1.5]])),
            s.with_cells("W_O", None, 5, 5, np.array([[-2.0]])),
            s.with_cells("X", None, 40, 0, np.ones((2, 8))),
            s.with_settings(mask="causal-zero"),
        ],
        start=2,
    ):
        scheduler.submit(Request(v, edited, shown=3))
        scheduler.wait()
        got = events.of(LayerReady)[-1]
        assert got.version == v
        want = compute(edited)
        for h in range(want.n_heads):
            close(got.result.heads[h].weights, want.heads[h].weights)
            close(got.result.heads[h].output, want.heads[h].output)
        close(got.result.final, want.final)


def test_a_query_gets_its_versions_results_under_other_settings(scheduler, events):
    s = large(seed=5)
    scheduler.submit(Request(1, s, shown=1))
    scheduler.ask(Query("other", 1, lambda r: r.head(1, mask="causal-zero").one.weights))
    scheduler.ask(Query("layer", 1, lambda r: r.layer(mask="none").final, needs_layer=True))
    scheduler.wait()
    answers = {e.name: e.value for e in events.of(Answered)}
    close(answers["other"], compute(s.with_settings(mask="causal-zero")).heads[1].weights)
    close(answers["layer"], compute(s.with_settings(mask="none")).final)
    kinds = [type(e) for e in events]
    assert kinds.index(HeadReady) < kinds.index(Answered)  # asked for the shown head first


def test_a_newer_query_of_a_name_replaces_the_pending_one_and_old_versions_are_dropped(
    scheduler, events
):
    s = large(seed=6)
    scheduler.submit(Request(1, s))
    scheduler.ask(Query("q", 1, lambda r: "first", needs_layer=True))
    scheduler.ask(Query("q", 1, lambda r: "second", needs_layer=True))
    scheduler.submit(Request(2, s.with_cells("X", None, 0, 0, np.array([[3.0]]))))
    scheduler.ask(Query("old", 1, lambda r: "stale", needs_layer=True))
    scheduler.wait()
    answers = [(e.version, e.value) for e in events.of(Answered)]
    assert (1, "first") not in answers and (1, "stale") not in answers
    assert all(version == 1 for version, _ in answers)  # only answered if 1 was current


def test_a_failing_query_says_why_and_the_scheduler_goes_on(scheduler, events):
    s = worked_example()
    scheduler.submit(Request(1, s))
    scheduler.ask(Query("bad", 1, lambda r: r.head(7)))
    failed = events.of(Failed)
    assert failed and failed[0].name == "bad" and "head" in failed[0].message
    scheduler.submit(Request(2, s.with_settings(mask="none")))
    assert events.of(LayerReady)[-1].version == 2


def test_complete_gives_the_layer_of_a_version_made_or_not(scheduler, events):
    s = large(seed=7)
    edited = s.with_cells("W_Q", 0, 1, 1, np.array([[4.0]]))
    scheduler.submit(Request(1, s))
    scheduler.wait()
    request = Request(2, edited)
    close(scheduler.complete(request).final, compute(edited).final)  # not submitted: made
    scheduler.submit(request)
    scheduler.wait()
    close(scheduler.complete(request).final, compute(edited).final)


def test_a_computation_that_fails_is_reported_and_the_next_one_runs(events):
    scheduler = Scheduler(events, inline=lambda s: False)  # (every scenario on the worker)
    try:
        scheduler.submit(Request(1, worked_example(), engine="torch-float17"))  # no such
        scheduler.wait()
        assert [type(e) for e in events] == [Failed]
        assert "torch-float17" in events[0].message
        scheduler.submit(Request(2, worked_example()))
        scheduler.wait()
        assert events.of(LayerReady)[-1].version == 2
    finally:
        scheduler.close()


def test_the_rest_waits_until_the_caller_hands_it_over(events):
    """With ``later``, the worker takes the other heads up only when the caller runs the
    work it was given (the window: once its event loop turns, after drawing the head)."""
    given: list = []
    scheduler = Scheduler(events, later=given.append)
    try:
        s = large(seed=9)
        scheduler.submit(Request(1, s, shown=2))
        scheduler.wait()
        assert [type(e) for e in events] == [HeadReady] and not scheduler.idle()
        given.pop()()
        scheduler.wait()
        assert [type(e) for e in events] == [HeadReady, LayerReady] and scheduler.idle()
        close(events[-1].result.final, compute(s).final)
    finally:
        scheduler.close()
