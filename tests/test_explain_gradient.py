"""The chain rule behind one cell of each gradient view, against torch autograd over the
layer written again in torch primitives (backward_reference.py) and a few lines of NumPy."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import backward_reference as ref  # noqa: E402
from scenario_strategies import SHAPES, VARIANTS, make  # noqa: E402

from attnviz.core.maths.explain import format_text  # noqa: E402
from attnviz.core.maths.explain_gradient import EXPLAINABLE_GRADIENTS, explain_gradient  # noqa: E402
from attnviz.core.maths.forward import compute  # noqa: E402
from attnviz.core.maths.losses import gradients  # noqa: E402

H = 1  # the head explained (of 4; key/value head 1 of 2)


def autograd(s):
    """(values, gradients): each intermediate of head H and dL/d it, for the scenario's own
    loss, ½‖final − T‖² with T the previous token's row of X."""
    leaves, inter = ref.forward(s, None)
    X = np.asarray(s.X)
    T = np.concatenate([X[:1], X[:-1]])
    ref.loss_of(s, inter["final"], leaves["X"], "target", T).backward()
    values = {name: inter[name][H].detach().numpy() for name in ref.HEAD_FIELDS}
    grads = {}
    for name in ref.HEAD_FIELDS:
        tensor = inter[name][H]
        grads[name] = np.zeros(tuple(tensor.shape)) if tensor.grad is None else tensor.grad.numpy()
    grads["final"] = inter["final"].grad.numpy()
    return values, grads


def explained(s, name, row, col):
    r = compute(s)
    return explain_gradient(s, r, gradients(s, None, r), name, H, row, col)


def factors(e):
    return np.array([t.factors for t in e.terms])


def step(e, start):
    """The value of the step whose label starts with start."""
    return next(st.value for st in e.steps if st.label.startswith(start))


VIEWS = {
    "plain": {},
    "causal-zero": {"mask": "causal-zero"},
    "softcap": {"softcap": 0.7},
    "rope-qk-norm": {"positional": "rope", "qk_norm": "rms"},
}


@pytest.mark.parametrize("variant", VIEWS)
def test_doutput_is_dfinal_times_the_heads_rows_of_W_O(variant):
    s = make(**VIEWS[variant])
    _values, grads = autograd(s)
    i, j = 2, 3
    e = explained(s, "doutput", i, j)
    W_row = np.asarray(s.W_O)[H * s.d_k + j]
    np.testing.assert_allclose(factors(e), np.column_stack([grads["final"][i], W_row]))
    assert e.value == pytest.approx(grads["final"][i] @ W_row)
    assert e.value == pytest.approx(grads["output"][i, j])


@pytest.mark.parametrize("variant", VIEWS)
def test_dweights_is_dout_times_a_value_row(variant):
    s = make(**VIEWS[variant])
    values, grads = autograd(s)
    i, j = 3, 1
    e = explained(s, "dweights", i, j)
    np.testing.assert_allclose(factors(e), np.column_stack([grads["output"][i], values["V"][j]]))
    assert e.value == pytest.approx(grads["weights"][i, j])


@pytest.mark.parametrize("variant", VIEWS)
def test_dV_sums_each_querys_weight_times_its_dout(variant):
    s = make(**VIEWS[variant])
    values, grads = autograd(s)
    j, c = 1, 2
    e = explained(s, "dV", j, c)
    w = values["weights"][:, j]
    np.testing.assert_allclose(factors(e), np.column_stack([w, grads["output"][:, c]]))
    assert e.value == pytest.approx(w @ grads["output"][:, c])
    assert e.value == pytest.approx(grads["V"][j, c])


@pytest.mark.parametrize("variant", VIEWS)
@pytest.mark.parametrize("cell", [(2, 1), (1, 3)])  # seen; and a future key
def test_dmasked_writes_out_the_softmax_backward(variant, cell):
    s = make(**VIEWS[variant])
    values, grads = autograd(s)
    i, j = cell
    e = explained(s, "dmasked", i, j)
    P, dP = values["weights"][i], grads["weights"][i]  # no dropout: the weights are P
    np.testing.assert_allclose(factors(e), np.column_stack([P, dP]))
    row_sum = float(P @ dP)
    assert step(e, "Σₖ") == pytest.approx(row_sum)
    assert step(e, "dP[") == pytest.approx(dP[j])
    assert step(e, "P[") == pytest.approx(P[j])
    assert e.steps[-1].value == pytest.approx(P[j] * (dP[j] - row_sum))
    assert e.value == pytest.approx(grads["masked"][i, j])
    assert "dS[i,j] = P[i,j] · (dP[i,j] − Σₖ P[i,k] · dP[i,k])" in format_text(e)


def test_under_the_zero_mask_a_hidden_dscaled_is_0_and_says_why_though_dmasked_is_not():
    s = make(mask="causal-zero")
    _values, grads = autograd(s)
    i, j = 1, 3  # key t3 after query t1
    masked = explained(s, "dmasked", i, j)
    assert masked.value == pytest.approx(grads["masked"][i, j])
    assert abs(masked.value) > 1e-6  # the future key's weight is not 0: the leak
    e = explained(s, "dscaled", i, j)
    assert e.value == 0.0 == grads["scaled"][i, j]
    assert "t3 is hidden from t1" in e.note and "0" in e.note and "constant" in e.note
    assert e.steps[0].value == pytest.approx(masked.value)  # what stops at the mask


def test_under_minus_infinity_a_hidden_dscaled_is_0_and_says_why():
    s = make()
    e = explained(s, "dscaled", 0, 2)
    assert e.value == 0.0
    assert "−∞" in e.note and "constant" in e.note


