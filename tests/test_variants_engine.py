"""The engine with what current models add (biases, GQA/MQA, cross-attention, QK-norm,
RoPE, ALiBi, soft-cap, sinks, scale_value, causal alignment, sliding-window and custom
masks), alone and together, against a plain reference written here from the spec's order
of operations; one head and the layer against compute; torch's own
attention through cross_check; and the Scenario helpers and messages for these fields.

The reference (variant_reference.py) shares no code with attnviz: loops over heads, rows
and pairs.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import reference as plain
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scenario_strategies import SHAPES, VARIANTS, make, scenarios
from variant_reference import (
    FIELDS,
    assert_close,
    assert_matches_reference,
    paper_slopes,
)

from attnviz.core.figures.figure import spec_for
from attnviz.core.maths import forward as engine
from attnviz.core.maths import scoring
from attnviz.core.maths.results import Stages
from attnviz.core.maths.reuse import Base, Plan
from attnviz.core.maths.scenario import (
    Scenario,
    ScenarioError,
    Settings,
    from_heads,
    insert_token,
    move_token,
    permute_tokens,
    remove_token,
    resized,
    with_cross_attention,
    with_kv_heads,
)
from attnviz.core.maths.streaming import layer

RANDOM = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# Scenarios -----------------------------------------------------------------------------


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("variant", VARIANTS)
def test_each_variant_and_shape_matches_the_reference(variant, shape):
    s = make(**SHAPES[shape], **VARIANTS[variant])
    assert_matches_reference(s)


def test_an_odd_d_k_turns_all_but_its_last_feature():
    s = make(d_k=5, positional="rope")
    assert_matches_reference(s)
    Q = engine.compute(s).heads[0]
    np.testing.assert_array_equal(Q.Q_rot[:, 4], Q.Q[:, 4])


# Hand-checked cases --------------------------------------------------------------------


def identity_heads(d: int, H: int = 1, G: int = 1) -> dict[str, np.ndarray]:
    eye = np.eye(d)
    return {
        "W_Q": np.stack([eye] * H),
        "W_K": np.stack([eye] * G),
        "W_V": np.stack([eye] * G),
        "W_O": np.zeros((H * d, d)),
    }


@pytest.mark.parametrize(
    ("style", "x", "turned"),
    [
        # half: pairs (0, 2) and (1, 3); interleaved: (0, 1) and (2, 3)
        ("half", [0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0]),
        ("half", [0.0, 0.0, 0.0, 2.0], [0.0, -2.0, 0.0, 0.0]),
        ("interleaved", [0.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 1.0]),
        ("interleaved", [0.0, 0.0, 0.0, 3.0], [0.0, 0.0, -3.0, 0.0]),
    ],
)
def test_rope_turns_a_known_vector_by_ninety_degrees(style, x, turned):
    # d_k 4, base (4/π)²: the second pair turns by base^(−2/4) = π/4 per position, so by
    # 90° at position 2; the first pair (here zero) by 1 radian per position.
    base = (4 / math.pi) ** 2
    st_ = Settings(positional="rope", rope_style=style, rope_base=base, mask="none")
    X = np.array([[0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0], x])
    s = Scenario(tokens=("a", "b", "c"), X=X, settings=st_, **identity_heads(4))
    head = engine.compute(s).heads[0]
    np.testing.assert_allclose(head.Q_rot[2], turned, atol=1e-15)
    np.testing.assert_allclose(head.K_rot[2], turned, atol=1e-15)
    np.testing.assert_array_equal(head.Q[2], x)  # Q itself is not turned
    # The same query alone over three keys, bottom-right: at position 2 again.
    cross = Scenario(
        tokens=("c",),
        X=np.array([x]),
        kv_tokens=("a", "b", "c"),
        X_kv=X,
        settings=st_.replace(causal_alignment="bottom-right"),
        **identity_heads(4),
    )
    np.testing.assert_allclose(engine.compute(cross).heads[0].Q_rot[0], turned, atol=1e-15)


def test_rope_scores_depend_on_the_distance_only():
    s = make(n=5, positional="rope", mask="none", biases=False)
    X = np.repeat(s.X[:1], 5, axis=0)  # the same token everywhere
    scores = engine.compute(dataclasses.replace(s, X=X)).scores
    for k in range(-4, 5):  # constant along each diagonal
        diagonal = np.diagonal(scores, offset=k, axis1=1, axis2=2)
        np.testing.assert_allclose(diagonal, diagonal[:, :1] * np.ones_like(diagonal), atol=1e-12)


def test_mqa_is_one_key_value_head_repeated():
    mqa = make(H=4, G=1, seed=3, positional="rope", qk_norm="rms", sinks=(0.0, 1.0, -1.0, 2.0))
    kv = ("W_K", "W_V", "b_K", "b_V", "k_norm")
    mha = dataclasses.replace(
        mqa, **{name: np.repeat(getattr(mqa, name), 4, axis=0) for name in kv}
    )
    assert (mqa.kv_heads, mha.kv_heads) == (1, 4)
    a, b = engine.compute(mqa), engine.compute(mha)
    for name in ("Q", "K", "V", "Q_rot", "K_rot", "weights", "output"):
        np.testing.assert_allclose(getattr(a, name), getattr(b, name), rtol=1e-14, atol=1e-15)
    np.testing.assert_allclose(a.final, b.final, rtol=1e-13, atol=1e-14)
    # every query head reads the one key/value head
    for h in range(4):
        np.testing.assert_array_equal(a.heads[h].K, a.heads[0].K)
    # and with_kv_heads makes the repeated form itself
    c = engine.compute(with_kv_heads(mqa, 4))
    np.testing.assert_allclose(c.output, a.output, rtol=1e-14, atol=1e-15)


def test_gqa_groups_query_heads_in_order():
    s = make(H=6, G=3, seed=4)
    r = engine.compute(s)
    for h in range(6):
        g = h // 2  # ⌊h·G/H⌋
        np.testing.assert_allclose(r.heads[h].K, s.X @ s.W_K[g] + s.b_K[g], rtol=1e-14)
        np.testing.assert_allclose(r.heads[h].V, s.X @ s.W_V[g] + s.b_V[g], rtol=1e-14)


def test_a_very_negative_sink_is_no_sink():
    s = make(seed=5, mask="causal")
    sunk = s.with_settings(sinks=(-1e4,) * 4)
    a, b = engine.compute(s), engine.compute(sunk)
    np.testing.assert_array_equal(b.weights, a.weights)
    np.testing.assert_array_equal(b.output, a.output)
    np.testing.assert_array_equal(b.sink, 0.0)
    np.testing.assert_array_equal(b.row_sum, a.row_sum)
    np.testing.assert_allclose(b.entropy, a.entropy, atol=1e-13)


def test_a_sink_by_hand():
    # Scores all 0 over two visible keys with sink ln 2: weights 1/4, 1/4, sink 1/2.
    X = np.array([[1.0, 0.0], [0.0, 1.0]])
    heads = identity_heads(2)
    heads["W_Q"] = np.zeros((1, 2, 2))
    s = Scenario(
        tokens=("a", "b"),
        X=X,
        settings=Settings(mask="none", sinks=(math.log(2.0),)),
        **heads,
    )
    head = engine.compute(s).heads[0]
    np.testing.assert_allclose(head.weights, 0.25, rtol=1e-15)
    np.testing.assert_allclose(head.sink, 0.5, rtol=1e-15)
    np.testing.assert_allclose(head.row_sum, 0.5, rtol=1e-15)
    np.testing.assert_allclose(head.output, [[0.25, 0.25]] * 2, rtol=1e-15)
    np.testing.assert_allclose(head.entropy, [1.5 * math.log(2.0)] * 2, rtol=1e-14)


def test_softcap_limits():
    s = make(seed=6, mask="none", biases=False)
    s = dataclasses.replace(s, X=s.X * 30)  # scores in the hundreds
    plain_result = engine.compute(s)
    assert np.abs(plain_result.scaled).max() > 50
    capped = engine.compute(s.with_settings(softcap=5.0))
    assert np.abs(capped.scaled).max() <= 5.0  # tanh rounds to ±1 far out
    np.testing.assert_allclose(capped.scaled, 5.0 * np.tanh(plain_result.scaled / 5.0), rtol=1e-15)
    np.testing.assert_array_equal(capped.scores, plain_result.scores)  # caps after scaling
    # a cap far above the scores changes them by (s/c)²/3 of themselves: nothing visible
    loose = engine.compute(s.with_settings(softcap=1e9))
    np.testing.assert_allclose(loose.scaled, plain_result.scaled, rtol=1e-9)
    np.testing.assert_allclose(loose.weights, plain_result.weights, atol=1e-4)
    # the smallest cap allowed flattens every row: uniform weights (±1e-6 scores)
    tight = engine.compute(s.with_settings(softcap=1e-6))
    np.testing.assert_allclose(tight.weights, 1.0 / s.n, rtol=1e-5)
    with pytest.raises(ScenarioError, match="softcap"):  # smaller ones overflow s / cap
        s.with_settings(softcap=1e-9)


def test_alibi_by_hand():
    # Zero queries: every score 0, so the scaled score is the ALiBi bias −slope·|i − j|.
    # Two heads: slopes 2^-4 and 2^-8 (the paper's rule for a power of two).
    heads = identity_heads(2, H=2, G=2)
    heads["W_Q"] = np.zeros((2, 2, 2))
    s = Scenario(
        tokens=("a", "b", "c"),
        X=np.eye(3, 2),
        settings=Settings(positional="alibi", mask="causal"),
        **heads,
    )
    r = engine.compute(s)
    distance = np.array([[0, 1, 2], [1, 0, 1], [2, 1, 0]], dtype=float)
    for h, slope in enumerate((2.0**-4, 2.0**-8)):
        np.testing.assert_allclose(r.heads[h].scaled, -slope * distance, rtol=1e-15)
        # the last row: weights ∝ e^(−2s), e^(−s), 1
        e = np.exp(-slope * np.array([2.0, 1.0, 0.0]))
        np.testing.assert_allclose(r.heads[h].weights[2], e / e.sum(), rtol=1e-14)
    # three heads (BLOOM): the two-head slopes, then the first of four's every other: 2^-2
    s3 = resized(s, heads=3, kv_heads=1)
    r3 = engine.compute(s3)
    for h, slope in enumerate((2.0**-4, 2.0**-8, 2.0**-2)):
        np.testing.assert_allclose(r3.heads[h].scaled, -slope * distance, rtol=1e-14)


def test_qk_norm_by_hand():
    # Q row (3, 4): mean of squares 12.5; with eps 0.5 the norm is √13; weights (2, 0.5).
    X = np.array([[3.0, 4.0]])
    s = Scenario(
        tokens=("a",),
        X=X,
        q_norm=np.array([[[2.0, 0.5]]]),
        settings=Settings(qk_norm="rms", qk_norm_eps=0.5),
        **identity_heads(2),
    )
    head = engine.compute(s).heads[0]
    np.testing.assert_allclose(head.Q_rot[0], [6 / math.sqrt(13), 2 / math.sqrt(13)], rtol=1e-15)
    np.testing.assert_allclose(head.K_rot[0], [3 / math.sqrt(13), 4 / math.sqrt(13)], rtol=1e-15)
    np.testing.assert_array_equal(head.Q[0], [3.0, 4.0])


def test_biases_and_scale_value_by_hand():
    X = np.array([[1.0, 0.0], [0.0, 1.0]])
    s = Scenario(
        tokens=("a", "b"),
        X=X,
        b_Q=np.array([[[1.0, 0.0]]]),
        b_K=np.array([[[0.0, 2.0]]]),
        b_V=np.array([[[5.0, 5.0]]]),
        b_O=np.array([[0.5, -0.5]]),
        settings=Settings(mask="none", scale_value=0.25),
        **{**identity_heads(2), "W_O": np.eye(2)},
    )
    head = engine.compute(s).heads[0]
    np.testing.assert_array_equal(head.Q, [[2.0, 0.0], [1.0, 1.0]])
    np.testing.assert_array_equal(head.K, [[1.0, 2.0], [0.0, 3.0]])
    np.testing.assert_array_equal(head.V, [[6.0, 5.0], [5.0, 6.0]])
    np.testing.assert_array_equal(head.scores, [[2.0, 0.0], [3.0, 3.0]])
    np.testing.assert_array_equal(head.scaled, [[0.5, 0.0], [0.75, 0.75]])
    result = engine.compute(s)
    np.testing.assert_allclose(result.final, result.concat + np.array([0.5, -0.5]), rtol=1e-15)
    assert result.biases == ("b_Q", "b_K", "b_V", "b_O")


def test_cross_attention_bottom_right_by_hand():
    s = make(n=2, m=4, H=2, G=1, causal_alignment="bottom-right")
    t, f = True, False
    np.testing.assert_array_equal(~engine.compute(s).future, [[t, t, t, f], [t, t, t, t]])
    top_left = engine.compute(s.with_settings(causal_alignment="top-left"))
    np.testing.assert_array_equal(~top_left.future, [[t, f, f, f], [t, t, f, f]])
    assert_matches_reference(s)


def test_an_empty_row_is_flagged_unless_a_sink_takes_it():
    s = make(n=3, H=2, G=1, mask="custom")
    mask = np.array([[1.0, 0.0, 0.0], [0.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    s = dataclasses.replace(s, mask_matrix=mask)
    r = engine.compute(s)
    np.testing.assert_array_equal(r.empty_rows[:, 1], True)
    np.testing.assert_array_equal(r.empty_rows[:, [0, 2]], False)
    np.testing.assert_array_equal(r.weights[:, 1], 0.0)
    np.testing.assert_array_equal(r.output[:, 1], 0.0)
    np.testing.assert_array_equal(r.entropy[:, 1], 0.0)
    assert np.isfinite(r.final).all()
    sunk = engine.compute(s.with_settings(sinks=(0.0, -3.0)))
    np.testing.assert_array_equal(sunk.empty_rows, False)
    np.testing.assert_array_equal(sunk.sink[:, 1], 1.0)  # all of the row's weight
    np.testing.assert_array_equal(sunk.weights[:, 1], 0.0)
    assert_matches_reference(s)
    assert_matches_reference(s.with_settings(sinks=(0.0, -3.0)))


def test_the_worked_example_with_neutral_extras_is_the_brief():
    s = from_heads(
        ("she", "saw", "the", "cat"),
        plain.X,
        [
            {"W_Q": plain.W_Q[h], "W_K": plain.W_K[h], "W_V": plain.W_V[h], "b_Q": [0, 0]}
            for h in range(2)
        ],
        plain.W_O,
        Settings(qk_norm="none", scale_value=None, sinks=None),
        b_O=[0, 0, 0, 0],
    )
    weights, _, final = plain.multi_head(plain.X, plain.W_Q, plain.W_K, plain.W_V, plain.W_O)
    r = engine.compute(s)
    np.testing.assert_allclose(r.weights, weights, rtol=1e-14)
    np.testing.assert_allclose(r.final, final, rtol=1e-14)
    assert r.biases == ()


# Random shapes and combinations --------------------------------------------------------


@RANDOM
@given(s=scenarios())
def test_random_combinations_match_the_reference(s):
    assert_matches_reference(s)


@RANDOM
@given(s=scenarios(), data=st.data())
def test_one_head_and_the_layer_equal_compute(s, data):
    full = engine.compute(s)
    h = data.draw(st.integers(0, full.n_heads - 1))
    alone = engine.one_head(s, h)
    assert alone.index == h and alone.n_heads == full.n_heads
    # bit for bit, as one_head promises, except where a product is matrix × vector: see
    # test_one_head_is_bit_for_bit_with_a_single_token_or_d_k_1
    exact = not (s.settings.projections and min(s.n, s.m, s.d_k) == 1)
    for got in (alone.one, engine.compute_head(s, h)):
        for name in (*FIELDS, "empty_rows"):
            a, b = getattr(got, name), getattr(full.heads[h], name)
            if exact or name == "empty_rows":
                np.testing.assert_array_equal(a, b, err_msg=name)
            else:
                assert_close(a, b, name)
    whole = layer(s, block=data.draw(st.integers(1, 4)))
    assert whole.heads == ()
    np.testing.assert_allclose(whole.concat, full.concat, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(whole.final, full.final, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("mask", ["causal", "sliding-window", "custom", "none"])
@pytest.mark.parametrize("extras", [{}, {"sinks": (0.5, -1.0), "dropout": 0.2}])
@pytest.mark.parametrize("m", [None, 150, 420])
def test_past_a_block_of_rows_each_block_is_multiplied_by_the_keys_it_sees(mask, extras, m):
    """With more query rows than one softmax block, weights · V is taken a block of rows
    at a time, up to the last key a row of the block sees: compute, one_head, layer and
    an edit of W_V (the weights kept, times the new V) all equal the reference; also with
    fewer or more keys than queries (bottom-right), and under a custom mask whose first
    block of rows sees no key at all and whose later blocks stop at different keys."""
    n = scoring.SOFTMAX_ROWS * 2 + 44
    keys = n if m is None else m
    s = make(
        n=n, m=m, d_model=6, H=2, G=1, d_k=3, mask=mask, window=40, **extras,
        causal_alignment="top-left" if m is None else "bottom-right",
    )  # fmt: skip
    if mask == "custom":
        rng = np.random.default_rng(1)
        seen = np.tril(rng.random((n, keys)) < 0.8, k=keys - n - 30)  # ends 30 keys early
        seen[: scoring.SOFTMAX_ROWS] = False  # a whole block of rows that sees nothing
        s = dataclasses.replace(s, mask_matrix=seen.astype(float))
        ends = scoring.Rule.of(s).ends
        assert ends[: scoring.SOFTMAX_ROWS].max() == 0 and ends[-1] < keys
    full = engine.compute(s)
    assert_matches_reference(s, full)
    for h in range(2):
        np.testing.assert_allclose(
            engine.one_head(s, h).one.output, full.heads[h].output, rtol=1e-12, atol=1e-14
        )
    np.testing.assert_allclose(layer(s, block=100).concat, full.concat, rtol=1e-12, atol=1e-13)
    edited = s.with_cells("W_V", 0, 2, 1, [[1.5]])
    assert_matches_reference(edited, Plan(edited, Base(s, full)).result())


def test_alibi_under_cross_attention_gives_the_reference():
    """ALiBi's −slope·|i − j| with the queries from m − n: compute, layer and an X edit
    made from the result before all equal the reference; the term a view shows is the
    paper's slope times the distance."""
    s = make(n=30, m=40, d_model=6, H=4, G=2, d_k=3, positional="alibi",
             causal_alignment="bottom-right")  # fmt: skip
    full = engine.compute(s)
    assert_matches_reference(s, full)
    np.testing.assert_allclose(layer(s, block=7).final, full.final, rtol=1e-12, atol=1e-13)
    edited = s.with_cells("X", None, 4, 2, [[1.5]])
    assert_matches_reference(edited, Plan(edited, Base(s, full)).result())
    rule = full.heads[0].rule
    term = rule.alibi(2)
    assert not term.flags.writeable
    i, j = np.arange(30)[:, None] + 10, np.arange(40)[None, :]  # queries from m − n = 10
    np.testing.assert_array_equal(term, -paper_slopes(4)[2] * np.abs(i - j))


