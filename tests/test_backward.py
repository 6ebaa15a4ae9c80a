"""The backward pass against torch autograd through the layer written again in torch
primitives (backward_reference.py), for every variant, shape and loss; against central
finite differences; and the brief's two claims about gradients."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

import backward_reference as ref  # noqa: E402
from scenario_strategies import SHAPES, VARIANTS, make, scenarios  # noqa: E402

from attnviz.core.maths.forward import compute  # noqa: E402
from attnviz.core.maths.losses import Loss, gradients, preset_target  # noqa: E402
from attnviz.core.maths.scenario import ScenarioError  # noqa: E402

RELATIVE = 1e-12


def close(got: np.ndarray, want: np.ndarray, what: str, overall: float = 0.0) -> None:
    """got within RELATIVE of want's largest entry, or of 10⁻² of the largest gradient of
    the layer (``overall``) for one far smaller: there the rounding of the terms that
    cancel dominates (b_K's gradient is zero but for it: softmax ignores a constant added
    to a row), in autograd as much as here."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, (what, got.shape, want.shape)
    largest = float(np.abs(want).max()) if want.size else 0.0
    scale = overall if largest < 1e-10 * overall else max(largest, 1e-2 * overall)
    error = float(np.abs(got - want).max()) if want.size else 0.0
    assert error <= RELATIVE * max(scale, 1e-300), (
        f"{what}: off by {error:.3g} (largest {scale:.3g})"
    )


def losses_for(s) -> list[Loss]:
    rng = np.random.default_rng(1)
    target = rng.normal(size=(s.n, s.d_model))
    kinds = [Loss("target", target), Loss("cell", cell=(s.n - 1, s.d_model - 1))]
    return kinds + ([Loss("next-token")] if s.n >= 2 else [])


def check(s, loss: Loss) -> None:
    r = compute(s)
    keep = np.stack([h.keep for h in r.heads]) if s.settings.dropout else None
    leaves, inter = ref.forward(s, keep)
    target = None if loss.target is None else loss.target
    L = ref.loss_of(s, inter["final"], leaves["X"], loss.kind, target, loss.cell)
    L.backward()
    g = gradients(s, loss, r)
    assert g.loss == pytest.approx(L.item(), rel=1e-12, abs=1e-300)
    grads = [leaf.grad.abs().max().item() for leaf in leaves.values() if leaf.grad is not None]
    overall = max(grads, default=0.0)
    if loss.kind == "next-token":  # dlogits = (softmax − one-hot)/(n − 1): terms of that
        overall = max(overall, 1.0 / (s.n - 1))  # size, which cancel where the model is sure
    for name, leaf in leaves.items():
        want = grad_of(leaf)
        if name not in g.inputs:
            assert not want.any(), f"{name} has a gradient attnviz does not give"
            continue
        close(g.inputs[name], want, f"d{name}", overall)
    for h, head in enumerate(g.heads):
        for field in ref.HEAD_FIELDS:
            close(getattr(head, field), grad_of(inter[field][h]), f"head {h + 1} d{field}", overall)
    close(g.concat, grad_of(inter["concat"]), "dconcat", overall)
    close(g.final, grad_of(inter["final"]), "dfinal", overall)


def grad_of(tensor) -> np.ndarray:
    """A tensor's gradient; zeros where the loss does not reach it (every head ablated)."""
    return np.zeros(tuple(tensor.shape)) if tensor.grad is None else tensor.grad.numpy()


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("kind", ["target", "cell", "next-token"])
def test_every_variant_agrees_with_autograd(variant, kind):
    s = make(**VARIANTS[variant])
    if s.settings.mask == "custom":  # row 2 sees no key at all
        rows = [[1, 0, 1, 1], [0, 0, 0, 0], [1, 1, 0, 1], [0, 1, 1, 1]]
        s = dataclasses.replace(s, mask_matrix=np.array(rows, dtype=float))
    check(s, next(x for x in losses_for(s) if x.kind == kind))


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("variant", ["plain", "everything-rope", "causal-zero", "dropout"])
def test_every_shape_agrees_with_autograd(shape, variant):
    s = make(**SHAPES[shape], **VARIANTS[variant])
    for loss in losses_for(s):
        check(s, loss)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(), st.sampled_from(["target", "cell", "next-token"]))
def test_random_scenarios_agree_with_autograd(s, kind):
    losses = [x for x in losses_for(s) if x.kind == kind] or losses_for(s)[:1]
    check(s, losses[0])


# Central finite differences -----------------------------------------------------------


def numeric(s, name: str, index: tuple[int, ...], loss: Loss, step: float = 1e-6) -> float:
    def at(delta: float) -> float:
        a = np.array(getattr(s, name), dtype=np.float64)
        a[index] += delta
        return gradients(dataclasses.replace(s, **{name: a}), loss).loss

    return (at(step) - at(-step)) / (2 * step)


