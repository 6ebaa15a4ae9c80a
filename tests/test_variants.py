"""The building blocks of current attention variants against independent references:
complex numbers for RoPE, the ALiBi paper's slopes by hand, masks by hand and against
torch's lower-right causal bias, a softmax with the sink as an extra column; and the
engine, which composes them, against a plain loop, torch SDPA and flex_attention."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnviz.core.maths import variants as V
from attnviz.core.maths.forward import compute
from attnviz.core.maths.results import Result
from attnviz.core.maths.scenario import Scenario, Settings

RNG = np.random.default_rng(7)


def rope_by_complex(x: np.ndarray, positions, base: float, style: str, dims: int) -> np.ndarray:
    """Pairs as complex numbers a + ib, turned by multiplying with e^(iθ)."""
    out = x.copy()
    if style == "half":
        a, b = x[:, : dims // 2], x[:, dims // 2 : dims]
    else:
        a, b = x[:, 0:dims:2], x[:, 1:dims:2]
    theta = np.outer(positions, [base ** (-2 * k / dims) for k in range(dims // 2)])
    z = (a + 1j * b) * np.exp(1j * theta)
    if style == "half":
        out[:, : dims // 2], out[:, dims // 2 : dims] = z.real, z.imag
    else:
        out[:, 0:dims:2], out[:, 1:dims:2] = z.real, z.imag
    return out


@pytest.mark.parametrize("style", V.ROPE_STYLES)
@pytest.mark.parametrize("dims", [2, 4, 8])
def test_rope_turns_each_pair_as_a_complex_number(style, dims):
    x = RNG.normal(size=(5, 8))
    positions = np.arange(5) + 3
    got = V.rope(x, positions, base=100.0, style=style, dims=dims)
    np.testing.assert_allclose(got, rope_by_complex(x, positions, 100.0, style, dims), atol=1e-14)
    np.testing.assert_array_equal(got[:, dims:], x[:, dims:])  # the rest untouched
    # a rotation keeps each pair's length
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), np.linalg.norm(x, axis=1), rtol=1e-13)


def test_rope_of_many_positions_remembers_its_angles_only_for_those_positions():
    """Past a few positions the cos and sin are remembered (each edit of W_Q or W_K turns
    the same positions again): calls in any order, with the same or other positions,
    base, width and style, and on a stack of heads, each equal the complex product."""
    x = RNG.normal(size=(3, 40, 8))
    calls = [
        (np.arange(40), 100.0, "half", 8),
        (np.arange(40) + 7, 100.0, "half", 8),  # other positions
        (np.arange(40), 50.0, "half", 8),  # another base
        (np.arange(40), 100.0, "interleaved", 4),  # another style and width
        (np.arange(40), 100.0, "half", 8),  # the first again
    ]
    V._remembered_cos_sin.cache_clear()
    for positions, base, style, dims in calls:
        got = V.rope(x, positions, base=base, style=style, dims=dims)
        for h in range(3):
            want = rope_by_complex(x[h], positions, base, style, dims)
            np.testing.assert_allclose(got[h], want, atol=1e-14)
    assert V._remembered_cos_sin.cache_info().hits == 1  # the first again
    cos, _ = V._cos_sin(np.arange(40), 8, 100.0, None)
    assert not cos.flags.writeable  # shared between calls: nobody may change it
    # Positions that are not one run are turned, not remembered.
    scattered = np.array([0, 5, 2, 9, 1, 30, 31, 7, 8, 11])
    want = rope_by_complex(x[0, :10], scattered, 100.0, "half", 8)
    np.testing.assert_allclose(V.rope(x[0, :10], scattered, 100.0), want, atol=1e-14)
    assert V._remembered_cos_sin.cache_info().misses == 4


def test_rope_by_hand_for_one_pair():
    # One pair (1, 0) at position 2 with frequency 1 (dims 2): turned by 2 radians.
    got = V.rope(np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]]), np.arange(3))
    np.testing.assert_allclose(got[2], [math.cos(2), math.sin(2)], atol=1e-15)
    np.testing.assert_allclose(got[1], [-math.sin(1), math.cos(1)], atol=1e-15)
    np.testing.assert_array_equal(got[0], [1.0, 0.0])


@settings(max_examples=40, deadline=None)
@given(
    shift=st.integers(-50, 50),
    n=st.integers(1, 6),
    half_dims=st.integers(1, 4),
    style=st.sampled_from(V.ROPE_STYLES),
)
def test_rope_scores_depend_only_on_the_offset(shift, n, half_dims, style):
    d = 2 * half_dims
    rng = np.random.default_rng(n * 100 + d)
    q, k = rng.normal(size=(n, d)), rng.normal(size=(n, d))
    pos = np.arange(n)
    scores = V.rope(q, pos, style=style) @ V.rope(k, pos, style=style).T
    shifted = V.rope(q, pos + shift, style=style) @ V.rope(k, pos + shift, style=style).T
    np.testing.assert_allclose(shifted, scores, atol=1e-11)


def test_rope_refuses_odd_or_too_many_dims():
    with pytest.raises(ValueError, match="even"):
        V.rope(np.ones((2, 4)), np.arange(2), dims=3)
    with pytest.raises(ValueError, match="more than"):
        V.rope(np.ones((2, 4)), np.arange(2), dims=6)
    with pytest.raises(ValueError, match="style"):
        V.rope(np.ones((2, 4)), np.arange(2), style="spiral")


def test_alibi_slopes_by_hand():
    # The paper: 8 heads give 1/2, 1/4, …, 1/256.
    np.testing.assert_allclose(V.alibi_slopes(8), [2.0**-k for k in range(1, 9)], rtol=1e-15)
    # 4 heads: 2^(-2), 2^(-4), 2^(-6), 2^(-8).
    np.testing.assert_allclose(V.alibi_slopes(4), [2.0**-k for k in (2, 4, 6, 8)], rtol=1e-15)
    # 12 heads (BLOOM): the 8-head slopes, then 16-head slopes 2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5.
    want = [2.0**-k for k in range(1, 9)] + [2.0**-k for k in (0.5, 1.5, 2.5, 3.5)]
    np.testing.assert_allclose(V.alibi_slopes(12), want, rtol=1e-15)
    np.testing.assert_allclose(V.alibi_slopes(1), [2.0**-8], rtol=1e-15)


def test_alibi_bias_by_hand():
    got = V.alibi_bias(0.5, np.arange(3), np.arange(4))
    want = -0.5 * np.array([[0, 1, 2, 3], [1, 0, 1, 2], [2, 1, 0, 1]], float)
    np.testing.assert_array_equal(got, want)


def test_which_keys_a_query_sees_by_hand():
    t, f = True, False
    np.testing.assert_array_equal(V.visible(3, 3, "causal"), [[t, f, f], [t, t, f], [t, t, t]])
    # n = 2 queries over m = 4 keys.
    np.testing.assert_array_equal(V.visible(2, 4, "causal"), [[t, f, f, f], [t, t, f, f]])
    np.testing.assert_array_equal(
        V.visible(2, 4, "causal", alignment="bottom-right"), [[t, t, t, f], [t, t, t, t]]
    )
    np.testing.assert_array_equal(
        V.visible(4, 4, "sliding-window", window=2),
        [[t, f, f, f], [t, t, f, f], [f, t, t, f], [f, f, t, t]],
    )
    np.testing.assert_array_equal(V.visible(2, 3, "none"), np.ones((2, 3), bool))
    custom = np.array([[1, 0, 1], [0, 1, 0]])
    np.testing.assert_array_equal(V.visible(2, 3, "custom", custom=custom), custom == 1)
    with pytest.raises(ValueError, match="2×3"):
        V.visible(2, 3, "custom", custom=np.ones((3, 2)))
    with pytest.raises(ValueError, match="window"):
        V.visible(3, 3, "sliding-window", window=0)


def test_bottom_right_is_torchs_lower_right_causal_mask():
    torch = pytest.importorskip("torch")
    from torch.nn.attention.bias import causal_lower_right

    for n, m in ((2, 5), (3, 3), (1, 4)):
        bias = causal_lower_right(n, m)
        torch_mask = bias._materialize(torch.device("cpu")).numpy()
        np.testing.assert_array_equal(
            V.visible(n, m, "causal", alignment="bottom-right"), torch_mask
        )


def test_rms_norm_by_hand():
    x = np.array([[3.0, 4.0]])  # mean of squares 12.5
    np.testing.assert_allclose(V.rms_norm(x, eps=0.0), x / math.sqrt(12.5), rtol=1e-15)
    np.testing.assert_allclose(
        V.rms_norm(x, np.array([2.0, 0.5]), eps=0.5), x / math.sqrt(13.0) * [2.0, 0.5], rtol=1e-15
    )


def test_softcap_by_hand():
    got = V.softcap(np.array([0.0, 100.0, -100.0, 1e300]), 50.0)
    np.testing.assert_allclose(got, [0.0, 50 * math.tanh(2), -50 * math.tanh(2), 50.0], rtol=1e-15)
    with pytest.raises(ValueError):
        V.softcap(np.ones(2), 0.0)


def _ulps(got: np.ndarray, x: np.ndarray) -> np.ndarray:
    """How many units in the last place got is from tanh(x), computed in long double."""
    exact = np.tanh(x.astype(np.longdouble))
    unit = np.spacing(np.abs(exact.astype(np.float64))).astype(np.longdouble)
    return np.asarray(np.abs(got - exact) / np.maximum(unit, 5e-324), dtype=np.float64)


@pytest.mark.parametrize("spread", [1e-6, 0.01, 0.3, 1.0, 4.0, 12.0, 40.0])
def test_tanh_within_two_units_in_the_last_place(spread):
    x = RNG.normal(size=(3, 70, 300)) * spread  # more elements than a chunk, not a multiple
    x[0, 0, :9] = [0.0, 1 / 256, 1 / 512, -1 / 512, 3 / 512, 19.99, 20.0, 20.01, -7.5]
    ulps = _ulps(V.tanh(x), x)
    # (where long double is double, the reference is the C library's, itself 1.2 off)
    precise = np.finfo(np.longdouble).eps < np.finfo(np.float64).eps
    assert ulps.max() <= (2.0 if precise else 3.2), f"{ulps.max()} ulp at {x.flat[ulps.argmax()]!r}"
    assert ulps.mean() <= (0.5 if precise else 0.7)


def test_tanh_far_out_and_of_non_numbers():
    x = np.array([np.inf, -np.inf, 1e300, -1e300, 25.0, -20.5, 5e-324, np.nan])
    got = V.tanh(x)
    np.testing.assert_array_equal(got[:-2], [1.0, -1.0, 1.0, -1.0, 1.0, -1.0])
    assert got[-2] == 5e-324 and np.isnan(got[-1])


def test_tanh_in_place_and_of_a_strided_view():
    x = RNG.normal(size=(40, 600)) * 3
    before = x.copy()
    view = x[::2, 5:]  # not contiguous
    assert V.tanh(view, out=view) is view
    np.testing.assert_allclose(x[::2, 5:], np.tanh(before[::2, 5:]), rtol=4e-16, atol=0)
    untouched = np.ones(x.shape, dtype=bool)
    untouched[::2, 5:] = False
    np.testing.assert_array_equal(x[untouched], before[untouched])
    single = V.tanh(np.array(0.7))
    assert single.shape == () and single == pytest.approx(math.tanh(0.7), rel=4e-16)


@pytest.mark.parametrize("sink", [-3.0, 0.0, 2.5, 800.0])
def test_a_sink_is_an_extra_key_whose_weight_is_dropped(sink):
    scores = RNG.normal(size=(4, 5)) * 3
    scores[0, 2:] = -np.inf
    weights, share = V.softmax_with_sink(scores, sink)
    # Independent: softmax over the scores with the sink appended as a column.
    wide = np.concatenate([scores, np.full((4, 1), sink)], axis=1)
    wide = np.exp(wide - wide.max(axis=1, keepdims=True))
    wide /= wide.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(weights, wide[:, :5], atol=1e-15)
    np.testing.assert_allclose(share, wide[:, 5], atol=1e-15)
    np.testing.assert_allclose(weights.sum(axis=1) + share, 1.0, atol=1e-14)


def test_a_fully_masked_row_gives_its_weight_to_the_sink():
    weights, share = V.softmax_with_sink(np.full((1, 3), -np.inf), 0.0)
    np.testing.assert_array_equal(weights, [[0.0, 0.0, 0.0]])
    np.testing.assert_array_equal(share, [1.0])


# All of it together in the engine: against a plain loop, torch SDPA and flex_attention -


def loop_attention(Q, K, V_, scale, seen, cap=None, alibi=None, sinks=None):
    """One query head and one row at a time, as the brief writes it."""
    H, n, _ = Q.shape
    G = K.shape[0]
    out = np.zeros((H, n, V_.shape[2]))
    share = np.zeros((H, n))
    for h in range(H):
        g = h // (H // G)
        for i in range(n):
            logits = []
            for j in range(K.shape[1]):
                s = float(Q[h, i] @ K[g, j]) * scale
                if cap is not None:
                    s = cap * math.tanh(s / cap)
                if alibi is not None:
                    s += alibi[h, i, j]
                logits.append(s if seen[i, j] else -math.inf)
            top = max([*logits, sinks[h]] if sinks is not None else logits)
            top = 0.0 if top == -math.inf else top
            e = [math.exp(s - top) for s in logits]
            z = sum(e) + (math.exp(sinks[h] - top) if sinks is not None else 0.0)
            for j, ej in enumerate(e):
                out[h, i] += (ej / z if z else 0.0) * V_[g, j]
            if sinks is not None:
                share[h, i] = math.exp(sinks[h] - top) / z
    return out, share


def qkv(H, G, n, m, d, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(H, n, d)), rng.normal(size=(G, m, d)), rng.normal(size=(G, m, d))


def engine_on(Q, K, V_, **changes) -> Result:
    """The engine on a cross-attention scenario whose projections are exactly Q, K and V:
    X = [I_n | 0] and X_kv = [0 | I_m] pick the rows of W_Q = [Q; 0], W_K = [0; K] and
    W_V = [0; V] (products with 1 and 0 only, so nothing rounds)."""
    H, n, d = Q.shape
    G, m, _ = K.shape
    s = Scenario(
        tokens=tuple(f"q{i}" for i in range(n)),
        X=np.hstack([np.eye(n), np.zeros((n, m))]),
        kv_tokens=tuple(f"k{j}" for j in range(m)),
        X_kv=np.hstack([np.zeros((m, n)), np.eye(m)]),
        W_Q=np.concatenate([Q, np.zeros((H, m, d))], axis=1),
        W_K=np.concatenate([np.zeros((G, n, d)), K], axis=1),
        W_V=np.concatenate([np.zeros((G, n, d)), V_], axis=1),
        W_O=np.zeros((H * d, n + m)),
        settings=Settings(**changes),
    )
    result = compute(s)
    group = [V.kv_head_of(h, H, G) for h in range(H)]
    np.testing.assert_array_equal(result.Q, Q)
    np.testing.assert_array_equal(result.K, K[group])
    np.testing.assert_array_equal(result.V, V_[group])
    return result


@pytest.mark.parametrize(
    ("H", "G", "n", "m", "mask", "alignment"),
    [
        (4, 2, 5, 5, "causal", "top-left"),
        (6, 1, 3, 7, "causal", "bottom-right"),
        (2, 2, 6, 6, "sliding-window", "top-left"),
        (3, 3, 4, 6, "none", "top-left"),
    ],
)
def test_the_engine_matches_the_loop_with_every_part(H, G, n, m, mask, alignment):
    Q, K, V_ = qkv(H, G, n, m, 4)
    seen = V.visible(n, m, mask, window=2, alignment=alignment)
    slopes = V.alibi_slopes(H)
    offset = V.query_offset(n, m, alignment)
    alibi = np.stack([V.alibi_bias(a, np.arange(n) + offset, np.arange(m)) for a in slopes])
    sinks = np.linspace(-1.0, 1.0, H)
    where = {"mask": mask, "window": 2, "causal_alignment": alignment, "scale_value": 0.4}
    got = engine_on(Q, K, V_, **where, softcap=1.5, positional="alibi", sinks=tuple(sinks.tolist()))
    want, share = loop_attention(Q, K, V_, 0.4, seen, 1.5, alibi, sinks)
    np.testing.assert_allclose(got.output, want, atol=1e-13)
    np.testing.assert_allclose(got.sink, share, atol=1e-14)
    plain = engine_on(Q, K, V_, **where)
    np.testing.assert_allclose(plain.output, loop_attention(Q, K, V_, 0.4, seen)[0], atol=1e-13)
    np.testing.assert_array_equal(plain.sink, 0.0)


def test_the_engine_with_gqa_alibi_and_windows_is_torch_sdpa():
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    H, G, n, m, d = 8, 2, 6, 9, 16
    Q, K, V_ = qkv(H, G, n, m, d, seed=3)
    for mask, alignment in (("causal", "bottom-right"), ("sliding-window", "bottom-right")):
        seen = V.visible(n, m, mask, window=3, alignment=alignment)
        offset = V.query_offset(n, m, alignment)
        alibi = np.stack(
            [V.alibi_bias(a, np.arange(n) + offset, np.arange(m)) for a in V.alibi_slopes(H)]
        )
        got = engine_on(
            Q,
            K,
            V_,
            mask=mask,
            window=3,
            causal_alignment=alignment,
            positional="alibi",
            scale_value=0.125,
        ).output
        bias = torch.from_numpy(np.where(seen, alibi, -np.inf))[None]
        t = [torch.from_numpy(a)[None] for a in (Q, K, V_)]
        want = F.scaled_dot_product_attention(*t, attn_mask=bias, scale=0.125, enable_gqa=True)
        np.testing.assert_allclose(got, want[0].numpy(), atol=1e-13)


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_the_engine_with_a_soft_cap_is_flex_attention():
    torch = pytest.importorskip("torch")
    flex = pytest.importorskip("torch.nn.attention.flex_attention")
    H, G, n, d, cap = 4, 2, 5, 8, 1.2
    Q, K, V_ = qkv(H, G, n, n, d, seed=5)
    seen = torch.from_numpy(V.visible(n, n, "causal"))

    def score_mod(score, b, h, q_idx, kv_idx):
        capped = cap * torch.tanh(score / cap)
        return torch.where(seen[q_idx, kv_idx], capped, -float("inf"))

    t = [torch.from_numpy(a)[None] for a in (Q, K, V_)]
    want = flex.flex_attention(*t, score_mod=score_mod, scale=0.5, enable_gqa=True)
    got = engine_on(Q, K, V_, mask="causal", scale_value=0.5, softcap=cap).output
    np.testing.assert_allclose(got, want[0].numpy(), atol=1e-12)


def test_gqa_groups_by_hand():
    assert [V.kv_head_of(h, 8, 2) for h in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [V.kv_head_of(h, 4, 1) for h in range(4)] == [0, 0, 0, 0]
    assert [V.kv_head_of(h, 3, 3) for h in range(3)] == [0, 1, 2]
    with pytest.raises(ValueError, match="do not divide"):
        V.kv_head_of(0, 6, 4)