@pytest.mark.parametrize(
    ("n", "d_k"),
    [
        (1, 3),
        (3, 1),
        pytest.param(
            12,
            1,
            marks=pytest.mark.xfail(
                strict=True,
                reason="with d_k = 1 one head's X @ W_Q is a matrix-vector product, which "
                "OpenBLAS sums in another order than the product with every head's W_Q side "
                "by side: Q (and all after it) can differ in the last bit (up to 8 tokens "
                "are projected head by head, so there both agree)",
            ),
        ),
    ],
)
def test_one_head_is_bit_for_bit_with_a_single_token_or_d_k_1(n, d_k):
    for seed in range(10):
        s = make(n=n, d_model=4, H=4, G=2, d_k=d_k, seed=seed, biases=False, norms=False)
        full = engine.compute(s)
        for h in range(4):
            np.testing.assert_array_equal(engine.compute_head(s, h).Q, full.heads[h].Q)


def expected_reference(s: Scenario) -> str:
    st_ = s.settings
    if st_.dropout > 0 or st_.mask in ("causal-zero", "drop-after-softmax"):
        return ""
    return "flex_attention" if st_.softcap is not None else "SDPA"


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("variant", VARIANTS)
def test_cross_check_every_variant(variant):
    pytest.importorskip("torch")
    from attnviz.core.maths.torch_engine import cross_check

    s = make(n=3, m=5, H=4, G=2, **VARIANTS[variant])
    check = cross_check(s)
    assert check.ok, check.culprit
    assert check.reference == expected_reference(s)
    if check.reference:
        assert check.sdpa_diff is not None and check.sdpa_diff < 1e-12


