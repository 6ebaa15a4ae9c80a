"""Gradients in the weight and input grids and the Heads dock: with View → Show Gradients
each cell's background is its gradient dL/d(cell) (blue negative, red positive), its
tooltip the number, and each head's map has its gradient norms under it; all equal to
torch autograd through the layer written again in torch primitives, after an edit,
under GQA, QK-norm and cross-attention too; switched off, the plain grid again."""

from __future__ import annotations

import re

import numpy as np
import pytest
from PySide6.QtCore import QPoint, Qt
from waiting import settle

torch = pytest.importorskip("torch")

import backward_reference as ref  # noqa: E402

from attnviz.core.maths.losses import preset_target  # noqa: E402
from attnviz.core.maths.scenario import resized, with_cross_attention, with_kv_heads  # noqa: E402
from attnviz.core.presets import make_preset  # noqa: E402
from attnviz.core.session import SetCells  # noqa: E402

pytestmark = pytest.mark.usefixtures("warnings_shown")

NUMBER = r"-?\d+(?:\.\d+)?(?:e-?\d+)?"


def autograd(s) -> dict[str, np.ndarray]:
    """dL/d every input of the scenario's own loss, by autograd."""
    leaves, inter = ref.forward(s, None)
    st = s.settings
    target = preset_target(np.asarray(s.X), st.loss_target) if st.loss == "target" else None
    ref.loss_of(s, inter["final"], leaves["X"], st.loss, target, st.loss_cell).backward()
    return {name: leaf.grad.numpy() for name, leaf in leaves.items() if leaf.grad is not None}


def one(grads: dict[str, np.ndarray], name: str, head: int | None) -> np.ndarray:
    g = grads[name]
    return g[head] if g.ndim == 3 else g


def painted_sign(grid, row: int, col: int) -> int:
    """+1 where the cell is painted red, −1 blue, 0 white (a pixel by its corner)."""
    grid.scrollTo(grid.model().index(row, col))
    rect = grid.visualRect(grid.model().index(row, col))
    image = grid.viewport().grab().toImage()
    colour = image.pixelColor(rect.topLeft() + QPoint(2, 2))
    return int(np.sign(colour.red() - colour.blue()))


def check_grid(grid, want: np.ndarray, head_words: str = "") -> None:
    """Every cell's tooltip gives its gradient, and a few cells' colour its sign."""
    model = grid.matrix_model()
    rows, cols = want.shape
    assert (model.rowCount(), model.columnCount()) == (rows, cols)
    for i in range(rows):
        for j in range(cols):
            tip = model.data(model.index(i, j), Qt.ItemDataRole.ToolTipRole)
            label = f"dL/d{model.name}[{i + 1},{j + 1}] = "
            line = next(line for line in tip.splitlines() if line.startswith(label))
            got = float(re.match(NUMBER, line[len(label) :]).group())
            assert got == pytest.approx(want[i, j], rel=1e-9, abs=1e-14), (model.name, i, j)
            assert head_words in line
    for i, j in {(0, 0), (rows - 1, cols - 1), np.unravel_index(np.abs(want).argmax(), want.shape)}:
        assert (
            painted_sign(grid, i, j) == np.sign(want[i, j])
            or abs(want[i, j]) < 1e-3 * np.abs(want).max()
        ), (model.name, i, j)


def gradients_on(window, qtbot):
    window.view_state.set_gradients(True)
    settle(qtbot, window)


def test_each_weight_and_input_cell_shows_its_gradient(shown_window, qtbot):
    window = shown_window()
    weights = window.panel("Weights")
    weights.biases.setChecked(True)  # the bias rows, of zeros: their gradients all the same
    gradients_on(window, qtbot)
    grads = autograd(window.doc.scenario)
    for name in ("W_Q", "W_K", "W_V", "b_Q", "b_V"):
        check_grid(weights.grids[(name, 0)], one(grads, name, 0), "(head 1)")
    check_grid(weights.grids[("W_O", None)], grads["W_O"])
    check_grid(weights.grids[("b_O", None)], grads["b_O"])
    check_grid(window.panel("Inputs").grid, grads["X"])
    # a head tab opened later shows its gradients too
    weights.tabs.setCurrentIndex(1)
    settle(qtbot, window)
    check_grid(weights.grids[("W_Q", 1)], one(grads, "W_Q", 1), "(head 2)")


def test_the_grids_follow_an_edit_and_the_loss(shown_window, qtbot):
    window = shown_window()
    gradients_on(window, qtbot)
    doc, weights = window.doc, window.panel("Weights")
    before = autograd(doc.scenario)["W_Q"][0]
    doc.push(SetCells(doc.session, "W_V", 0, 2, 1, np.array([[-1.5]])))
    settle(qtbot, window)
    grads = autograd(doc.scenario)
    assert not np.allclose(grads["W_Q"][0], before)  # (the edit moved them)
    check_grid(weights.grids[("W_Q", 0)], grads["W_Q"][0], "(head 1)")
    check_grid(window.panel("Inputs").grid, grads["X"])
    window.change_setting(loss="next-token")
    settle(qtbot, window)
    grads = autograd(doc.scenario)
    check_grid(weights.grids[("W_V", 0)], grads["W_V"][0], "(head 1)")
    window.doc.push(SetCells(doc.session, "X", None, 0, 0, np.array([[2.0]])))
    settle(qtbot, window)
    check_grid(window.panel("Inputs").grid, autograd(doc.scenario)["X"])


