"""Panels off screen (a dock tabbed behind another) neither draw nor hold up an edit: Qt
keeps such a dock visible, moved outside the window, where it is never painted."""

from __future__ import annotations

import numpy as np
from PySide6.QtWidgets import QApplication, QTabBar
from waiting import settle

import attnviz.ui.compute as compute_module
from attnviz.core.maths.scenario import Scenario
from attnviz.core.presets import make_preset


def on_screen(widget) -> bool:
    return widget.isVisible() and not widget.visibleRegion().isEmpty()


def small_gpt2() -> Scenario:
    """GPT-2-small's widths at 48 tokens: a preview of the shown head comes first."""
    return make_preset("gpt2-small", n=48)


def edit(window, name: str, head: int | None, row: int, col: int, value: float) -> None:
    model = window.weights.grids[(name, head)].matrix_model()
    model.setData(model.index(row, col), str(value))


def test_with_the_pipeline_behind_a_tab_an_edit_is_neither_previewed_nor_held(shown_window, qtbot):
    window = shown_window(scenario=small_gpt2())
    settle(qtbot, window)
    window.bring_forward(("Mix",))
    settle(qtbot, window)
    assert window.pipeline.isVisible() and not on_screen(window.pipeline)
    published = []
    window.compute.resultChanged.connect(published.append)
    edit(window, "W_V", 0, 3, 5, 0.75)
    settle(qtbot, window)
    # No preview (nobody would draw it), so nothing waited for one to be painted: every
    # head (published before the mix), then the whole
    assert [r.heads_current for r in published] == [True, True] and published[-1].complete
    assert window.compute._held is None
    output = window.compute.result.heads[0].output
    assert window.pipeline.views["output"].spec.values is not output  # not drawn off screen
    window.bring_forward(("Pipeline",))
    qtbot.waitUntil(lambda: window.pipeline.views["output"].spec.values is output, timeout=5000)


def test_a_panel_behind_a_tab_draws_the_latest_result_when_its_tab_is_raised(shown_window, qtbot):
    window = shown_window(scenario=small_gpt2())
    window.bring_forward(("Mix",))
    settle(qtbot, window)
    mix = window.mix
    qtbot.waitUntil(lambda: mix.final.spec is not None, timeout=5000)
    window.bring_forward(("Pipeline",))
    settle(qtbot, window)
    assert not on_screen(mix)
    drawn = mix.final.spec.values
    edit(window, "W_O", None, 7, 2, -1.5)
    settle(qtbot, window)
    final = window.compute.result.final
    assert not np.array_equal(final, drawn)
    assert mix.final.spec.values is drawn  # nothing drawn while behind the pipeline
    window.bring_forward(("Mix",))
    qtbot.waitUntil(lambda: mix.final.spec.values is final, timeout=5000)
    s = window.doc.scenario
    concat = np.concatenate([h.output for h in window.compute.result.heads], axis=1)
    np.testing.assert_allclose(mix.final.spec.values, concat @ s.W_O + s.b_O, atol=1e-12)


def mix_raised(shown_window, qtbot):
    """A window at GPT-2's widths with the Mix dock raised and its 12 contributions drawn."""
    window = shown_window(scenario=small_gpt2())
    window.bring_forward(("Mix",))
    settle(qtbot, window)
    mix = window.mix
    qtbot.waitUntil(lambda: len(mix.parts) == 12 and mix.parts[11].spec is not None, timeout=5000)
    return window


def test_the_mix_draws_only_the_contribution_of_the_edited_head(shown_window, qtbot):
    window = mix_raised(shown_window, qtbot)
    mix = window.mix
    before = [view.spec.values for view in mix.parts]
    edit(window, "W_V", 4, 10, 1, 2.0)
    settle(qtbot, window)
    qtbot.waitUntil(lambda: mix.parts[4].spec.values is not before[4], timeout=5000)
    r, s = window.compute.result, window.doc.scenario
    expected = [h.output @ s.W_O[64 * k : 64 * (k + 1)] for k, h in enumerate(r.heads)]
    for k, view in enumerate(mix.parts):
        np.testing.assert_allclose(view.spec.values, expected[k], atol=1e-12)
        assert (view.spec.values is before[k]) == (k != 4)  # the others are not made again
    top = max(np.abs(part).max() for part in expected)
    low, high = mix.parts[0].spec.levels
    assert low == -high and top <= high < 2.5 * top  # one scale for all, a nice number above
    assert {view.spec.levels for view in mix.parts} == {(low, high)}
    # W_O edited in head 7's rows: only its contribution changes
    before = [view.spec.values for view in mix.parts]
    model = window.weights.grids[("W_O", None)].matrix_model()
    model.setData(model.index(7 * 64 + 3, 9), "0.125")
    settle(qtbot, window)
    qtbot.waitUntil(lambda: mix.parts[7].spec.values is not before[7], timeout=5000)
    s = window.doc.scenario
    np.testing.assert_allclose(
        mix.parts[7].spec.values, r.heads[7].output @ s.W_O[7 * 64 : 8 * 64], atol=1e-12
    )
    assert all(view.spec.values is before[k] for k, view in enumerate(mix.parts) if k != 7)