@pytest.mark.filterwarnings("ignore::UserWarning")
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(s=scenarios())
def test_cross_check_random_combinations(s):
    pytest.importorskip("torch")
    from attnviz.core.maths.torch_engine import cross_check

    check = cross_check(s)
    assert check.ok, check.culprit
    assert check.reference == expected_reference(s)


def test_torch_float32_is_close_with_everything():
    pytest.importorskip("torch")
    from attnviz.core.maths.torch_engine import cross_check

    check = cross_check(make(n=3, m=5, **VARIANTS["everything-rope"]), dtype="float32")
    assert check.ok, check.culprit
    assert check.reference == "flex_attention"


# The Scenario helpers -------------------------------------------------------------------


def test_resized_with_kv_heads_and_m():
    s = make(n=3, m=4, H=4, G=2, sinks=(1.0, 2.0, 3.0, 4.0), positional="rope", rope_dims=4)
    fewer = resized(s, kv_heads=1)
    assert (fewer.n_heads, fewer.kv_heads) == (4, 1)
    np.testing.assert_array_equal(fewer.W_K[0], s.W_K[0])
    np.testing.assert_array_equal(fewer.k_norm[0], s.k_norm[0])
    # without kv_heads: the count is kept while it divides the heads, else the gcd
    assert resized(s, heads=6).kv_heads == 2
    assert resized(s, heads=3).kv_heads == 1
    assert resized(make(H=3, G=3), heads=5).kv_heads == 5  # one each: follows the heads
    grown = resized(s, heads=6, d_k=5)
    assert grown.settings.sinks == (1.0, 2.0, 3.0, 4.0, 0.0, 0.0)
    np.testing.assert_array_equal(grown.q_norm[4:], 1.0)  # new norm weights are neutral
    np.testing.assert_array_equal(grown.q_norm[:4, :, 4], 1.0)
    np.testing.assert_array_equal(grown.b_Q[4:], 0.0)
    np.testing.assert_array_equal(grown.q_norm[:4, :, :4], s.q_norm)
    assert resized(s, d_k=2).settings.rope_dims is None  # 4 no longer fits
    with pytest.raises(ScenarioError, match="kv_heads: 5"):
        resized(s, kv_heads=5)

    more = resized(s, m=6)
    assert (more.n, more.m) == (3, 6)
    assert more.kv_tokens == (*s.kv_tokens, "k5", "k6")
    np.testing.assert_array_equal(more.X_kv[:4], s.X_kv)
    np.testing.assert_array_equal(more.X_kv[4:], 0.0)
    assert resized(s, m=2).kv_tokens == s.kv_tokens[:2]
    assert resized(s, n=5).m == 4  # queries and keys resize apart under cross-attention


