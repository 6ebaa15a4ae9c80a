"""Panels off screen (a dock tabbed behind another) do not draw an edit until they are on
screen again, then draw the latest: Qt keeps such a dock visible, moved outside the
window, where it is never painted. Every number checked against NumPy."""

from __future__ import annotations

import numpy as np
from PySide6.QtWidgets import QApplication, QTabBar
from waiting import settle

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


def test_with_the_pipeline_behind_a_tab_an_edit_is_drawn_when_it_is_raised(shown_window, qtbot):
    window = shown_window(scenario=small_gpt2())
    settle(qtbot, window)
    window.bring_forward(("Mix",))
    settle(qtbot, window)
    assert window.pipeline.isVisible() and not on_screen(window.pipeline)
    before = window.pipeline.views["output"].spec.values
    edit(window, "W_V", 0, 3, 5, 0.75)
    settle(qtbot, window)
    output = window.compute.result.heads[0].output
    assert not np.allclose(output, before)
    np.testing.assert_array_equal(window.pipeline.views["output"].spec.values, before)
    window.bring_forward(("Pipeline",))
    qtbot.waitUntil(
        lambda: np.array_equal(window.pipeline.views["output"].spec.values, output), timeout=5000
    )
    s = window.doc.scenario
    np.testing.assert_allclose(
        output, window.compute.result.heads[0].weights @ (s.X @ s.W_V[0]), atol=1e-12
    )


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
    np.testing.assert_array_equal(mix.final.spec.values, drawn)  # not drawn while behind
    window.bring_forward(("Mix",))
    qtbot.waitUntil(lambda: np.array_equal(mix.final.spec.values, final), timeout=5000)
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


def assert_contributions(window) -> None:
    """Each head's contribution drawn is its output times its rows of W_O (NumPy), on one
    colour scale for all, a nice number above the largest |value|."""
    mix = window.mix
    r, s = window.compute.result, window.doc.scenario
    expected = [h.output @ s.W_O[64 * k : 64 * (k + 1)] for k, h in enumerate(r.heads)]
    for k, view in enumerate(mix.parts):
        np.testing.assert_allclose(view.spec.values, expected[k], atol=1e-12)
    top = max(np.abs(part).max() for part in expected)
    low, high = mix.parts[0].spec.levels
    assert low == -high and top <= high < 2.5 * top
    assert {view.spec.levels for view in mix.parts} == {(low, high)}


def test_the_mix_shows_each_heads_contribution_after_every_kind_of_edit(shown_window, qtbot):
    window = mix_raised(shown_window, qtbot)
    edit(window, "W_V", 4, 10, 1, 2.0)
    settle(qtbot, window)
    assert_contributions(window)
    model = window.weights.grids[("W_O", None)].matrix_model()
    model.setData(model.index(7 * 64 + 3, 9), "0.125")  # W_O in head 8's rows
    settle(qtbot, window)
    assert_contributions(window)
    model = window.inputs.model
    for row in (40, 3):  # a late row (causal: that row and those after it) and an early one
        model.setData(model.index(row, 5), "2.25")
        settle(qtbot, window)
        assert_contributions(window)


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
    r, s = window.compute.result, window.doc.scenario
    assert not np.allclose(last.spec.values, before)
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
    assert not np.array_equal(mix.final.spec.values, final)
    click_tab(window, "Mix")
    qtbot.waitUntil(lambda: np.array_equal(mix.final.spec.values, final), timeout=5000)
    # The Pipeline closed, another head chosen, reopened and clicked: it shows that head
    window.docks["Pipeline"].toggleViewAction().trigger()
    window.view_state.set_head(5)
    window.docks["Pipeline"].toggleViewAction().trigger()
    settle(qtbot, window)
    click_tab(window, "Pipeline")
    output = window.compute.result.heads[5].output
    qtbot.waitUntil(
        lambda: np.array_equal(window.pipeline.views["output"].spec.values, output), timeout=5000
    )


def causal_softmax(s: Scenario, h: int, future: float = -np.inf) -> np.ndarray:
    """Head h's weights by hand: (X W_Q)(X W_K)ᵀ / √d_k, the future scored `future`."""
    q, k = s.X @ s.W_Q[h] + s.b_Q[h], s.X @ s.W_K[h] + s.b_K[h]
    logits = q @ k.T / np.sqrt(q.shape[1])
    logits[np.triu_indices(s.n, 1)] = future
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)  # type: ignore[no-any-return]


def test_the_heads_dock_shows_every_heads_weights_after_an_edit(shown_window, qtbot):
    window = shown_window(scenario=small_gpt2())
    window.bring_forward(("Heads",))
    settle(qtbot, window)
    heads = window.panel("Heads")
    model = window.inputs.model
    model.setData(model.index(3, 5), "2.5")
    settle(qtbot, window)
    s = window.doc.scenario
    for h, view in enumerate(heads.views):
        np.testing.assert_allclose(view.spec.values, causal_softmax(s, h), rtol=0, atol=1e-12)


def test_the_lines_dock_shows_the_weights_after_an_edit(shown_window, qtbot):
    window = shown_window(scenario=small_gpt2())
    window.bring_forward(("Lines",))
    settle(qtbot, window)
    canvas = window.panel("Lines").canvas
    model = window.inputs.model
    model.setData(model.index(3, 5), "2.5")
    settle(qtbot, window)
    s = window.doc.scenario
    np.testing.assert_allclose(canvas.weights[0], causal_softmax(s, 0), rtol=0, atol=1e-12)


def test_the_masks_dock_shows_the_shown_head_under_both_masks_after_an_edit(shown_window, qtbot):
    """An X edit with the Masks dock raised: its maps are the edited scenario's (each
    against an independent softmax), and the table's Δ output column is known."""
    window = shown_window(scenario=small_gpt2())
    window.bring_forward(("Masks",))
    settle(qtbot, window)
    masks = window.panel("Masks")
    window.view_state.set_head(2)
    model = window.inputs.model
    model.setData(model.index(3, 5), "2.5")
    settle(qtbot, window)
    s = window.doc.scenario
    np.testing.assert_allclose(masks.views["A"].spec.values, causal_softmax(s, 2), atol=1e-12)
    leaky = causal_softmax(s, 2, future=0.0)  # B: causal-zero, the future scored 0
    np.testing.assert_allclose(masks.views["B"].spec.values, leaky, rtol=0, atol=1e-12)
    table = masks.table_model
    assert table.data(table.index(0, 3)) != "…"  # Δ output known