def test_after_an_edit_of_a_late_row_of_x_the_mix_multiplies_only_the_rows_that_changed(
    shown_window, qtbot, monkeypatch
):
    import attnviz.ui.panels.mix as mix_module

    window = mix_raised(shown_window, qtbot)
    mix = window.mix
    whole = []
    real = mix_module.head_contribution
    monkeypatch.setattr(
        mix_module, "head_contribution", lambda r, W_O, h: whole.append(h) or real(r, W_O, h)
    )
    model = window.inputs.model
    for row, wholes in ((40, []), (3, list(range(12)))):  # (causal: that row and those after)
        before = [view.spec.values for view in mix.parts]
        whole.clear()
        model.setData(model.index(row, 5), "2.25")
        settle(qtbot, window)
        qtbot.waitUntil(lambda old=before[11]: mix.parts[11].spec.values is not old, timeout=5000)
        r, s = window.compute.result, window.doc.scenario
        for k, view in enumerate(mix.parts):
            expected = r.heads[k].output @ s.W_O[64 * k : 64 * (k + 1)]
            np.testing.assert_allclose(view.spec.values, expected, atol=1e-12)
            np.testing.assert_array_equal(view.spec.values[:row], before[k][:row])
            assert not np.array_equal(view.spec.values[row:], before[k][row:])
        assert whole == wholes
        top = max(np.abs(view.spec.values).max() for view in mix.parts)
        assert top <= mix.parts[0].spec.levels[1] < 2.5 * top


def test_contributions_scrolled_out_of_sight_are_coloured_when_scrolled_to(shown_window, qtbot):
    from test_partial_redraw import assert_drawn_as_a_whole

    window = mix_raised(shown_window, qtbot)
    mix = window.mix
    scroll = window.docks["Mix"].widget()
    scroll.verticalScrollBar().setValue(0)
    settle(qtbot, window)
    last = mix.parts[11]
    assert not on_screen(last)
    before = last.spec.values
    model = window.inputs.model
    model.setData(model.index(0, 3), "1.5")  # every head's output changes
    settle(qtbot, window)
    qtbot.waitUntil(lambda: last.spec.values is not before, timeout=5000)
    r, s = window.compute.result, window.doc.scenario
    np.testing.assert_allclose(last.spec.values, r.heads[11].output @ s.W_O[11 * 64 :], atol=1e-12)
    assert last.image.key == ()  # not coloured off screen
    painted = []
    last.painted.connect(painted.append)
    scroll.ensureWidgetVisible(last)
    qtbot.waitUntil(lambda: bool(painted), timeout=5000)
    assert_drawn_as_a_whole(last, "head 12's contribution")


def click_tab(window, title: str) -> None:
    """Click the tab of a dock, as a user does (not through the window's own code)."""
    for bar in window.findChildren(QTabBar):
        titles = [bar.tabText(i) for i in range(bar.count())]
        if bar.isVisible() and title in titles:
            bar.setCurrentIndex(titles.index(title))
            for _ in range(5):
                QApplication.processEvents()
            return
    raise AssertionError(f"no tab {title}")