def test_resized_keeps_a_custom_mask_and_makes_new_cells_causal():
    s = make(n=3, m=3, H=2, G=1, mask="custom")
    mask = np.array([[0.0, 1.0, 1.0], [1.0, 0.0, 1.0], [1.0, 1.0, 0.0]])
    s = dataclasses.replace(s, mask_matrix=mask)
    big = resized(s, m=5, n=4)
    want = np.array(
        [
            [0, 1, 1, 0, 0],
            [1, 0, 1, 0, 0],
            [1, 1, 0, 0, 0],
            [1, 1, 1, 1, 0],  # a new query: causal, top-left
        ],
        dtype=float,
    )
    np.testing.assert_array_equal(big.mask_matrix, want)
    assert_matches_reference(big)


def test_with_kv_heads_keeps_each_groups_first_head():
    s = make(H=4, G=4, seed=9)
    two = with_kv_heads(s, 2)
    assert two.kv_heads == 2
    for name in ("W_K", "W_V", "b_K", "b_V", "k_norm"):
        np.testing.assert_array_equal(getattr(two, name), getattr(s, name)[[0, 2]], name)
    # query heads 0 and 2 read the same keys as before
    before, after = engine.compute(s), engine.compute(two)
    for h in (0, 2):
        np.testing.assert_array_equal(after.heads[h].weights, before.heads[h].weights)
    back = with_kv_heads(two, 4)
    for name in ("W_K", "b_V"):
        np.testing.assert_array_equal(getattr(back, name), getattr(two, name)[[0, 0, 1, 1]])
    assert with_kv_heads(s, 4) is s
    with pytest.raises(ScenarioError, match="kv_heads: 3 does not divide 4"):
        with_kv_heads(s, 3)


