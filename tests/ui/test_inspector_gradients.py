"""The Inspector explains a gradient cell: a click on a cell of dQ, …, dmasked, … in the
Pipeline (View → Show Gradients) shows that step of the chain rule with its numbers, equal
to torch autograd through the layer written again in torch primitives, and its value is
the heatmap's cell; at the Inspector's narrowest it needs no sideways scrolling."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from PySide6.QtCore import Qt
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QApplication
from waiting import look_at_pipeline, settle

torch = pytest.importorskip("torch")

import backward_reference as ref  # noqa: E402

from attnviz.core.maths.explain_gradient import explain_gradient  # noqa: E402
from attnviz.core.maths.losses import gradients  # noqa: E402
from attnviz.core.presets import make_preset  # noqa: E402
from attnviz.ui.panels.inspector import InspectorPanel, number  # noqa: E402
from attnviz.ui.view_state import Selection  # noqa: E402
from attnviz.ui.workspace import Workspace  # noqa: E402

pytestmark = pytest.mark.usefixtures("warnings_shown")


def autograd(s):
    """(values, gradients) of head 1's intermediates and the final output, for the
    scenario's own loss (½‖final − T‖², T: each row the previous token's row of X)."""
    leaves, inter = ref.forward(s, None)
    X = np.asarray(s.X)
    T = np.concatenate([X[:1], X[:-1]])
    ref.loss_of(s, inter["final"], leaves["X"], "target", T).backward()
    values = {name: inter[name][0].detach().numpy() for name in ref.HEAD_FIELDS}
    grads = {name: inter[name][0].grad.numpy() for name in ref.HEAD_FIELDS}
    grads["final"] = inter["final"].grad.numpy()
    return values, grads


def numbers(text: str) -> list[float]:
    """Every number printed in the Inspector (Unicode minus signs included)."""
    text = text.replace("\u2060", "").replace("\u200b", "").replace("−", "-")
    return [float(m) for m in re.findall(r"-?\d+(?:\.\d+)?(?:e[+-]?\d+)?", text)]


def assert_shows(text: str, *values: float) -> None:
    """Each value is printed, to the 6 significant digits the Inspector uses."""
    shown = numbers(text)
    for v in values:
        assert any(abs(x - v) <= 1e-5 * max(1.0, abs(v)) for x in shown), (v, text)


def shown_value(text: str) -> str:
    match = re.search(r"value = (\S+)", text)
    assert match, text
    return match.group(1)


def with_gradients(window, qtbot, **settings):
    if settings:
        window.change_setting(**settings)
    look_at_pipeline(window)
    window.view_state.set_gradients(True)
    settle(qtbot, window)
    return window.panel("Pipeline")


def click(window, qtbot, view: str, row: int, col: int) -> str:
    """Click the middle of a cell of a Pipeline view with the mouse; the Inspector's text."""
    heatmap = window.panel("Pipeline").views[view]
    QTest.mouseClick(
        heatmap,
        Qt.MouseButton.LeftButton,
        Qt.KeyboardModifier.NoModifier,
        heatmap.point_at(col + 0.5, row + 0.5).toPoint(),
    )
    settle(qtbot, window)
    assert window.view_state.selection == Selection(view, 0, row, col)
    text: str = window.inspector.view.toPlainText()
    # the value printed is the heatmap's cell
    assert shown_value(text) == number(heatmap.spec.values[row, col]), (view, text)
    return text


def test_each_gradient_cell_clicked_shows_its_chain_rule(shown_window, qtbot):
    window = shown_window()
    with_gradients(window, qtbot)
    s = window.doc.scenario
    v, g = autograd(s)
    P, dP = v["weights"], g["weights"]

    text = click(window, qtbot, "dmasked", 2, 1)  # query "the", key "saw"
    assert "dmasked" in text and "head 1 · row 3 (the) · column 2 (saw)" in text
    assert "dS[i,j] = P[i,j] · (dP[i,j] − Σₖ P[i,k] · dP[i,k])" in text
    row_sum = P[2] @ dP[2]
    assert_shows(text, *P[2, :3], *dP[2, :3], *(P[2] * dP[2])[:3], row_sum, dP[2, 1] - row_sum)
    assert_shows(text, P[2, 1] * (dP[2, 1] - row_sum), g["masked"][2, 1])

    text = click(window, qtbot, "dweights", 3, 0)
    assert_shows(text, *g["output"][3], *v["V"][0], g["output"][3] @ v["V"][0], g["weights"][3, 0])

    text = click(window, qtbot, "dV", 1, 1)
    assert_shows(text, *(v["weights"][:, 1] * g["output"][:, 1]), g["V"][1, 1])

    text = click(window, qtbot, "doutput", 3, 1)
    W_row = np.asarray(s.W_O)[1]  # head 1, column 2: W_O's row 2
    assert_shows(text, *g["final"][3], *W_row, g["final"][3] @ W_row, g["output"][3, 1])

    text = click(window, qtbot, "dscaled", 3, 2)  # seen: dmasked
    assert "dscaled[i,j] = dmasked[i,j]" in text
    assert_shows(text, g["masked"][3, 2], g["scaled"][3, 2])
    text = click(window, qtbot, "dscaled", 0, 3)  # hidden by −∞
    assert shown_value(text) == "0" and "−∞" in text and "constant" in text

    text = click(window, qtbot, "dscores", 3, 2)
    assert_shows(text, g["scaled"][3, 2], 1 / math.sqrt(2), g["scores"][3, 2])
    assert "tanh" not in text

    text = click(window, qtbot, "dQ", 2, 0)  # no RoPE, no QK-norm: dQ is dQ_rot
    assert "dQ is dQ_rot" in text
    assert_shows(text, *(g["scores"][2] * v["K"][:, 0]), g["Q"][2, 0])
    text = click(window, qtbot, "dK", 1, 1)
    assert "dK is dK_rot" in text and "row 2 (saw)" in text  # a row of K is a key
    assert_shows(text, *(g["scores"][:, 1] * v["Q"][:, 1]), g["K"][1, 1])


