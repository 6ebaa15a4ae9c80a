"""QK-norm over the whole projection ("rms-whole", OLMo 2): one RMS per token over every
head's features of Q (and of K) together, then the per-head weights q_norm / k_norm.

Every expected number here comes from a calculation written in this file: a by-hand
NumPy forward (loops over tokens and heads), and a torch forward whose autograd gives
the gradients. The engine's own functions are only the thing under test.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from attnviz.core.io.files import load_scenario, save_scenario
from attnviz.core.maths.changes import changes_between
from attnviz.core.maths.explain import explain
from attnviz.core.maths.explain_gradient import explain_gradient
from attnviz.core.maths.forward import compute, head_inputs, one_head
from attnviz.core.maths.kvcache import KVCache
from attnviz.core.maths.losses import gradients
from attnviz.core.maths.reuse import Base, Plan
from attnviz.core.maths.scenario import QK_NORMS, Scenario, ScenarioError, Settings
from attnviz.core.maths.torch_engine import compute_torch, tolerances


def scenario(
    n=5, m=None, d_model=6, heads=4, kv=2, d_k=3, seed=0, projections=True, **settings
) -> Scenario:
    """Random numbers everywhere a number counts: X, the projections, their biases and
    the norm weights (none equal to 1)."""
    rng = np.random.default_rng(seed)
    m = n if m is None else m
    cross = {}
    if m != n:
        cross = {
            "kv_tokens": tuple(f"k{j}" for j in range(m)),
            "X_kv": rng.normal(size=(m, d_model)),
        }
    st = Settings(qk_norm="rms-whole", projections=projections, **settings)
    return Scenario(
        tokens=tuple(f"t{i}" for i in range(n)),
        X=rng.normal(size=(n, d_model)) * 2,
        W_Q=rng.normal(size=(heads, d_model, d_k)),
        W_K=rng.normal(size=(kv, d_model, d_k)),
        W_V=rng.normal(size=(kv, d_model, d_k)),
        W_O=rng.normal(size=(heads * d_k, d_model)),
        b_Q=rng.normal(size=(heads, 1, d_k)),
        b_K=rng.normal(size=(kv, 1, d_k)),
        b_V=rng.normal(size=(kv, 1, d_k)),
        b_O=rng.normal(size=(1, d_model)),
        q_norm=rng.uniform(0.5, 2.0, size=(heads, 1, d_k)),
        k_norm=rng.uniform(-2.0, 2.0, size=(kv, 1, d_k)),
        settings=st,
        **cross,
    )


CASES = {
    "mha": scenario(kv=4),
    "gqa-rope": scenario(positional="rope"),
    "mqa-eps": scenario(kv=1, qk_norm_eps=0.5, seed=1),
    "cross-gqa-rope-interleaved": scenario(
        m=7, positional="rope", rope_style="interleaved", seed=2
    ),
    "one-head": scenario(heads=1, kv=1, d_k=4, seed=3),
    "no-projections": scenario(projections=False, positional="rope", seed=4),
    "ablated-softcap": scenario(ablated=(1,), softcap=2.0, seed=5),
}


# The by-hand forward ------------------------------------------------------------------


def heads_of(s: Scenario) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]]:
    """Q of every query head, K and V of every key/value head, row by row."""
    X_kv = s.X if s.X_kv is None else s.X_kv
    if not s.settings.projections:
        return [s.X], [X_kv], [X_kv]
    Q = [np.array([s.X[i] @ s.W_Q[h] + s.b_Q[h, 0] for i in range(s.n)]) for h in range(s.n_heads)]
    K = [
        np.array([X_kv[j] @ s.W_K[g] + s.b_K[g, 0] for j in range(s.m)]) for g in range(s.kv_heads)
    ]
    V = [
        np.array([X_kv[j] @ s.W_V[g] + s.b_V[g, 0] for j in range(s.m)]) for g in range(s.kv_heads)
    ]
    return Q, K, V


def whole_normed(A: list[np.ndarray], weights, eps: float) -> list[np.ndarray]:
    """Each token's row of every head divided by one RMS over all of them, times the
    head's weights."""
    out = [np.zeros_like(a) for a in A]
    for i in range(len(A[0])):
        features = [float(v) for a in A for v in a[i]]
        r = math.sqrt(sum(v * v for v in features) / len(features) + eps)
        for h, a in enumerate(A):
            w = 1.0 if weights is None else weights[h, 0]
            out[h][i] = a[i] / r * w
    return out


def turned(A: np.ndarray, pos: list[int], st: Settings) -> np.ndarray:
    if st.positional != "rope":
        return A
    d = A.shape[1]
    half = d // 2
    out = A.copy()
    for i, p in enumerate(pos):
        for k in range(half):
            a, b = (k, k + half) if st.rope_style == "half" else (2 * k, 2 * k + 1)
            theta = p * st.rope_base ** (-2.0 * k / d)
            out[i, a] = A[i, a] * math.cos(theta) - A[i, b] * math.sin(theta)
            out[i, b] = A[i, a] * math.sin(theta) + A[i, b] * math.cos(theta)
    return out