def test_with_cross_attention_on_and_off():
    s = make(n=4, H=2, G=1, mask="custom", positional="rope")
    mask = np.tril(np.ones((4, 4)))
    mask[3, 0] = 0.0
    s = dataclasses.replace(s, mask_matrix=mask)
    on = with_cross_attention(s, True)
    assert on.cross and on.kv_tokens == s.tokens and on.m == 4
    np.testing.assert_array_equal(on.X_kv, s.X)
    np.testing.assert_array_equal(on.mask_matrix, mask)
    a, b = engine.compute(s), engine.compute(on)
    np.testing.assert_array_equal(b.output, a.output)  # keys are the same tokens
    np.testing.assert_array_equal(b.final, a.final)
    assert with_cross_attention(on, True) is on
    # more keys, then back: the mask is cropped to n × n
    wide = resized(on, m=6)
    off = with_cross_attention(wide, False)
    assert not off.cross and off.kv_tokens is None and off.m == 4
    np.testing.assert_array_equal(off.mask_matrix, mask)
    assert_matches_reference(wide)


def test_token_edits_keep_a_custom_mask_in_step():
    s = make(n=4, H=2, G=1, mask="custom")
    mask = np.array(
        [[1, 0, 1, 0], [0, 1, 0, 1], [1, 1, 0, 0], [0, 0, 1, 1]],
        dtype=float,
    )
    s = dataclasses.replace(s, mask_matrix=mask)
    bigger = insert_token(s, 1, "new", np.ones(s.d_model))
    assert bigger.tokens[1] == "new" and bigger.mask_matrix.shape == (5, 5)
    np.testing.assert_array_equal(np.delete(np.delete(bigger.mask_matrix, 1, 0), 1, 1), mask)
    np.testing.assert_array_equal(bigger.mask_matrix[1], [1, 1, 0, 0, 0])  # causal row
    np.testing.assert_array_equal(bigger.mask_matrix[:, 1], [0, 1, 1, 1, 1])  # causal column
    assert_matches_reference(bigger)

    smaller = remove_token(s, 2)
    np.testing.assert_array_equal(smaller.mask_matrix, np.delete(np.delete(mask, 2, 0), 2, 1))

    order = [2, 0, 3, 1]
    moved = permute_tokens(s, order)
    np.testing.assert_array_equal(moved.mask_matrix, mask[np.ix_(order, order)])
    # permuting tokens and mask together permutes the output rows (no positions in use)
    np.testing.assert_allclose(
        engine.compute(moved).final, engine.compute(s).final[order], rtol=1e-13, atol=1e-14
    )
    shifted = move_token(s, 0, 3)
    np.testing.assert_array_equal(shifted.mask_matrix, mask[np.ix_([1, 2, 3, 0], [1, 2, 3, 0])])