def test_a_dock_closed_and_reopened_behind_a_tab_draws_when_its_tab_is_clicked(shown_window, qtbot):
    window = shown_window(scenario=small_gpt2())
    click_tab(window, "Mix")
    settle(qtbot, window)
    mix = window.mix
    qtbot.waitUntil(lambda: mix.final.spec is not None, timeout=5000)
    window.docks["Mix"].toggleViewAction().trigger()  # View → Mix: closed
    edit(window, "W_O", None, 7, 2, -1.5)
    settle(qtbot, window)
    final = window.compute.result.final
    window.docks["Mix"].toggleViewAction().trigger()  # reopened, behind another tab
    settle(qtbot, window)
    assert mix.final.spec.values is not final
    click_tab(window, "Mix")
    qtbot.waitUntil(lambda: mix.final.spec.values is final, timeout=5000)
    # The Pipeline closed, another head chosen, reopened and clicked: it shows that head
    window.docks["Pipeline"].toggleViewAction().trigger()
    window.view_state.set_head(5)
    window.docks["Pipeline"].toggleViewAction().trigger()
    settle(qtbot, window)
    click_tab(window, "Pipeline")
    output = window.compute.result.heads[5].output
    qtbot.waitUntil(lambda: window.pipeline.views["output"].spec.values is output, timeout=5000)


def when_the_mix_begins(monkeypatch, record) -> None:
    """Call record as the compute service begins the mix of a result whose heads are
    current (its update of a result that is not complete, with the mix)."""
    update_with = compute_module.update_with

    def spy(prev, s, changes, **more):
        if more.get("mix", True) and not prev.complete:
            record()
        return update_with(prev, s, changes, **more)

    monkeypatch.setattr(compute_module, "update_with", spy)


def test_the_heads_dock_draws_every_head_before_the_mix(shown_window, qtbot, monkeypatch):
    """An X edit with the Heads dock raised: the worker publishes every head before the
    mix; the Heads dock draws that (each view the new head's weights, checked against an
    independent softmax), and the mix waits until they are on screen (else it takes the
    cores while they are drawn); the dock does not draw again when the mix follows."""
    window = shown_window(scenario=small_gpt2())
    window.bring_forward(("Heads",))
    settle(qtbot, window)
    heads = window.panel("Heads")
    seen = []  # (complete, what each Heads view showed then)

    def on_result(result):
        QApplication.processEvents()  # (the panels got it first: they are connected first)
        seen.append((result.complete, [view.spec.values for view in heads.views]))

    window.compute.resultChanged.connect(on_result)
    painted = []
    for view in heads.views:
        view.painted.connect(lambda _, v=view: painted.append(v))
    mixed_after = []  # how many Heads views had painted when the mix began
    when_the_mix_begins(monkeypatch, lambda: mixed_after.append(len(painted)))
    model = window.inputs.model
    model.setData(model.index(3, 5), "2.5")
    qtbot.waitUntil(lambda: bool(seen) and seen[-1][0], timeout=10_000)
    assert [complete for complete, _ in seen] == [False, True]
    assert len(mixed_after) == 1 and mixed_after[0] >= 12  # every head on screen first
    s = window.doc.scenario
    for h, drawn in enumerate(seen[0][1]):  # drawn from the heads, before the mix
        q, k = s.X @ s.W_Q[h] + s.b_Q[h], s.X @ s.W_K[h] + s.b_K[h]
        logits = q @ k.T / np.sqrt(q.shape[1])
        logits[np.triu_indices(s.n, 1)] = -np.inf
        e = np.exp(logits - logits.max(axis=1, keepdims=True))
        np.testing.assert_allclose(drawn, e / e.sum(axis=1, keepdims=True), rtol=0, atol=1e-12)
    assert [v is w for v, w in zip(seen[0][1], seen[1][1], strict=True)] == [True] * 12
    count = len(painted)
    settle(qtbot, window)
    assert count >= 12 and len(painted) == count  # the mix painted nothing more there


def test_the_lines_dock_draws_every_head_before_the_mix_and_the_mix_waits(
    shown_window, qtbot, monkeypatch
):
    """An X edit with the Lines dock raised: the lines are drawn from every head before
    the mix, which begins once they are on screen (not while they are being painted)."""
    window = shown_window(scenario=small_gpt2())
    window.bring_forward(("Lines",))
    settle(qtbot, window)
    canvas = window.panel("Lines").canvas
    events = []
    canvas.painted.connect(lambda: events.append("painted"))
    when_the_mix_begins(monkeypatch, lambda: events.append("mix"))
    model = window.inputs.model
    model.setData(model.index(3, 5), "2.5")
    qtbot.waitUntil(lambda: "mix" in events and not window.compute.busy, timeout=10_000)
    assert events.index("painted") < events.index("mix")
    assert canvas.weights[0] is window.compute.result.heads[0].weights