def by_hand(s: Scenario) -> dict[str, list[np.ndarray] | np.ndarray]:
    st = s.settings
    Q, K, V = heads_of(s)
    proj = st.projections
    Qn = whole_normed(Q, s.q_norm if proj else None, st.qk_norm_eps)
    Kn = whole_normed(K, s.k_norm if proj else None, st.qk_norm_eps)
    H, G = len(Q), len(K)
    d = Q[0].shape[1]
    Q_rot, K_rot, weights, outputs = [], [], [], []
    for h in range(H):
        g = h * G // H
        q = turned(Qn[h], list(range(s.n)), st)
        k = turned(Kn[g], list(range(s.m)), st)
        scores = q @ k.T / math.sqrt(d)
        if st.softcap is not None:
            scores = st.softcap * np.tanh(scores / st.softcap)
        for i in range(s.n):
            for j in range(s.m):
                if j > i:
                    scores[i, j] = -np.inf
        w = np.exp(scores - scores.max(axis=1, keepdims=True))
        w /= w.sum(axis=1, keepdims=True)
        Q_rot.append(q)
        K_rot.append(k)
        weights.append(w)
        outputs.append(w @ V[g])
    concat = np.concatenate(outputs, axis=1)
    final = concat
    if proj:
        final = s.b_O[0] + sum(
            concat[:, h * d : (h + 1) * d] @ s.W_O[h * d : (h + 1) * d]
            for h in range(H)
            if h not in st.ablated
        )
    return {"Q_rot": Q_rot, "K_rot": K_rot, "weights": weights, "concat": concat, "final": final}


@pytest.mark.parametrize("name", CASES)
def test_the_forward_pass_is_the_by_hand_one(name):
    s = CASES[name]
    want = by_hand(s)
    r = compute(s)
    for h, head in enumerate(r.heads):
        for field in ("Q_rot", "K_rot", "weights"):
            np.testing.assert_allclose(getattr(head, field), want[field][h], rtol=0, atol=1e-12)
        # one head alone (the divisor still over every head) is the same head
        alone = one_head(s, h).one
        np.testing.assert_allclose(alone.Q_rot, head.Q_rot, rtol=0, atol=1e-13)
        np.testing.assert_allclose(alone.K_rot, head.K_rot, rtol=0, atol=1e-13)
        Q_rot, K_rot, _ = head_inputs(s, h)
        np.testing.assert_allclose(Q_rot, head.Q_rot, rtol=0, atol=1e-13)
        np.testing.assert_allclose(K_rot, head.K_rot, rtol=0, atol=1e-13)
    np.testing.assert_allclose(r.concat, want["concat"], rtol=0, atol=1e-12)
    np.testing.assert_allclose(r.final, want["final"], rtol=0, atol=1e-12)


def test_the_whole_norm_differs_from_the_per_head_one():
    s = CASES["gqa-rope"]
    per_head = compute(s.with_settings(qk_norm="rms"))
    assert np.abs(compute(s).heads[0].Q_rot - per_head.heads[0].Q_rot).max() > 1e-3


def test_the_choice_is_named_and_checked():
    assert "rms-whole" in QK_NORMS
    with pytest.raises(ScenarioError, match="rms-whole"):
        Settings(qk_norm="whole")


# Gradients: the engine's by hand against torch's autograd -----------------------------