def test_token_edits_under_cross_attention_change_the_queries_only():
    s = make(n=3, m=5, H=2, G=1, mask="custom")
    mask = (np.arange(15).reshape(3, 5) % 2).astype(float)
    s = dataclasses.replace(s, mask_matrix=mask)
    bigger = insert_token(s, 0)
    assert (bigger.n, bigger.m) == (4, 5)
    np.testing.assert_array_equal(bigger.mask_matrix[1:], mask)
    np.testing.assert_array_equal(bigger.mask_matrix[0], [1, 0, 0, 0, 0])
    np.testing.assert_array_equal(remove_token(s, 1).mask_matrix, mask[[0, 2]])
    np.testing.assert_array_equal(permute_tokens(s, [2, 0, 1]).mask_matrix, mask[[2, 0, 1]])


def test_an_inserted_query_follows_the_bottom_right_alignment():
    s = make(n=2, m=4, H=1, G=1, mask="custom", causal_alignment="bottom-right")
    # the default custom mask is the causal one for this alignment
    np.testing.assert_array_equal(s.mask_matrix, [[1, 1, 1, 0], [1, 1, 1, 1]])
    # as resized makes a new query row (the last, at key position 3): see every key
    np.testing.assert_array_equal(resized(s, n=3).mask_matrix[2], [1, 1, 1, 1])
    # a query inserted last sits at key position 3 too, and should see every key
    np.testing.assert_array_equal(insert_token(s, 2).mask_matrix[2], [1, 1, 1, 1])
    # inserted first, at key position 1 (offset m − n = 4 − 3): keys 0 and 1; the
    # other rows keep their cells
    first = insert_token(s, 0).mask_matrix
    np.testing.assert_array_equal(first, [[1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]])
    assert_matches_reference(insert_token(s, 0))