def masks_raised(shown_window, qtbot):
    """A window at GPT-2 widths (previews come first) with the Masks dock raised over the
    Pipeline, its first comparison made and cached: (window, Masks panel)."""
    window = shown_window(scenario=small_gpt2())
    window.bring_forward(("Masks",))
    settle(qtbot, window)
    masks = window.panel("Masks")
    masks.worker.wait()
    return window, masks


def test_the_masks_dock_draws_the_shown_head_under_both_masks_first(
    shown_window, qtbot, monkeypatch
):
    """An X edit with the Masks dock raised: the shown head is updated first (a
    preview) and the dock draws it under both masks (each map against an independent
    softmax) before the other heads and the mix are made; those wait until the maps are
    on screen, and the comparison of the outputs (the table's Δ output column, shown as
    … until then) follows with the complete result."""
    window, masks = masks_raised(shown_window, qtbot)
    shown = []  # (final_shift known, the B weights drawn, how many maps had painted)
    painted = []
    for view in masks.views.values():
        view.painted.connect(lambda _, v=view: painted.append(v))
    original = masks._show

    def spy(answer):
        original(answer)
        shown.append((answer[0].final_shift is not None, masks.views["B"].spec.values))

    monkeypatch.setattr(masks, "_show", spy)
    masks.worker.done.disconnect()
    masks.worker.done.connect(masks._show)
    begun = []  # how many maps had painted when the worker took up the other heads
    update_with = compute_module.update_with

    def worker_spy(prev, s, changes, **more):
        if more.get("current_heads") and prev is window.compute.result:
            begun.append(len(painted))
        return update_with(prev, s, changes, **more)

    monkeypatch.setattr(compute_module, "update_with", worker_spy)
    model = window.inputs.model
    model.setData(model.index(3, 5), "2.5")
    qtbot.waitUntil(lambda: bool(shown) and shown[-1][0], timeout=10_000)
    assert [known for known, _ in shown] == [False, True]  # the head first, then the rest
    assert begun and begun[0] >= 4  # its maps painted before the other heads were made
    s = window.doc.scenario
    h = window.view_state.head
    q, k = s.X @ s.W_Q[h] + s.b_Q[h], s.X @ s.W_K[h] + s.b_K[h]
    logits = q @ k.T / np.sqrt(q.shape[1])
    logits[np.triu_indices(s.n, 1)] = 0.0  # B: causal-zero, the future scored 0
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    np.testing.assert_allclose(shown[0][1], e / e.sum(axis=1, keepdims=True), rtol=0, atol=1e-12)
    assert shown[1][1] is shown[0][1]  # the very head, not made again
    table = masks.table_model
    assert table.data(table.index(0, 3)) != "…"  # Δ output known at last


def test_the_masks_dock_never_computes_the_other_mask_whole_on_the_ui_thread(
    shown_window, qtbot, monkeypatch
):
    """With nothing cached under the other mask to update (another panel's results
    pushed it out), the other mask's result is a whole computation: made on the dock's
    worker, not on the UI thread as the head alone is."""
    import threading

    window, masks = masks_raised(shown_window, qtbot)
    service = window.compute
    with service._cache_lock:  # only the document's result left
        for key in [k for k in service._cache if k != service._document_key]:
            del service._cache[key]
    on_ui_thread = []
    real = compute_module.compute

    def spy(s):
        on_ui_thread.append(threading.current_thread() is threading.main_thread())
        return real(s)

    monkeypatch.setattr(compute_module, "compute", spy)
    model = window.inputs.model
    model.setData(model.index(3, 5), "2.5")
    qtbot.waitUntil(
        lambda: (
            masks.comparison is not None
            and masks.comparison.final_shift is not None
            and masks.comparison.result_a is window.compute.result
        ),
        timeout=10_000,
    )
    assert on_ui_thread and not any(on_ui_thread)  # computed whole, off the UI thread


def test_a_dock_closed_before_it_painted_an_edit_holds_the_rest_back_no_longer(shown_window, qtbot):
    """The rest of an edit waits until the Masks dock has painted its head's comparison;
    the dock closed before it could: the rest goes on at once (it waited the full
    PARTIAL_WAIT_S, here made long)."""
    window, _ = masks_raised(shown_window, qtbot)
    window.compute._release.setInterval(60_000)
    model = window.inputs.model
    model.setData(model.index(3, 5), "2.5")  # (the head's comparison drawn, not painted yet)
    assert not window.compute.result.complete and window.compute._held is not None
    window.docks["Masks"].close()
    qtbot.waitUntil(lambda: window.compute.result.complete, timeout=5_000)