@pytest.mark.parametrize("variant", ["plain", "everything-rope", "everything-alibi", "dropout"])
def test_a_few_cells_of_each_input_agree_with_finite_differences(variant):
    s = make(m=5, **VARIANTS[variant])  # cross-attention: X_kv is an input of its own
    if s.settings.mask == "custom":
        s = dataclasses.replace(s, mask_matrix=np.ones((s.n, s.m)))
    loss = Loss("target", np.random.default_rng(2).normal(size=(s.n, s.d_model)))
    g = gradients(s, loss)
    rng = np.random.default_rng(3)
    for name, grad in g.inputs.items():
        for _ in range(2):
            index = tuple(int(rng.integers(k)) for k in grad.shape)
            want = numeric(s, name, index, loss)
            assert grad[index] == pytest.approx(want, rel=1e-6, abs=1e-8), (name, index)


# The losses -----------------------------------------------------------------------------


def test_the_default_target_asks_for_a_previous_token_head():
    X = np.arange(12.0).reshape(4, 3)
    np.testing.assert_array_equal(preset_target(X), [X[0], X[0], X[1], X[2]])
    np.testing.assert_array_equal(preset_target(X, "first-token"), [X[0]] * 4)
    np.testing.assert_array_equal(preset_target(X, "copy-self"), X)


def test_the_default_target_loss_is_half_the_squared_distance():
    s = make()
    final = compute(s).final
    T = np.concatenate([s.X[:1], s.X[:-1]])
    assert gradients(s, Loss()).loss == pytest.approx(0.5 * ((final - T) ** 2).sum(), rel=1e-14)


@pytest.mark.parametrize(
    ("loss", "message"),
    [
        (Loss("cell", cell=(4, 0)), "cell 5,1: the output is 4×5"),
        (Loss("target", np.zeros((3, 5))), "target: 3×5; expected the output's 4×5"),
        (Loss("nonsense"), "loss 'nonsense'"),
    ],
)
def test_a_bad_loss_is_named(loss, message):
    with pytest.raises(ScenarioError, match=message):
        gradients(make(), loss)


def test_next_token_needs_two_tokens():
    with pytest.raises(ScenarioError, match="at least 2 tokens"):
        gradients(make(n=1), Loss("next-token"))


# The brief's claims ---------------------------------------------------------------------


def test_the_zero_mask_leaks_gradient_to_future_values_and_minus_infinity_does_not():
    """d final[0, c] / dV of one head: P[0, j] · W_O's column c over that head's rows, by
    hand in NumPy; under −∞ every future key (j > 0) gets exactly nothing."""
    s = make(H=2, G=2, biases=False, norms=False)
    d_k, c = s.d_k, 1
    for mask in ("causal", "causal-zero"):
        t = s.with_settings(mask=mask)
        g = gradients(t, Loss("cell", cell=(0, c)))
        for h in range(2):
            Q, K = s.X @ s.W_Q[h], s.X @ s.W_K[h]
            scores = Q[0] @ K.T / np.sqrt(d_k)
            scores[1:] = -np.inf if mask == "causal" else 0.0
            P = np.exp(scores - scores.max())
            P /= P.sum()
            want = P[:, None] * s.W_O[h * d_k : (h + 1) * d_k, c][None, :]
            np.testing.assert_allclose(g.heads[h].V, want, rtol=1e-12, atol=1e-15)
            future = g.heads[h].V[1:]
            assert (future == 0).all() if mask == "causal" else (np.abs(future) > 0).all()
        leaked = np.abs(g.inputs["X"][1:]).max()
        assert leaked == 0.0 if mask == "causal" else leaked > 1e-3


def test_a_saturated_softmax_passes_almost_no_gradient():
    """The brief's scores [2, 1, 0, −1] and the same times 8: the softmax's Jacobian
    diag(P) − P Pᵀ, by hand, shrinks by orders of magnitude, and the gradient reaching
    the scores with it (one query over four keys, dP = [1, 0, 0, 0])."""
    from attnviz.core.maths.scenario import Scenario, Settings

    def d_scores(times: float) -> np.ndarray:
        X = np.array([[1.0, 0.0], [0.0, 0.0], [0.0, 0.0], [0.0, 0.0]])
        K = np.array([[2.0], [1.0], [0.0], [-1.0]]) * times
        s = Scenario(tokens=("a", "b", "c", "d"), X=np.hstack([X[:, :1], K]),
                     W_Q=np.array([[[1.0], [0.0]]]), W_K=np.array([[[0.0], [1.0]]]),
                     W_V=np.array([[[1.0], [0.0]]]), W_O=np.array([[1.0, 0.0]]),
                     settings=Settings(mask="none", scale=False))  # fmt: skip
        # query 0 is (1, 2·times…) → its scores are 1 × K: [2, 1, 0, −1] · times
        return gradients(s, Loss("cell", cell=(0, 0))).heads[0].masked[0]

    for times in (1.0, 8.0):
        S = np.array([2.0, 1.0, 0.0, -1.0]) * times
        P = np.exp(S - S.max()) / np.exp(S - S.max()).sum()
        V = np.array([1.0, 0.0, 0.0, 0.0])  # the values' first column: X's first column
        want = P * (V - P @ V)  # P ⊙ (dP − Σ P dP) with dP = V for d out[0, 0]
        np.testing.assert_allclose(d_scores(times), want, rtol=1e-12, atol=1e-300)
    assert np.abs(d_scores(1.0)).max() > 500 * np.abs(d_scores(8.0)).max()