# Clear messages for bad input -------------------------------------------------------------


def test_bad_input_names_the_field():
    s = make(n=3, H=4, G=2, d_k=4)
    with pytest.raises(ScenarioError, match="kv_heads: 3 key/value heads do not divide 4"):
        dataclasses.replace(
            s, W_K=np.zeros((3, 5, 4)), W_V=np.zeros((3, 5, 4)), b_K=None, b_V=None, k_norm=None
        )
    with pytest.raises(ScenarioError, match=r"settings\.sinks: 3 numbers for 4 query heads"):
        s.with_settings(sinks=(0.0, 1.0, 2.0))
    with pytest.raises(ScenarioError, match=r"settings\.alibi_slopes: 2 numbers for 4"):
        s.with_settings(alibi_slopes=(0.5, 0.25))
    with pytest.raises(ScenarioError, match=r"settings\.sinks\[2\]"):
        Settings(sinks=(0.0, float("inf")))
    with pytest.raises(ScenarioError, match=r"settings\.rope_dims: expected an even"):
        Settings(rope_dims=3)
    with pytest.raises(ScenarioError, match=r"settings\.rope_dims: 6 is more than d_k 4"):
        s.with_settings(rope_dims=6)
    with pytest.raises(
        ScenarioError, match=r"settings\.mask_matrix\[1,2\]: .*0\.5.* is not 0 or 1"
    ):
        dataclasses.replace(s.with_settings(mask="custom"), mask_matrix=np.array([[1, 0.5, 0]] * 3))
    with pytest.raises(ScenarioError, match=r"settings\.mask_matrix: expected 3×3"):
        dataclasses.replace(s.with_settings(mask="custom"), mask_matrix=np.ones((3, 2)))
    with pytest.raises(ScenarioError, match="mask_matrix: a cell is 0"):
        s.with_settings(mask="custom").with_cells("mask_matrix", None, 0, 0, [[2.0]])
    with pytest.raises(ScenarioError, match="X_kv: expected rows of d_model 5, got 2×4"):
        dataclasses.replace(s, kv_tokens=("a", "b"), X_kv=np.zeros((2, 4)))
    with pytest.raises(ScenarioError, match="X_kv: cross-attention needs both"):
        dataclasses.replace(s, kv_tokens=("a", "b"))
    with pytest.raises(ScenarioError, match="X_kv: cross-attention needs both"):
        dataclasses.replace(s, X_kv=np.zeros((2, 5)))
    with pytest.raises(ScenarioError, match=r"kv_tokens: 1 labels for 2 rows of X_kv"):
        dataclasses.replace(s, kv_tokens=("a",), X_kv=np.zeros((2, 5)))
    with pytest.raises(ScenarioError, match=r"heads\[1\]\.b_Q: expected length 4, got length 3"):
        dataclasses.replace(s, b_Q=np.zeros((4, 1, 3)))
    with pytest.raises(ScenarioError, match="b_O: expected length 5"):
        dataclasses.replace(s, b_O=np.zeros((1, 4)))
    with pytest.raises(ScenarioError, match=r"heads\[2\]\.b_K\[1,3\]: nan"):
        s.with_cells("b_K", 1, 0, 2, [[float("nan")]])
    for name, value in (
        ("causal_alignment", "middle"),
        ("rope_style", "spiral"),
        ("qk_norm", "layer"),
    ):
        with pytest.raises(ScenarioError, match=f"settings.{name}"):
            Settings(**{name: value})
    for name in ("softcap", "scale_value", "rope_base", "qk_norm_eps"):
        with pytest.raises(ScenarioError, match=f"settings.{name}"):
            Settings(**{name: 0.0})


