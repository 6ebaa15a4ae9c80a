"""The compute service: preview first, the preview handshake, stale results dropped, the
cache of variant results; and the serial queues on the shared pool."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from PySide6.QtCore import QCoreApplication

import attnviz.ui.compute as compute_module
from attnviz.core.maths.forward import compute
from attnviz.core.presets import make_preset
from attnviz.core.session import SetCells
from attnviz.ui.compute import computes_at_once
from attnviz.ui.workers import SerialQueue
from attnviz.ui.workspace import Workspace


def pump(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        QCoreApplication.processEvents()
        time.sleep(0.005)


def large_workspace(qtbot) -> Workspace:
    s = make_preset("gpt2-small", n=128)  # 12 × 128² scores: computed on the worker
    assert not computes_at_once(s)
    ws = Workspace.create(s)
    ws.view_state.set_head(3)
    return ws


@pytest.mark.parametrize("at_once", [True, False])
def test_the_shown_head_comes_first_and_the_rest_waits_until_it_is_drawn(
    qtbot, monkeypatch, at_once
):
    """Up to 512 tokens the preview is made on the UI thread, published before the edit
    returns; beyond, on the worker. Either way the rest waits until it is drawn: every
    head, published before the mix, then the mix."""
    if not at_once:
        monkeypatch.setattr(compute_module, "SYNC_PREVIEW_CELLS", 0)
    ws = large_workspace(qtbot)
    assert compute_module.previews_at_once(ws.doc.scenario) == at_once
    published = []

    def on_result(result):
        published.append(result)
        if not result.complete:
            ws.compute.hold_partial()  # a view will draw it: the rest waits for that

    ws.compute.resultChanged.connect(on_result)
    submitted = []  # jobs handed to the worker
    queue_submit = ws.compute._queue.submit
    monkeypatch.setattr(
        ws.compute._queue, "submit", lambda job: (submitted.append(job), queue_submit(job))[1]
    )
    ws.doc.push(SetCells(ws.doc.session, "X", None, 5, 7, np.array([[0.75]])))
    assert bool(published) == at_once  # no event processed yet
    qtbot.waitUntil(lambda: bool(published), timeout=10_000)
    preview = published[0]
    assert not preview.complete
    full = compute(ws.doc.scenario)
    np.testing.assert_allclose(preview.heads[3].weights, full.heads[3].weights, atol=1e-12)
    pump(0.3)  # the worker waits (up to a second) while the preview is being drawn
    assert len(published) == 1 and ws.compute.busy
    # A preview made on the UI thread does not even wake the worker before it is drawn.
    assert len(submitted) == (0 if at_once else 1)
    ws.compute.partial_drawn()
    # Then every head, before the mix (for the views of heads alone); the mix waits in
    # turn until they are drawn.
    qtbot.waitUntil(lambda: len(published) == 2, timeout=10_000)
    pump(0.3)
    assert len(published) == 2 and ws.compute.busy
    ws.compute.partial_drawn()
    qtbot.waitUntil(lambda: not ws.compute.busy, timeout=10_000)
    heads, final = published[1:]
    assert heads.heads_current and not heads.complete and heads.final is preview.final
    assert final.complete and final.heads == heads.heads
    for h in range(12):
        np.testing.assert_allclose(final.heads[h].weights, full.heads[h].weights, atol=1e-12)
    np.testing.assert_allclose(final.final, full.final, atol=1e-12)
    ws.close()


def test_a_preview_never_reported_drawn_holds_the_rest_back_a_moment_only(qtbot, monkeypatch):
    """A view that promised to draw the preview and never says so (a hidden window) keeps
    the other heads waiting PARTIAL_WAIT_S at most; closing while they wait runs nothing
    more."""
    monkeypatch.setattr(compute_module, "PARTIAL_WAIT_S", 0.2)
    ws = large_workspace(qtbot)
    published = []

    def on_result(result):
        published.append(result)
        if not result.complete:
            ws.compute.hold_partial()

    ws.compute.resultChanged.connect(on_result)
    submitted = []
    queue_submit = ws.compute._queue.submit
    monkeypatch.setattr(
        ws.compute._queue, "submit", lambda job: (submitted.append(job), queue_submit(job))[1]
    )
    start = time.monotonic()
    ws.doc.push(SetCells(ws.doc.session, "X", None, 5, 7, np.array([[0.75]])))
    qtbot.waitUntil(lambda: not ws.compute.busy, timeout=10_000)
    # The other heads waited for the preview, the mix for them: 0.2 s each. (Qt's coarse
    # timers may fire up to 5 % early; 1 s is what each waited before.)
    assert 0.38 <= time.monotonic() - start < 1.0
    # (the preview, every head before the mix, the whole)
    assert [r.complete for r in published] == [False, False, True] and len(submitted) == 1
    np.testing.assert_allclose(published[-1].final, compute(ws.doc.scenario).final, atol=1e-12)
    ws.doc.push(SetCells(ws.doc.session, "X", None, 6, 7, np.array([[0.5]])))
    assert [r.complete for r in published] == [False, False, True, False]
    ws.close()
    pump(0.4)
    assert len(submitted) == 1 and len(published) == 4


def test_a_result_older_than_the_latest_edit_is_never_published_last(qtbot):
    ws = large_workspace(qtbot)
    for value in (0.1, 0.2, 0.3, 0.4):
        ws.doc.push(SetCells(ws.doc.session, "W_K", 3, 0, 0, np.array([[value]])))
    ws.compute.wait()
    pump(0.2)  # nothing stale arrives later
    assert ws.compute.result_scenario is ws.doc.scenario
    want = compute(ws.doc.scenario)
    np.testing.assert_allclose(ws.compute.result.final, want.final, atol=1e-12)
    ws.close()


def test_variant_results_are_computed_once_and_shared(qtbot, monkeypatch):
    ws = Workspace.create()
    calls = []

    def counting(s):
        calls.append(s.settings.mask)
        return compute(s)

    monkeypatch.setattr(compute_module, "compute", counting)
    s = ws.doc.scenario
    assert ws.compute.result_for(s) is ws.compute.result  # the document's own: no compute
    first = ws.compute.result_for(s.with_settings(mask="causal-zero"))
    again = ws.compute.result_for(s.with_settings(mask="causal-zero"))  # another object
    assert first is again and calls == ["causal-zero"]
    assert ws.compute.result_for(s.with_settings(mask="none")) is not first
    assert calls == ["causal-zero", "none"]
    assert ws.compute.result_for(ws.doc.scenario) is ws.compute.result
    ws.close()


def record_updates(monkeypatch) -> list[tuple[object, dict]]:
    """Each update_with the compute service makes from now: (its changes, its keywords)."""
    calls = []
    real = compute_module.update_with

    def spy(base, s, changes, **more):
        calls.append((changes, more))
        return real(base, s, changes, **more)

    monkeypatch.setattr(compute_module, "update_with", spy)
    return calls


def causal_zero_heads(s) -> list[tuple[np.ndarray, np.ndarray]]:
    """By hand, with NumPy: each head's weights under causal-zero (the future scored 0),
    and its V."""
    heads = []
    for h in range(s.n_heads):
        Q, K, V = s.X @ s.matrix("W_Q", h), s.X @ s.matrix("W_K", h), s.X @ s.matrix("W_V", h)
        scores = Q @ K.T / np.sqrt(s.d_k)
        scores[np.triu_indices(s.n, 1)] = 0.0
        w = np.exp(scores - scores.max(axis=1, keepdims=True))
        heads.append((w / w.sum(axis=1, keepdims=True), V))
    return heads


@pytest.mark.parametrize(
    "edit",
    [("X", None, 2, 1), ("W_K", 1, 0, 3), ("W_V", 0, 2, 2), ("W_O", None, 5, 0)],
    ids=["X", "W_K", "W_V", "W_O"],
)
def test_after_an_edit_a_variant_is_updated_from_the_last_not_computed_again(
    qtbot, monkeypatch, edit
):
    """The Masks dock asks for the document under another mask after every edit: the
    result of the scenario before the edit is updated (as the document's own is), and
    takes its place in the cache."""
    ws = large_workspace(qtbot)
    ws.compute.wait()
    calls = []
    monkeypatch.setattr(compute_module, "compute", lambda s: calls.append(s) or compute(s))
    updates = record_updates(monkeypatch)
    zero = ws.compute.result_for(ws.doc.scenario.with_settings(mask="causal-zero"))
    assert len(calls) == 1
    name, head, row, col = edit
    ws.doc.push(SetCells(ws.doc.session, name, head, row, col, np.array([[0.75]])))
    ws.compute.wait()
    updates.clear()
    s = ws.doc.scenario.with_settings(mask="causal-zero")
    got = ws.compute.result_for(s)
    assert len(calls) == 1 and len(updates) == 1 and not updates[0][0].full
    # by hand, with NumPy: the edited scenario under causal-zero (future scores set to 0)
    outputs = [w @ V for w, V in causal_zero_heads(s)]
    np.testing.assert_allclose(got.final, np.hstack(outputs) @ s.W_O, atol=1e-12)
    assert zero is not got and ws.compute.result_for(s) is got
    assert len(ws.compute._cache) == 2  # the document's and this one: the old one went
    ws.close()


def test_a_variants_head_made_first_is_not_made_again_for_the_whole(qtbot, monkeypatch):
    """The Masks dock asks for the shown head under the other mask first (head_result):
    that head alone is updated from the last result under that mask; result_for then
    makes the other heads and the mix, keeping that very head; both against NumPy."""
    ws = large_workspace(qtbot)
    ws.compute.wait()
    zero = ws.doc.scenario.with_settings(mask="causal-zero")
    ws.compute.result_for(zero)
    ws.doc.push(SetCells(ws.doc.session, "X", None, 2, 4, np.array([[0.75]])))
    ws.compute.wait()
    s, h = ws.doc.scenario.with_settings(mask="causal-zero"), 1
    asked = record_updates(monkeypatch)
    assert ws.compute.has_near(s)  # (the result before the edit, under causal-zero)
    assert not ws.compute.has_near(s.with_settings(mask="none"))  # nothing near: whole
    first = ws.compute.head_result(s, h)
    assert not first.complete and first.fresh == (h,)
    assert [more for _, more in asked] == [{"preview_head": h}]
    assert ws.compute.head_result(s, h) is first  # asked again: the same
    whole = ws.compute.result_for(s)
    assert whole.complete and whole.heads[h] is first.heads[h]
    assert asked[-1][1] == {"current_heads": (h,)}
    by_hand = causal_zero_heads(s)
    np.testing.assert_allclose(first.heads[h].weights, by_hand[h][0], rtol=0, atol=1e-12)
    outputs = [w @ V for w, V in by_hand]
    np.testing.assert_allclose(whole.final, np.hstack(outputs) @ s.W_O, atol=1e-12)
    assert ws.compute.head_result(s, h) is whole  # cached whole now
    ws.close()


def test_a_variant_asked_for_by_two_threads_at_once_is_computed_once(qtbot, monkeypatch):
    """The Masks dock and the Inspector each ask on their own thread; the second waits for
    the first's result rather than computing it again."""
    ws = Workspace.create()
    started, release, calls = threading.Event(), threading.Event(), []

    def slow(s):
        calls.append(s.settings.mask)
        started.set()
        release.wait(5)
        return compute(s)

    monkeypatch.setattr(compute_module, "compute", slow)
    zero = ws.doc.scenario.with_settings(mask="causal-zero")
    got = []
    first = threading.Thread(target=lambda: got.append(ws.compute.result_for(zero)))
    first.start()
    assert started.wait(5)
    second = threading.Thread(target=lambda: got.append(ws.compute.result_for(zero)))
    second.start()
    second.join(0.2)
    assert second.is_alive()  # waiting for the first
    release.set()
    first.join(5)
    second.join(5)
    assert calls == ["causal-zero"] and len(got) == 2 and got[0] is got[1]
    ws.close()


def test_a_variant_updated_from_what_became_the_documents_result_leaves_that_cached(
    qtbot, monkeypatch
):
    """A worker updates from a cached result; meanwhile the document moves to that very
    scenario: the document's entry stays (it was evicted as the one updated from)."""
    ws = Workspace.create()
    s0 = ws.doc.scenario
    s1 = s0.with_cells("X", None, 0, 0, np.array([[0.5]]))  # the document's next state
    s2 = s1.with_cells("X", None, 1, 0, np.array([[0.25]]))  # asked for by a worker
    ws.compute.result_for(s1)
    entered, go = threading.Event(), threading.Event()
    real = compute_module.update_with

    def slow(*args, **kwargs):
        entered.set()
        go.wait(5)
        return real(*args, **kwargs)

    monkeypatch.setattr(compute_module, "update_with", slow)
    worker = threading.Thread(target=lambda: ws.compute.result_for(s2))
    worker.start()
    assert entered.wait(5)  # it took s1's result as its base
    ws.doc.reset(s1, None)
    ws.compute.wait()
    go.set()
    worker.join(5)
    assert ws.compute.result_for(ws.doc.scenario) is ws.compute.result  # still cached
    ws.close()


def test_serial_queues_keep_order_and_close_cleanly():
    queue = SerialQueue()
    order: list[int] = []
    gate = threading.Event()
    queue.submit(gate.wait)
    futures = [queue.submit(lambda i=i: order.append(i)) for i in range(20)]
    assert order == []  # the first job still holds the queue
    gate.set()
    queue.wait()
    assert order == list(range(20)) and all(f.done() for f in futures)

    slow = threading.Event()
    queue.submit(lambda: slow.wait(0.2))
    dropped = queue.submit(lambda: order.append(99))
    queue.close()  # waits for the running job, drops the queued one
    assert dropped.cancelled() and 99 not in order
    assert queue.submit(lambda: order.append(100)).cancelled()


def test_a_layer_with_few_tokens_but_millions_of_weights_computes_off_the_ui_thread():
    from attnviz.core.maths.scenario import Scenario

    rng = np.random.default_rng(0)
    few = make_preset("gpt2-small", n=4)  # 12 × 4² scores, 2.4 M weights: a frame's work
    assert computes_at_once(few)
    d_model, heads, kv, d_k = 2048, 16, 4, 128  # 12.6 M weights: copying them alone is slow
    large = Scenario(
        tokens=("a", "b", "c", "d"),
        X=rng.standard_normal((4, d_model)),
        W_Q=rng.standard_normal((heads, d_model, d_k)) * 0.01,
        W_K=rng.standard_normal((kv, d_model, d_k)) * 0.01,
        W_V=rng.standard_normal((kv, d_model, d_k)) * 0.01,
        W_O=rng.standard_normal((heads * d_k, d_model)) * 0.01,
    )
    assert large.n_heads * large.n**2 <= compute_module.SYNC_SCORE_CELLS
    assert not computes_at_once(large)


@pytest.mark.parametrize("name", ["W_Q", "W_K", "W_V"])
def test_weight_edits_never_copy_the_whole_stack(qtbot, name):
    """An edit of a weight cell copies its head; neither the preview nor the rest of the
    computation stacks the heads again (a Llama-3-8B layer's W_Q is 134 MB), and the
    results equal a full compute of the stacked scenario."""
    ws = large_workspace(qtbot)
    published = []
    ws.compute.resultChanged.connect(published.append)
    for k in range(3):
        published.clear()
        ws.doc.push(SetCells(ws.doc.session, name, 1, 10 + k, 5, np.array([[0.5 + k]])))
        qtbot.waitUntil(lambda: any(r.complete for r in published), timeout=10_000)
        ws.compute.partial_drawn()
        qtbot.waitUntil(lambda: not ws.compute.busy, timeout=10_000)
    s = ws.doc.scenario
    assert name not in vars(s)  # the edited stack was never stacked
    final, full = published[-1], compute(s)  # (which stacks it)
    assert s.matrix(name, 1)[12, 5] == 2.5 and getattr(s, name)[1, 12, 5] == 2.5
    for h in range(12):
        np.testing.assert_allclose(final.heads[h].output, full.heads[h].output, atol=1e-12)
    np.testing.assert_allclose(final.final, full.final, atol=1e-12)
    ws.close()