def test_gqa_qk_norm_and_cross_attention_grids(shown_window, qtbot):
    window = shown_window(scenario=make_preset("llama-style"))  # 4 heads over 2 KV heads
    weights = window.panel("Weights")
    window.change_setting(qk_norm="rms")
    gradients_on(window, qtbot)
    weights.tabs.setCurrentIndex(2)  # head 3 reads KV head 2
    settle(qtbot, window)
    grads = autograd(window.doc.scenario)
    check_grid(weights.grids[("W_Q", 2)], grads["W_Q"][2], "(head 3)")
    for name in ("W_K", "W_V", "k_norm"):
        check_grid(weights.grids[(name, 1)], grads[name][1], "(KV head 2, shared by heads 3–4)")
    check_grid(weights.grids[("q_norm", 2)], grads["q_norm"][2], "(head 3)")
    window.doc.change(lambda s: with_cross_attention(s, True), "Cross-attention on")
    settle(qtbot, window)
    grads = autograd(window.doc.scenario)
    inputs = window.panel("Inputs")
    check_grid(inputs.kv_grid, grads["X_kv"])
    check_grid(inputs.grid, grads["X"])


def test_switching_gradients_off_restores_the_plain_grid(shown_window, qtbot):
    window = shown_window()
    gradients_on(window, qtbot)
    window.view_state.set_gradients(False)
    settle(qtbot, window)
    weights = window.panel("Weights")
    for grid in (
        weights.grids[("W_Q", 0)],
        weights.grids[("W_O", None)],
        window.panel("Inputs").grid,
    ):
        model = grid.matrix_model()
        for i in range(model.rowCount()):
            for j in range(model.columnCount()):
                index = model.index(i, j)
                assert model.data(index, Qt.ItemDataRole.BackgroundRole) is None
                assert "dL/d" not in model.data(index, Qt.ItemDataRole.ToolTipRole)
        assert painted_sign(grid, 0, 0) == 0  # white again


SCENARIOS = {
    "worked example": lambda: None,
    "llama-style": lambda: make_preset("llama-style"),  # 4 heads over 2 KV heads
    "8 heads over 2": lambda: with_kv_heads(resized(make_preset("llama-style"), heads=8), 2),
}


@pytest.mark.parametrize("which", SCENARIOS)
def test_heads_show_each_heads_gradient_norms(shown_window, qtbot, which):
    window = shown_window(scenario=SCENARIOS[which]())
    window.bring_forward(("Heads",))
    gradients_on(window, qtbot)
    s = window.doc.scenario
    grads = autograd(s)
    panel = window.panel("Heads")
    for size in ((1440, 900), (1280, 720)):
        window.resize(*size)
        settle(qtbot, window)
        for h, label in enumerate(panel.norms):
            kv = h * s.kv_heads // s.n_heads
            want = [np.linalg.norm(grads["W_Q"][h]), np.linalg.norm(grads["W_K"][kv]),
                    np.linalg.norm(grads["W_V"][kv])]  # fmt: skip
            got = [float(x) for x in re.findall(rf"= ({NUMBER})", label.toolTip())]
            np.testing.assert_allclose(got, want, rtol=1e-12)
            assert label.isVisible() and label.text()
            # the line fits under its map: every number whole
            assert label.fontMetrics().horizontalAdvance(label.text()) <= label.width()
            assert label.geometry().bottom() <= panel.height()
    shared = "share its ‖dL/dW_K‖" in panel.hint.text()
    assert shared == (s.kv_heads != s.n_heads)
    window.view_state.set_gradients(False)
    settle(qtbot, window)
    assert not any(label.isVisible() for label in panel.norms)


def luminance(colour) -> float:
    """WCAG relative luminance of a QColor."""

    def linear(c: float) -> float:
        return c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4

    r, g, b = (linear(x) for x in (colour.redF(), colour.greenF(), colour.blueF()))
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def test_the_strongest_tints_leave_the_numbers_readable(shown_window, qtbot):
    """The largest gradient of each sign is painted light enough that the grid's text
    keeps a contrast of at least 4.5 : 1 (WCAG AA) on it."""
    window = shown_window()
    gradients_on(window, qtbot)
    grid = window.panel("Weights").grids[("W_Q", 0)]
    model = grid.matrix_model()
    want = autograd(window.doc.scenario)["W_Q"][0]
    text = luminance(grid.palette().text().color())
    for cell in (
        np.unravel_index(want.argmax(), want.shape),
        np.unravel_index(want.argmin(), want.shape),
    ):
        fill = model.data(model.index(*map(int, cell)), Qt.ItemDataRole.BackgroundRole)
        light, dark = sorted((luminance(fill), text), reverse=True)
        assert (light + 0.05) / (dark + 0.05) >= 4.5