def test_a_mask_cell_that_is_not_0_or_1_is_printed_as_a_number():
    s = make(n=2, H=1, G=1, mask="custom")
    with pytest.raises(ScenarioError) as caught:
        dataclasses.replace(s, mask_matrix=np.array([[1.0, 0.5], [1.0, 1.0]]))
    assert str(caught.value) == "settings.mask_matrix[1,2]: 0.5 is not 0 or 1"


def _nice(top: float) -> float:
    """The smallest of 1, 1.5, 2, 2.5, 3, 4, 5, 6, 8 × 10^k that is at least top, less a
    relative 1e-12 (a top a rounding above 0.1, as a soft-cap of 0.1 gives, keeps 0.1)."""
    steps = (1, 1.5, 2, 2.5, 3, 4, 5, 6, 8)
    floor = top * (1 - 1e-12)
    return min(c * 10.0**e for e in range(-12, 14) for c in steps if c * 10.0**e >= floor)


@RANDOM
@given(s=scenarios(), data=st.data())
def test_what_a_heatmap_takes_from_other_views_is_what_looking_finds(s, data):
    """spec_for takes the scaled scores' extremes from the raw scores' (when scaling keeps
    their order), the masked scores' colours and finiteness from the scaled scores', and
    knows the weights finite and nothing leaked from them. Each, in the pipeline's order,
    against the matrix itself."""
    result = engine.compute(s)
    h = data.draw(st.integers(0, result.n_heads - 1))
    for view in ("scores", "scaled", "masked", "weights"):
        spec = spec_for(result, view, h)
        values = result.matrix(view, h)
        if view != "weights":
            coloured = result.matrix("scaled" if view == "masked" else view, h)
            top = float(np.abs(coloured[np.isfinite(coloured)]).max())
            assert spec.levels == pytest.approx((-_nice(top), _nice(top)), rel=1e-9)
        hidden = np.zeros(values.shape, bool) if spec.masked is None else spec.masked
        if spec.finite:
            assert np.isfinite(values[~hidden]).all()
        assert spec.finite  # (every number a scenario may hold gives finite scores)
        if view == "weights":
            leaked = result.future & (values != 0)
            if s.settings.mask == "none" or not leaked.any():
                assert spec.leaked is None
            else:
                np.testing.assert_array_equal(spec.leaked, leaked)


def test_a_heatmap_of_scores_past_the_largest_float_is_not_taken_for_finite():
    """Scores that overflowed (∞ and NaN, which a scenario's numbers cannot reach but a
    view must not hide): no extremes derived past them, the levels from the finite
    numbers, the hatching of every one of them looked for."""
    result = engine.compute(make(n=4, d_model=3, H=1, G=1, d_k=2, seed=3, mask="causal"))
    head = result.heads[0]
    scores = np.array(head.scores)
    scores[1, 0], scores[2, 1] = np.inf, np.nan
    scaled = scores / np.sqrt(2)
    masked = np.where(result.future, -np.inf, scaled)
    weights = np.array(head.weights)
    weights[2, 3] = np.nan  # a hidden key's weight: leaked
    m = masked.max(axis=1)  # the softmax's row maxima: ∞ and NaN there too
    for a in (scores, scaled, masked, weights, m):
        a.flags.writeable = False
    broken = dataclasses.replace(head, stages=Stages(scores, scaled, masked), weights=weights, m=m)
    result = dataclasses.replace(result, heads=[broken])
    top = float(np.abs(scaled[np.isfinite(scaled)]).max())
    for view in ("scores", "scaled", "masked", "weights"):
        spec = spec_for(result, view, 0)
        assert not spec.finite
        if view != "scores":
            assert spec.levels == pytest.approx((-_nice(top), _nice(top))) or view == "weights"
    assert spec_for(result, "weights", 0).leaked[2, 3]
    # A head given every field (the torch engine's: no rule) is not known to leave hidden
    # keys at 0: its weight on one is looked for, with finite scores too.
    clean = engine.compute(make(n=4, d_model=3, H=1, G=1, d_k=2, seed=3, mask="causal")).heads[0]
    weights = np.array(clean.weights)
    weights[0, 2] = 0.25
    weights.flags.writeable = False
    stages, rows = clean.made_stages(), clean.row_stats()
    given = dataclasses.replace(clean, weights=weights, rule=None, stages=stages, rows=rows)
    result = dataclasses.replace(result, heads=[given])
    spec = spec_for(result, "weights", 0)
    assert spec.leaked is not None and spec.leaked[0, 2] and spec.leaked.sum() == 1
