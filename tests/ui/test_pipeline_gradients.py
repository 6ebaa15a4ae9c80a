"""Gradients in the Pipeline: View → Show Gradients puts dL/d each intermediate beside
it, equal to torch autograd through the layer written again in torch primitives; they
follow edits, the head and the loss (View → Loss, undoable), and under the zero mask the
gradient that reaches the future keys is outlined as leaked weight is."""

from __future__ import annotations

import numpy as np
import pytest
from PySide6.QtCore import Qt
from waiting import look_at_pipeline, settle

torch = pytest.importorskip("torch")

import backward_reference as ref  # noqa: E402

from attnviz.core.maths.losses import preset_target  # noqa: E402
from attnviz.core.session import SetCells  # noqa: E402

pytestmark = pytest.mark.usefixtures("warnings_shown")


def autograd(s) -> dict:
    """Per-head gradients of the scenario's own loss, by autograd."""
    leaves, inter = ref.forward(s, None)
    st = s.settings
    target = preset_target(np.asarray(s.X), st.loss_target) if st.loss == "target" else None
    ref.loss_of(s, inter["final"], leaves["X"], st.loss, target, st.loss_cell).backward()
    return inter


def shown(window, qtbot):
    look_at_pipeline(window)
    window.view_state.set_gradients(True)
    settle(qtbot, window)
    return window.panel("Pipeline")


def test_each_gradient_is_drawn_beside_its_value_and_equals_autograd(shown_window, qtbot):
    window = shown_window()
    panel = shown(window, qtbot)
    inter = autograd(window.doc.scenario)
    for name in ("Q", "V", "scores", "masked", "weights", "output"):
        assert panel.views[f"d{name}"].isVisible()
        got = panel.views[f"d{name}"].spec.values
        np.testing.assert_allclose(got, inter[name][0].grad.numpy(), rtol=1e-10, atol=1e-14)
        # each gradient stands right of its value
        assert panel.views[f"d{name}"].x() > panel.views[name].x()
        assert panel.views[f"d{name}"].y() == panel.views[name].y()
    assert "previous token" in panel.loss_line.text() and panel.loss_line.isVisible()


def test_gradients_follow_an_edit_the_head_and_the_loss(shown_window, qtbot):
    window = shown_window()
    panel = shown(window, qtbot)
    doc = window.doc
    doc.push(SetCells(doc.session, "X", None, 1, 0, np.array([[1.5]])))
    settle(qtbot, window)
    window.view_state.set_head(1)
    settle(qtbot, window)
    inter = autograd(doc.scenario)
    np.testing.assert_allclose(panel.views["dK"].spec.values, inter["K"][1].grad.numpy(),
                               rtol=1e-10, atol=1e-14)  # fmt: skip
    window.change_setting(loss="next-token")
    settle(qtbot, window)
    inter = autograd(doc.scenario)
    want = inter["weights"][1].grad.numpy()
    np.testing.assert_allclose(panel.views["dweights"].spec.values, want, rtol=1e-10, atol=1e-14)
    assert "next-token" in panel.loss_line.text()
    doc.undo_stack.undo()  # the loss is part of the document: undone like any setting
    settle(qtbot, window)
    assert doc.scenario.settings.loss == "target" and "previous token" in panel.loss_line.text()


def test_the_zero_mask_outlines_the_gradient_that_reaches_future_keys(shown_window, qtbot):
    window = shown_window()
    panel = shown(window, qtbot)
    assert panel.views["dmasked"].spec.leaked is None  # −∞: exactly 0 there
    window.change_setting(mask="causal-zero")
    settle(qtbot, window)
    leaked = panel.views["dmasked"].spec.leaked
    future = np.triu(np.ones((4, 4), dtype=bool), 1)
    np.testing.assert_array_equal(leaked, future)  # every future key gets gradient


def test_ctrl_g_switches_the_gradients_off_and_on(shown_window, qtbot):
    window = shown_window()
    panel = shown(window, qtbot)
    qtbot.keyClick(window, Qt.Key.Key_G, Qt.KeyboardModifier.ControlModifier)
    settle(qtbot, window)
    assert not window.view_state.gradients and not panel.views["dQ"].isVisible()
    qtbot.keyClick(window, Qt.Key.Key_G, Qt.KeyboardModifier.ControlModifier)
    settle(qtbot, window)
    assert window.view_state.gradients and panel.views["dQ"].isVisible()


def test_the_one_cell_loss_takes_the_selected_cell_of_the_final_output(shown_window, qtbot):
    from PySide6.QtGui import QAction

    from attnviz.ui.view_state import Selection

    window = shown_window()
    panel = shown(window, qtbot)
    window.view_state.select(Selection("final", None, 2, 1))  # a click in the Mix dock
    action = next(a for a in window.findChildren(QAction) if a.text().startswith("One output"))
    action.trigger()
    settle(qtbot, window)
    s = window.doc.scenario
    assert (s.settings.loss, s.settings.loss_cell) == ("cell", (2, 1))
    inter = autograd(s)
    want = inter["output"][0].grad.numpy()  # d final[2, 1] / d output: row 2 only
    np.testing.assert_allclose(panel.views["doutput"].spec.values, want, rtol=1e-12, atol=0)
    assert not np.delete(want, 2, axis=0).any() and want[2].any()
    assert "final[3, 2]" in panel.loss_line.text()


def test_your_own_target_grid_appears_under_x_and_drives_the_gradients(shown_window, qtbot):
    from PySide6.QtGui import QAction

    window = shown_window()
    panel = shown(window, qtbot)
    action = next(a for a in window.findChildren(QAction) if a.text().startswith("Target: your"))
    action.trigger()
    settle(qtbot, window)
    grid = window.inputs.target_grid
    assert grid is not None and grid.isVisible()
    X = np.asarray(window.doc.scenario.X)
    model = grid.model()
    shown_T = [[float(model.data(model.index(i, j))) for j in range(4)] for i in range(4)]
    np.testing.assert_allclose(shown_T, np.concatenate([X[:1], X[:-1]]), atol=5e-5)
    model.setData(model.index(2, 1), "3")  # typed into T
    settle(qtbot, window)
    s = window.doc.scenario
    assert s.target[2, 1] == 3.0
    leaves, inter = ref.forward(s, None)
    ref.loss_of(s, inter["final"], leaves["X"], "target", np.asarray(s.target)).backward()
    want = inter["output"][0].grad.numpy()
    np.testing.assert_allclose(panel.views["doutput"].spec.values, want, rtol=1e-10, atol=1e-14)
    window.doc.undo_stack.undo()
    window.doc.undo_stack.undo()
    settle(qtbot, window)
    assert window.doc.scenario.settings.loss_target == "previous-token"
    assert window.inputs.target_grid is None


def test_gradients_made_while_the_pipeline_was_hidden_show_when_it_is_raised(shown_window, qtbot):
    window = shown_window()
    panel = shown(window, qtbot)
    window.bring_forward(("Masks",))  # the Pipeline's tab behind another
    doc = window.doc
    doc.push(SetCells(doc.session, "X", None, 2, 1, np.array([[-1.25]])))
    settle(qtbot, window)
    look_at_pipeline(window)
    settle(qtbot, window)
    inter = autograd(doc.scenario)
    np.testing.assert_allclose(panel.views["dQ"].spec.values, inter["Q"][0].grad.numpy(),
                               rtol=1e-10, atol=1e-14)  # fmt: skip