def autograd(s: Scenario, d_final: np.ndarray) -> tuple[dict, list, list]:
    """Every input's gradient and each query head's dQ, and each key/value head's dK,
    by torch autograd through a forward that reads each key/value head once."""
    st = s.settings
    proj = st.projections

    def t(a):
        return torch.tensor(np.asarray(a, dtype=np.float64), requires_grad=True)

    names = ["X", *(["X_kv"] if s.cross else [])]
    if proj:
        names += ["W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O", "q_norm", "k_norm"]
    leaf = {name: t(getattr(s, name)) for name in names}
    X = leaf["X"]
    X_kv = leaf["X_kv"] if s.cross else X
    if proj:
        Q = torch.einsum("nd,hdk->hnk", X, leaf["W_Q"]) + leaf["b_Q"]
        K = torch.einsum("nd,hdk->hnk", X_kv, leaf["W_K"]) + leaf["b_K"]
        V = torch.einsum("nd,hdk->hnk", X_kv, leaf["W_V"]) + leaf["b_V"]
    else:
        Q, K, V = X[None] * 1.0, X_kv[None] * 1.0, X_kv[None] * 1.0
    Q.retain_grad()
    K.retain_grad()
    rq = torch.sqrt((Q * Q).mean(dim=(0, 2), keepdim=True) + st.qk_norm_eps)
    rk = torch.sqrt((K * K).mean(dim=(0, 2), keepdim=True) + st.qk_norm_eps)
    Qn, Kn = Q / rq, K / rk
    if proj:
        Qn, Kn = Qn * leaf["q_norm"], Kn * leaf["k_norm"]
    H, G = Q.shape[0], K.shape[0]
    d = Q.shape[2]
    outs = []
    future = torch.triu(torch.ones(s.n, s.m, dtype=torch.bool), diagonal=1)
    for h in range(H):
        q = turned_t(Qn[h], list(range(s.n)), st)
        k = turned_t(Kn[h * G // H], list(range(s.m)), st)
        scores = q @ k.T / math.sqrt(d)
        if st.softcap is not None:
            scores = st.softcap * torch.tanh(scores / st.softcap)
        w = torch.softmax(scores.masked_fill(future, -torch.inf), dim=1)
        outs.append(w @ V[h * G // H])
    concat = torch.cat(outs, dim=1)
    final = concat
    if proj:
        final = leaf["b_O"][0] + sum(
            concat[:, h * d : (h + 1) * d] @ leaf["W_O"][h * d : (h + 1) * d]
            for h in range(H)
            if h not in st.ablated
        )
    final.backward(torch.tensor(d_final))
    return {name: a.grad.numpy() for name, a in leaf.items()}, Q.grad.numpy(), K.grad.numpy()


def turned_t(A: torch.Tensor, pos: list[int], st: Settings) -> torch.Tensor:
    """RoPE on a tensor, as ``turned`` does it on an array."""
    if st.positional != "rope":
        return A
    d = A.shape[1]
    half = d // 2
    k = torch.arange(half, dtype=torch.float64)
    theta = torch.tensor(pos, dtype=torch.float64)[:, None] * st.rope_base ** (-2.0 * k / d)
    first = list(range(half)) if st.rope_style == "half" else list(range(0, 2 * half, 2))
    second = list(range(half, 2 * half)) if st.rope_style == "half" else list(range(1, 2 * half, 2))
    a, b = A[:, first], A[:, second]
    out = A.clone()
    out[:, first] = a * torch.cos(theta) - b * torch.sin(theta)
    out[:, second] = a * torch.sin(theta) + b * torch.cos(theta)
    return out


@pytest.mark.parametrize("name", CASES)
def test_the_gradients_are_autograd_s(name):
    s = CASES[name]
    g = gradients(s)
    want, d_Q, d_K = autograd(s, np.asarray(g.final))
    assert set(g.inputs) == set(want)
    for key, a in want.items():
        np.testing.assert_allclose(g.inputs[key], a, rtol=0, atol=1e-11, err_msg=key)
    group = [h * len(d_K) // len(d_Q) for h in range(len(d_Q))]
    for h, head in enumerate(g.heads):
        np.testing.assert_allclose(head.Q, d_Q[h], rtol=0, atol=1e-11)
    # a key/value head's gradient is the sum of its query heads' shares
    for k in range(len(d_K)):
        shares = sum(g.heads[h].K for h in range(len(d_Q)) if group[h] == k)
        np.testing.assert_allclose(shares, d_K[k], rtol=0, atol=1e-11)


# The other engines and the rest of the program ----------------------------------------


@pytest.mark.parametrize("name", CASES)
def test_the_torch_engine_is_the_numpy_one(name):
    s = CASES[name]
    want = by_hand(s)
    for dtype, atol in (("float64", 1e-12), ("float32", 1e-4)):
        got = compute_torch(s, "cpu", dtype)
        for h, head in enumerate(got.heads):
            np.testing.assert_allclose(head.Q_rot, want["Q_rot"][h], rtol=0, atol=atol)
            np.testing.assert_allclose(head.K_rot, want["K_rot"][h], rtol=0, atol=atol)
        np.testing.assert_allclose(got.final, want["final"], rtol=0, atol=atol * 10)
    # float64: the two engines agree to rounding, head by head and intermediate by
    # intermediate
    ref = compute(s)
    got = compute_torch(s, "cpu", "float64")
    for mine, theirs in zip(got.heads, ref.heads, strict=True):
        for field in ("Q", "K", "Q_rot", "K_rot", "scores", "weights", "output"):
            np.testing.assert_allclose(getattr(mine, field), getattr(theirs, field), atol=1e-12)
    # the float32 run within the bounds the engine gives for rounding
    bound = tolerances(s, ref, "float32")
    got = compute_torch(s, "cpu", "float32")
    assert (np.abs(np.asarray(got.Q_rot) - np.asarray(ref.Q_rot)) <= bound["Q_rot"]).all()
    assert (np.abs(np.asarray(got.final) - np.asarray(ref.final)) <= bound["final"]).all()


@pytest.mark.parametrize("name", ["mha", "gqa-rope", "mqa-eps", "no-projections"])
def test_the_kv_cache_steps_are_the_by_hand_rows(name):
    s = CASES[name]
    want = by_hand(s)
    for step in KVCache.start(s):
        np.testing.assert_allclose(step.final, want["final"][step.t], rtol=0, atol=1e-12)
        assert step.max_diff <= 1e-12


@pytest.mark.parametrize("suffix", [".attn.json", ".attn.npz"])
def test_a_file_keeps_the_choice_and_the_weights(tmp_path, suffix):
    s = CASES["gqa-rope"]
    path = tmp_path / f"olmo{suffix}"
    save_scenario(path, s)
    back = load_scenario(path)
    assert back.settings.qk_norm == "rms-whole"
    for name in ("q_norm", "k_norm", "W_Q", "b_K"):
        np.testing.assert_array_equal(np.asarray(getattr(back, name)), np.asarray(getattr(s, name)))
    np.testing.assert_array_equal(compute(back).final, compute(s).final)


def test_a_file_says_version_5_and_an_older_version_is_refused_by_name(tmp_path):
    import json

    path = tmp_path / "olmo.attn.json"
    save_scenario(path, CASES["mha"])
    data = json.loads(path.read_text())
    assert data["version"] == 5  # an attnviz that reads version 4 says it is too new
    path.write_text(json.dumps({**data, "version": 4}))
    with pytest.raises(Exception, match=r"settings\.qk_norm 'rms-whole': needs version 5"):
        load_scenario(path)


def test_a_file_with_another_choice_is_refused_by_name(tmp_path):
    path = tmp_path / "bad.attn.json"
    save_scenario(path, CASES["mha"])
    path.write_text(path.read_text().replace('"rms-whole"', '"rms-all"'))
    with pytest.raises(Exception, match="rms-all"):
        load_scenario(path)


def test_an_edit_of_one_head_recomputes_every_head():
    s = CASES["gqa-rope"]
    edited = s.with_cells("W_Q", 0, 0, 0, np.array([[5.0]]))
    changes = changes_between(s, edited)
    assert changes.q_heads == set(range(s.n_heads))  # one head's Q feeds every head's RMS
    got = Plan(edited, Base(s, compute(s))).result()
    want = by_hand(edited)
    for h, head in enumerate(got.heads):
        np.testing.assert_allclose(head.Q_rot, want["Q_rot"][h], rtol=0, atol=1e-12)
    np.testing.assert_allclose(got.final, want["final"], rtol=0, atol=1e-12)
    # the same for a key head, and for a few rows of X
    edited = s.with_cells("b_K", 1, 0, 2, np.array([[-3.0]]))
    np.testing.assert_allclose(
        Plan(edited, Base(s, compute(s))).result().final, by_hand(edited)["final"], atol=1e-12
    )
    edited = s.with_cells("X", None, 2, 0, np.array([[4.0, -1.0]]))
    np.testing.assert_allclose(
        Plan(edited, Base(s, compute(s))).result().final, by_hand(edited)["final"], atol=1e-12
    )


@pytest.mark.parametrize("name", ["gqa-rope", "no-projections"])
def test_the_inspector_explains_the_whole_norm(name):
    s = CASES[name]
    r = compute(s)
    heads = s.n_heads if s.settings.projections else 1
    for field in ("Q_rot", "K_rot"):
        e = explain(s, r, field, heads - 1, 2, 1)
        assert math.isclose(e.value, getattr(r.heads[heads - 1], field)[2, 1], rel_tol=1e-13)
        assert "all heads" in e.formula
        # the mean square's terms: every head's features of the token
        width = (s.n_heads if field == "Q_rot" else s.kv_heads) * s.d_k
        squares = [term for term in e.terms if term.label.endswith("²")]
        assert len(squares) == (width if s.settings.projections else s.d_model)
    g = gradients(s)
    for field in ("dQ", "dK"):
        e = explain_gradient(s, r, g, field, heads - 1, 3, 1)
        assert e.value == g.matrix(field[1:], heads - 1)[3, 1]
        assert math.isclose(e.steps[-1].value, e.value, rel_tol=1e-12, abs_tol=1e-15)
        assert "every head" in e.note


def test_the_qk_norm_weights_stay_per_head():
    s = CASES["mha"]
    doubled = dataclasses.replace(
        s, q_norm=np.asarray(s.q_norm) * np.array([2.0, 1, 1, 1])[:, None, None]
    )
    a, b = compute(s), compute(doubled)
    np.testing.assert_allclose(b.heads[0].Q_rot, 2 * a.heads[0].Q_rot, rtol=1e-14)
    np.testing.assert_array_equal(b.heads[1].Q_rot, a.heads[1].Q_rot)