@pytest.mark.parametrize("variant", VIEWS)
def test_a_seen_dscaled_is_dmasked(variant):
    s = make(**VIEWS[variant])
    _values, grads = autograd(s)
    e = explained(s, "dscaled", 3, 1)
    assert e.value == pytest.approx(grads["masked"][3, 1])
    assert e.value == pytest.approx(grads["scaled"][3, 1])
    assert "dscaled[i,j] = dmasked[i,j]" in e.formula


@pytest.mark.parametrize("variant", VIEWS)
def test_dscores_is_dscaled_times_the_scale_and_the_softcaps_slope(variant):
    s = make(**VIEWS[variant])
    values, grads = autograd(s)
    i, j = 3, 2
    e = explained(s, "dscores", i, j)
    sigma = 1 / math.sqrt(s.d_k)
    assert step(e, "σ =") == pytest.approx(sigma)
    assert step(e, "dscaled") == pytest.approx(grads["scaled"][i, j])
    want = grads["scaled"][i, j] * sigma
    if s.settings.softcap is not None:
        slope = 1 - np.tanh(values["scores"][i, j] * sigma / 0.7) ** 2
        assert step(e, "1 − tanh²") == pytest.approx(slope)
        want *= slope
    else:
        assert "tanh" not in format_text(e)
    assert e.value == pytest.approx(want)
    assert e.value == pytest.approx(grads["scores"][i, j])


@pytest.mark.parametrize("variant", VIEWS)
def test_dQ_rot_and_dK_rot_sum_dscores_times_the_other_side(variant):
    s = make(**VIEWS[variant])
    values, grads = autograd(s)
    e = explained(s, "dQ_rot", 2, 1)
    want = np.column_stack([grads["scores"][2], values["K_rot"][:, 1]])
    np.testing.assert_allclose(factors(e), want)
    assert e.value == pytest.approx(grads["Q_rot"][2, 1])
    e = explained(s, "dK_rot", 1, 3)
    want = np.column_stack([grads["scores"][:, 1], values["Q_rot"][:, 3]])
    np.testing.assert_allclose(factors(e), want)
    assert e.value == pytest.approx(grads["K_rot"][1, 3])


def test_without_rope_or_qk_norm_dQ_and_dK_are_dQ_rot_and_dK_rot_and_say_so():
    s = make()
    _values, grads = autograd(s)
    e = explained(s, "dQ", 2, 1)
    assert "dQ is dQ_rot" in e.note
    assert e.value == pytest.approx(grads["Q"][2, 1]) and e.value == pytest.approx(
        grads["Q_rot"][2, 1]
    )
    assert "dK is dK_rot" in explained(s, "dK", 1, 0).note


@pytest.mark.parametrize("name", ["Q", "K"])
@pytest.mark.parametrize("j", [0, 1, 2, 3])  # half style: pairs (1, 3) and (2, 4)
def test_dQ_and_dK_turn_back_through_rope_and_the_rms_norm(name, j):
    s = make(positional="rope", qk_norm="rms")
    values, grads = autograd(s)
    i = 2
    e = explained(s, f"d{name}", i, j)
    # RoPE turned back: the transpose of the turn at position i (0-based, as forward)
    theta = i * 10000 ** (-2 * (j % 2) / 4)
    a, b = (j, j + 2) if j < 2 else (j - 2, j)
    d = grads[f"{name}_rot"][i]
    back = d[a] * math.cos(theta) + d[b] * math.sin(theta)
    if j >= 2:
        back = -d[a] * math.sin(theta) + d[b] * math.cos(theta)
    assert step(e, "θ") == pytest.approx(theta)
    assert step(e, f"back[t{i},{j + 1}]") == pytest.approx(back)
    A = values[name][i]
    weight = np.asarray(s.q_norm if name == "Q" else s.k_norm)[H if name == "Q" else 0, 0]
    assert step(e, "r = ") == pytest.approx(math.sqrt(np.mean(A * A) + 1e-6))
    assert step(e, f"u[{j + 1}] =") == pytest.approx(back * weight[j])
    assert e.value == pytest.approx(grads[name][i, j])
    assert e.steps[-1].value == pytest.approx(grads[name][i, j])


@pytest.mark.parametrize("variant", [*VARIANTS, *SHAPES])
def test_every_cells_value_is_the_gradients_cell_and_its_arithmetic_reaches_it(variant):
    s = make(**{**VARIANTS, **SHAPES}[variant])
    r = compute(s)
    g = gradients(s, None, r)
    head = min(H, len(g.heads) - 1)
    for name in EXPLAINABLE_GRADIENTS:
        M = g.matrix(name[1:], head)
        for i in range(M.shape[0]):
            for j in range(M.shape[1]):
                e = explain_gradient(s, r, g, name, head, i, j)
                assert e.value == M[i, j]  # the heatmap's number
                done = e.steps[-1].value if e.steps else e.value
                if name != "dscaled" or not r.future[i, j]:
                    assert done == pytest.approx(M[i, j], rel=1e-9, abs=1e-9), (name, i, j)


def test_a_cell_outside_the_gradient_is_named():
    s = make()
    r = compute(s)
    with pytest.raises(KeyError, match="dweights: cell"):
        explain_gradient(s, r, gradients(s, None, r), "dweights", 0, 9, 0)
    with pytest.raises(KeyError, match="dfinal"):
        explain_gradient(s, r, gradients(s, None, r), "dfinal", 0, 0, 0)