def test_under_the_zero_mask_a_hidden_dscaled_is_0_and_dmasked_is_not(shown_window, qtbot):
    window = shown_window()
    with_gradients(window, qtbot, mask="causal-zero")
    v, g = autograd(window.doc.scenario)
    text = click(window, qtbot, "dmasked", 0, 3)  # key "cat" after query "she"
    assert abs(g["masked"][0, 3]) > 1e-6
    assert_shows(text, v["weights"][0, 3], g["weights"][0, 3], g["masked"][0, 3])
    text = click(window, qtbot, "dscaled", 0, 3)
    assert shown_value(text) == "0"
    assert "cat is hidden from she" in text and "wrote 0" in text and "constant" in text
    assert_shows(text, g["masked"][0, 3])  # what stops at the mask


def test_the_soft_cap_passes_one_minus_tanh_squared(shown_window, qtbot):
    window = shown_window()
    with_gradients(window, qtbot, softcap=1.5)
    v, g = autograd(window.doc.scenario)
    text = click(window, qtbot, "dscores", 3, 1)
    x = v["scores"][3, 1] / math.sqrt(2)
    slope = 1 - math.tanh(x / 1.5) ** 2
    assert "1 − tanh²" in text
    assert_shows(text, g["scaled"][3, 1], x, math.tanh(x / 1.5), slope, g["scores"][3, 1])
    assert_shows(text, g["scaled"][3, 1] / math.sqrt(2) * slope)


def test_dQ_turns_back_through_rope_and_the_rms_norm(shown_window, qtbot):
    window = shown_window()
    with_gradients(window, qtbot, positional="rope", qk_norm="rms")
    s = window.doc.scenario
    v, g = autograd(s)
    i = 3
    text = click(window, qtbot, "dQ_rot", i, 1)
    assert_shows(text, *(g["scores"][i] * v["K_rot"][:, 1]), g["Q_rot"][i, 1])
    text = click(window, qtbot, "dK_rot", 1, 0)
    assert_shows(text, *(g["scores"][:, 1] * v["Q_rot"][:, 0]), g["K_rot"][1, 0])
    # d_k = 2: one pair (1, 2) turned by θ = position · 1 (0-based, as forward)
    text = click(window, qtbot, "dQ", i, 0)
    d = g["Q_rot"][i]
    back = d @ [math.cos(i), math.sin(i)]
    A = v["Q"][i]
    r = math.sqrt(np.mean(A * A) + s.settings.qk_norm_eps)
    assert_shows(text, float(i), back, r, g["Q"][i, 0])
    assert "q_norm" in text and "RoPE turned back" in text


KINDS = ("dQ", "dK", "dV", "dQ_rot", "dK_rot", "dscores", "dscaled", "dmasked", "dweights",
         "doutput")  # fmt: skip


FIT_CASES = {  # a preset and settings
    "worked-example": ("worked-example", {}),
    "llama-style": ("llama-style", {}),  # RoPE, 4 query heads over 2 KV heads
    "llama-style, QK-norm, soft-cap": ("llama-style", {"qk_norm": "rms", "softcap": 5.0}),
    "sinks": ("sinks", {}),
    "zero mask, dropout": ("worked-example", {"mask": "causal-zero", "dropout": 0.3}),
}


@pytest.mark.parametrize("case", FIT_CASES)
def test_every_gradient_explanation_fits_260_px(qtbot, case):
    """At the Inspector's narrowest (260 px, the right column at 1280 × 720) every number
    of every gradient's terms and steps is on the page, with a true minus sign and no
    sideways scrolling."""
    preset, settings = FIT_CASES[case]
    scenario = make_preset(preset).with_settings(**settings)
    panel = InspectorPanel(Workspace.create(scenario))
    qtbot.addWidget(panel)
    panel.resize(260, 720)
    panel.show()
    qtbot.waitExposed(panel)
    result = panel.compute.result
    g = gradients(scenario, None, result)
    last = scenario.n - 1
    for view in KINDS:
        if view.endswith("_rot") and scenario.settings.positional != "rope":
            continue
        panel.view_state.select(Selection(view, 0, last, 1))
        panel.compute.wait()
        for _ in range(10):
            QApplication.processEvents()
        e = explain_gradient(scenario, result, g, view, 0, last, 1)
        text = panel.view.toPlainText().replace("\u2060", "").replace("\u200b", "")
        text = text.replace("\xa0", " ")
        assert panel.view.horizontalScrollBar().maximum() == 0, (case, view)
        assert view in text
        assert not re.search(r"-\d", text), (case, view, text)  # true minus signs only
        for x in (e.value, *(t.value for t in e.terms), *(s.value for s in e.steps)):
            assert number(x) in text, (case, view, number(x))
