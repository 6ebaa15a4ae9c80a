"""The engine with what current models add (biases, GQA/MQA, cross-attention, QK-norm,
RoPE, ALiBi, soft-cap, sinks, scale_value, causal alignment, sliding-window and custom
masks), alone and together, against a plain reference written here from the spec's order
of operations; incremental updates, one head and the layer against compute; torch's own
attention through cross_check; and the Scenario helpers and messages for these fields.

The reference (variant_reference.py) shares no code with attnviz: loops over heads, rows
and pairs.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any
from unittest import mock

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
from attnviz.core.maths import engine
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
    # a tiny cap flattens every row: uniform weights
    tight = engine.compute(s.with_settings(softcap=1e-9))
    np.testing.assert_allclose(tight.weights, 1.0 / s.n, rtol=1e-8)


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
    assert alone.n_heads == 1
    # bit for bit, as one_head promises, except where a product is matrix × vector: see
    # test_one_head_is_bit_for_bit_with_a_single_token_or_d_k_1
    exact = not (s.settings.projections and min(s.n, s.m, s.d_k) == 1)
    for got in (alone.heads[0], engine.compute_head(s, h)):
        for name in (*FIELDS, "empty_rows"):
            a, b = getattr(got, name), getattr(full.heads[h], name)
            if exact or name == "empty_rows":
                np.testing.assert_array_equal(a, b, err_msg=name)
            else:
                assert_close(a, b, name)
    whole = engine.layer(s, block=data.draw(st.integers(1, 4)))
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
    n = engine.SOFTMAX_ROWS * 2 + 44
    keys = n if m is None else m
    s = make(
        n=n, m=m, d_model=6, H=2, G=1, d_k=3, mask=mask, window=40, **extras,
        causal_alignment="top-left" if m is None else "bottom-right",
    )  # fmt: skip
    if mask == "custom":
        rng = np.random.default_rng(1)
        seen = np.tril(rng.random((n, keys)) < 0.8, k=keys - n - 30)  # ends 30 keys early
        seen[: engine.SOFTMAX_ROWS] = False  # a whole block of rows that sees nothing
        s = dataclasses.replace(s, mask_matrix=seen.astype(float))
        ends = engine.Rule.of(s, engine.hidden_keys(s)).ends
        assert ends[: engine.SOFTMAX_ROWS].max() == 0 and ends[-1] < keys
    full = engine.compute(s)
    assert_matches_reference(s, full)
    for h in range(2):
        np.testing.assert_allclose(
            engine.one_head(s, h).heads[0].output, full.heads[h].output, rtol=1e-12, atol=1e-14
        )
    np.testing.assert_allclose(
        engine.layer(s, block=100).concat, full.concat, rtol=1e-12, atol=1e-13
    )
    edited = s.with_cells("W_V", 0, 2, 1, [[1.5]])
    assert_matches_reference(edited, engine.update(full, edited, v_heads=[0]))


@pytest.mark.parametrize(
    "extras", [{"dropout": 0.3}, {"mask": "drop-after-softmax"}, {"mask": "causal-zero"}]
)
def test_an_edit_of_w_v_keeps_the_weights_even_when_they_are_not_the_softmax(extras):
    """Dropout and drop-after-softmax change the weights after the softmax; an edit of
    W_V still leaves them as they are (no head is computed again) and multiplies them by
    the new V: every field equals a full compute."""
    s = make(n=12, d_model=6, H=4, G=2, d_k=3, **extras)
    prev = engine.compute(s)
    edited = s.with_cells("W_V", 1, 4, 2, [[2.5]])
    with mock.patch.object(engine, "_attend", wraps=engine._attend) as whole:
        got = engine.update(prev, edited, v_heads=[1])
    assert whole.call_count == 0
    for h in (2, 3):  # the heads reading key/value head 2: the very same weights
        assert got.heads[h].weights is prev.heads[h].weights
    assert_same_result(got, engine.compute(edited))


@pytest.mark.parametrize("kept", [True, False])
def test_alibi_distances_kept_or_made_per_block_give_the_reference(kept, monkeypatch):
    """ALiBi's |i − j| kept whole by the rule (small sizes) or made for each block asked
    for (past KEPT_DISTANCES cells): compute, layer and an X edit's patch all equal the
    reference; the term a view shows is one array while it is held."""
    if not kept:
        monkeypatch.setattr(engine, "KEPT_DISTANCES", 0)
    s = make(n=30, m=40, d_model=6, H=4, G=2, d_k=3, positional="alibi",
             causal_alignment="bottom-right")  # fmt: skip
    full = engine.compute(s)
    assert_matches_reference(s, full)
    np.testing.assert_allclose(engine.layer(s, block=7).final, full.final, rtol=1e-12, atol=1e-13)
    edited = s.with_cells("X", None, 4, 2, [[1.5]])
    assert_matches_reference(edited, engine.update(full, edited, x_rows=[4]))
    rule = full.heads[0].rule
    term = rule.alibi(2)
    assert rule.alibi(2) is term and not term.flags.writeable
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


@st.composite
def edits(draw: st.DrawFn) -> tuple[Scenario, Scenario, dict[str, Any]]:
    """A scenario with projections, one edited copy, and what update is told changed."""
    s = draw(scenarios().filter(lambda s: s.settings.projections))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    told: dict[str, Any] = {"x_rows": set(), "kv_rows": set(), "heads": set(), "kv_heads": set()}
    told["v_heads"] = set()
    told["w_o"] = False
    edited = s
    names = draw(
        st.lists(
            st.sampled_from(
                (
                    *("X", "X_kv", "W_Q", "b_Q", "q_norm"),
                    *("W_K", "W_V", "b_K", "b_V", "k_norm", "W_O", "b_O"),
                )
            ),
            min_size=1,
            max_size=4,
        )
    )
    for name in names:
        if name == "X_kv" and not s.cross:
            continue
        head = None
        if name in ("W_Q", "b_Q", "q_norm"):
            head = draw(st.integers(0, s.n_heads - 1))
            told["heads"].add(head)
        elif name in ("W_K", "W_V", "b_K", "b_V", "k_norm"):
            head = draw(st.integers(0, s.kv_heads - 1))
            told["v_heads" if name in ("W_V", "b_V") else "kv_heads"].add(head)
        target = edited.matrix(name, head)
        row = draw(st.integers(0, target.shape[0] - 1))
        edited = edited.with_cells(name, head, row, 0, rng.normal(size=(1, target.shape[1])))
        if name == "X":
            told["x_rows"].add(row)
        elif name == "X_kv":
            told["kv_rows"].add(row)
        elif name in ("W_O", "b_O"):
            told["w_o"] = True
    return s, edited, told


def assert_same_result(got: engine.Result, want: engine.Result, atol: float = 1e-12) -> None:
    """Every field of every head, concat and final, to 1e-12 (relative and absolute)."""
    for h in range(want.n_heads):
        for name in FIELDS:
            np.testing.assert_allclose(
                getattr(got.heads[h], name),
                getattr(want.heads[h], name),
                rtol=1e-12,
                atol=atol,
                err_msg=f"head {h + 1} {name}",
            )
    np.testing.assert_allclose(got.concat, want.concat, rtol=1e-12, atol=atol)
    np.testing.assert_allclose(got.final, want.final, rtol=1e-12, atol=atol)


@RANDOM
@given(case=edits())
def test_incremental_updates_equal_compute(case):
    before, after, told = case
    got = engine.update(engine.compute(before), after, **told)
    assert got.complete
    assert_same_result(got, engine.compute(after), atol=1e-13)
    assert_matches_reference(after, got)


@RANDOM
@given(
    s=scenarios(tokens=(8, 24)).filter(lambda s: s.settings.projections),
    data=st.data(),
)
def test_row_edits_update_rows_and_columns_and_equal_compute(s, data):
    """Three edits of one to three rows of X (or X_kv), each updated from the last
    result: the rows and columns of the scores they touch are patched (no head is
    recomputed whole while few rows changed, under drop-after-softmax and dropout too),
    and every field equals a full compute."""
    result = engine.compute(s)
    for _ in range(3):
        name = "X_kv" if s.cross and data.draw(st.booleans()) else "X"
        rows, cols = s.matrix(name, None).shape
        count = data.draw(st.integers(1, 3))
        row = data.draw(st.integers(0, rows - count))
        block = data.draw(st.lists(st.floats(-3, 3), min_size=count * cols, max_size=count * cols))
        s = s.with_cells(name, None, row, 0, np.reshape(block, (count, cols)))
        edited = set(range(row, row + count))
        told = {"x_rows": edited} if name == "X" else {"kv_rows": edited}
        with mock.patch.object(engine, "_attend", wraps=engine._attend) as whole:
            result = engine.update(result, s, **told)
        if 8 * count <= max(s.n, s.m):
            assert whole.call_count == 0
        assert_same_result(result, engine.compute(s))


SCORE_MATRICES = ("scores", "scaled", "masked")


@RANDOM
@given(case=edits(), data=st.data())
def test_a_drawn_heads_score_matrices_follow_every_update(case, data):
    """A head a view has drawn (its scores, scaled and masked made) gets them made with
    each update, patched by rows and columns after an edit of X, copied on the way when
    its scores are computed again; no other head gets them. They equal compute's, and
    when an edit of a few rows of X alone patched them, every other cell is the very
    same number as before."""
    before, after, told = case
    prev = engine.compute(before)
    drawn = data.draw(st.integers(0, prev.n_heads - 1))
    old = [getattr(prev.heads[drawn], name) for name in SCORE_MATRICES]
    preview = data.draw(st.booleans())
    got = engine.update(prev, after, **told, preview_head=drawn if preview else None)
    want = engine.compute(after)
    for h, head in enumerate(got.heads):
        made = [name for name in SCORE_MATRICES if name in head.__dict__]
        assert made == (list(SCORE_MATRICES) if h == drawn else []), f"head {h + 1}"
    head = got.heads[drawn]
    for name in SCORE_MATRICES:
        np.testing.assert_allclose(
            getattr(head, name),
            getattr(want.heads[drawn], name),
            rtol=1e-12,
            atol=1e-13,
            err_msg=name,
        )
    rows = sorted(told["x_rows"])
    cols = sorted(told["kv_rows"] if after.cross else told["x_rows"])
    weights_edited = told["heads"] or told["kv_heads"]
    few = 8 * len(set(rows) | set(cols)) <= max(after.n, after.m)
    if (rows or cols) and not weights_edited and few:
        untouched = np.ones(head.scores.shape, dtype=bool)
        untouched[rows] = False
        untouched[:, cols] = False
        for name, before_edit in zip(SCORE_MATRICES, old, strict=True):
            now = getattr(head, name)
            np.testing.assert_array_equal(now[untouched], before_edit[untouched], err_msg=name)


@RANDOM
@given(s=scenarios(tokens=(8, 20)).filter(lambda s: s.settings.projections), data=st.data())
def test_a_patched_head_tells_which_lines_of_its_matrices_changed(s, data):
    """After an edit of a row of X (or X_kv), a head patched row by row names, for its
    Q, K, V, Q_rot, K_rot and the score matrices a view drew, the head's array it came
    from and the only rows and columns where it differs (so views recolour just those);
    its weights and output, rescaled row by row, may differ anywhere (recoloured whole,
    not compared)."""
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    prev = engine.compute(s)
    drawn = data.draw(st.integers(0, s.n_heads - 1))
    for name in SCORE_MATRICES:
        getattr(prev.heads[drawn], name)  # as a view does
    name = "X_kv" if s.cross and data.draw(st.booleans()) else "X"
    row = data.draw(st.integers(0, s.matrix(name, None).shape[0] - 1))
    after = s.with_cells(name, None, row, 0, rng.normal(size=(1, s.d_model)))
    got = engine.update(prev, after, **{"x_rows" if name == "X" else "kv_rows": {row}})
    assert_same_result(got, engine.compute(after))
    patched = after.settings.mask != "drop-after-softmax" and after.settings.dropout == 0
    for h, head in enumerate(got.heads):
        for matrix in ("weights", "output"):
            told = engine.unchanged_outside(head, matrix)
            assert told is not None and told[1] is None, matrix
            assert told[0]() is getattr(prev.heads[h], matrix), matrix
        for matrix in (*engine.ROW_MATRICES, *SCORE_MATRICES):
            known = engine.unchanged_outside(head, matrix)
            if known is None:
                assert not patched or (matrix in SCORE_MATRICES and h != drawn), matrix
                continue
            ref, lines = known
            before = ref()
            assert before is getattr(prev.heads[h], matrix)
            if lines is None:  # computed anew (not patched): any cell may differ
                assert matrix in SCORE_MATRICES and h == drawn, matrix
                continue
            rows, cols = lines
            same = np.ones(before.shape, dtype=bool)
            same[rows] = False
            same[:, cols] = False
            np.testing.assert_array_equal(getattr(head, matrix)[same], before[same], matrix)


def test_a_heatmap_told_what_changed_keeps_no_earlier_matrix_alive():
    """The claim a patched head hands its heatmaps holds the earlier matrices weakly: once
    nothing else holds the earlier result, its score matrices are gone (at n = 4096 each
    is 128 MiB)."""
    import gc
    import weakref

    from attnviz.core.figures.figure import spec_for

    s = make(n=24, H=4, G=2, seed=5)
    prev = engine.compute(s)
    earlier = weakref.ref(prev.heads[1].scores)
    after = s.with_cells("X", None, 3, 0, np.ones((1, 5)))
    got = engine.update(prev, after, x_rows={3})
    spec = spec_for(got, "scores", 1)
    assert spec.since is not None and spec.since[0]() is earlier()
    del prev
    gc.collect()
    assert earlier() is None and spec.since[0]() is None


CHAIN_CONFIGS = (
    {},
    {"positional": "rope"},
    {"qk_norm": "rms", "positional": "rope"},
    {"mask": "none", "positional": "alibi"},
    {"softcap": 0.7, "mask": "sliding-window", "window": 3},
    {"sinks": (-1.0, 0.0, 2.0, 0.5), "causal_alignment": "bottom-right"},
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_edit_after_edit_with_previews_keeps_groups_whole_and_claims_true(data):
    """Edits one after another, as the window makes them (the shown head previewed, then
    the rest): every query head of a key/value group holds the same K, V and K_rot to the
    last bit, what a patched head says did not change did not, and every result equals
    compute's."""
    config = data.draw(st.sampled_from(CHAIN_CONFIGS))
    cross = data.draw(st.booleans())
    s = make(n=24, m=20 if cross else None, H=4, G=2, seed=data.draw(st.integers(0, 99)), **config)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    prev = engine.compute(s)
    kept = [prev]  # the arrays views hold
    for _ in range(5):
        for h in range(4):  # a view drew this head's score matrices
            if rng.random() < 0.5:
                for name in SCORE_MATRICES:
                    getattr(prev.heads[h], name)
        told: dict[str, Any] = {"x_rows": set(), "heads": set(), "kv_heads": set()}
        told |= {"kv_rows": set(), "v_heads": set(), "w_o": False}
        name = data.draw(st.sampled_from(("X", "X_kv", "W_Q", "W_K", "W_V", "k_norm", "W_O")))
        name = "X" if name == "X_kv" and not cross else name
        head = None if name in ("X", "X_kv", "W_O") else int(rng.integers(2))
        row = int(rng.integers(s.matrix(name, head).shape[0]))
        s = s.with_cells(name, head, row, 0, rng.normal(size=(1, 1)))
        key = {"X": "x_rows", "X_kv": "kv_rows", "W_Q": "heads", "W_V": "v_heads"}
        if name == "W_O":
            told["w_o"] = True
        else:
            told[key.get(name, "kv_heads")].add(row if head is None else head)
        shown = data.draw(st.none() | st.integers(0, 3))
        if shown is not None:
            preview = engine.update(prev, s, **told, preview_head=shown)
            kept.append(preview)
            done = [] if preview.complete else [shown]
            got = engine.update(preview, s, **told, current_heads=done)
        else:
            got = engine.update(prev, s, **told)
        assert_same_result(got, engine.compute(s))
        for h, one in enumerate(got.heads):
            other = got.heads[h ^ 1]  # the other query head of its group (G = 2 of H = 4)
            for matrix in ("K", "V", "K_rot"):
                np.testing.assert_array_equal(getattr(one, matrix), getattr(other, matrix))
            for matrix in (*engine.ROW_MATRICES, *SCORE_MATRICES):
                known = engine.unchanged_outside(one, matrix)
                if known is not None and known[1] is not None:  # (None: any cell may differ)
                    before, (rows, cols) = known[0](), known[1]
                    same = np.ones(before.shape, dtype=bool)
                    same[rows] = False
                    same[:, cols] = False
                    now = getattr(one, matrix)
                    np.testing.assert_array_equal(now[same], before[same], matrix)
        kept = [*kept[-3:], got]
        prev = got


def test_a_head_computed_again_keeps_the_values_its_output_was_made_from():
    """After W_V moved V by a rank-one term, a paste over many rows of W_K projects K and
    V again: the head then holds that V, the one its output is the weights times."""
    s0 = make(n=24, d_model=12, H=2, G=2, d_k=4, seed=3)
    s1 = s0.with_cells("W_V", 0, 0, 0, np.array([[0.7]]))
    r1 = engine.update(engine.compute(s0), s1, v_heads={0})
    s2 = s1.with_cells("W_K", 0, 0, 0, np.full((12, 4), 0.1))  # more rows than FEW_ROWS
    head = engine.update(r1, s2, kv_heads={0}).heads[0]
    np.testing.assert_array_equal(head.output, head.weights @ head.V)


def test_an_edit_keeps_the_arrays_it_did_not_change():
    """Views skip redrawing what is the same array, so an update hands back the very
    arrays an edit did not change (and the same numbers as compute)."""
    s = make(n=12, H=4, G=2, positional="rope", qk_norm="rms")
    r = engine.compute(s)
    # W_V of key/value head 1 (query heads 1 and 2): their weights stay, V and output move.
    s2 = s.with_cells("W_V", 0, 2, 1, np.array([[0.5]]))
    u = engine.update(r, s2, v_heads={0})
    for h in (0, 1):
        old, new = r.heads[h], u.heads[h]
        assert all(getattr(new, f) is getattr(old, f) for f in ("weights", "Q", "K", "K_rot"))
        assert new.V is not old.V and new.output is not old.output
    assert u.heads[2] is r.heads[2] and u.heads[3] is r.heads[3]
    assert_same_result(u, engine.compute(s2))
    # W_Q of query head 2: its keys and values stay, its queries and weights move.
    s3 = s2.with_cells("W_Q", 1, 0, 0, np.array([[2.0]]))
    v = engine.update(u, s3, heads={1})
    assert all(getattr(v.heads[1], f) is getattr(u.heads[1], f) for f in ("K", "V", "K_rot"))
    assert v.heads[1].Q is not u.heads[1].Q and v.heads[0] is u.heads[0]
    assert_same_result(v, engine.compute(s3))
    # W_O: every head and concat stay; final gets a rank update.
    s4 = s3.with_cells("W_O", None, 5, 2, np.array([[-1.0]]))
    w = engine.update(v, s4, w_o=True)
    assert w.heads == v.heads and w.concat is v.concat and w.final is not v.final
    assert_same_result(w, engine.compute(s4))
    # W_K of key/value head 2 (query heads 3 and 4): their values stay, keys move.
    s5 = s4.with_cells("W_K", 1, 3, 0, np.array([[0.7]]))
    x = engine.update(w, s5, kv_heads={1})
    for h in (2, 3):
        assert x.heads[h].V is w.heads[h].V and x.heads[h].K is not w.heads[h].K
    assert x.heads[0] is w.heads[0]
    assert_same_result(x, engine.compute(s5))


def test_a_preview_then_the_rest_equals_compute():
    s = make(H=4, G=2, positional="rope", sinks=(0.0, 1.0, 2.0, 3.0))
    edited = s.with_cells("W_K", 1, 0, 0, np.ones((1, 4)))
    prev = engine.compute(s)
    preview = engine.update(prev, edited, kv_heads=[1], preview_head=2)
    assert not preview.complete and preview.fresh == (2,)
    final = engine.update(preview, edited, kv_heads=[1], current_heads=[2])
    want = engine.compute(edited)
    np.testing.assert_allclose(final.output, want.output, rtol=1e-13, atol=1e-14)
    np.testing.assert_allclose(final.final, want.final, rtol=1e-13, atol=1e-14)


@pytest.mark.parametrize("edit", ["X", "W_K"])
def test_every_head_before_the_mix_then_the_mix_equals_compute(edit):
    """update(mix=False) returns once the heads are current: they are compute's, the mix
    still the previous one's; the mix from it then equals compute's."""
    s = make(H=4, G=2, positional="rope", sinks=(0.0, 1.0, 2.0, 3.0))
    prev = engine.compute(s)
    if edit == "X":
        edited, changes = s.with_cells("X", None, 2, 0, np.ones((1, 4))), {"x_rows": [2]}
    else:
        edited, changes = s.with_cells("W_K", 1, 0, 0, np.ones((1, 4))), {"kv_heads": [1]}
    heads = engine.update(prev, edited, **changes, mix=False)
    want = engine.compute(edited)
    assert not heads.complete and heads.heads_current and heads.fresh == (0, 1, 2, 3)
    np.testing.assert_allclose(heads.output, want.output, rtol=1e-13, atol=1e-14)
    assert heads.final is prev.final and heads.concat is prev.concat
    done = engine.update(heads, edited, **changes, current_heads=range(4))
    assert done.complete
    np.testing.assert_allclose(done.final, want.final, rtol=1e-13, atol=1e-14)
    # a change of W_O alone touches no head: the whole result at once
    w_o = edited.with_cells("W_O", None, 0, 0, np.ones((1, 4)))
    assert engine.update(done, w_o, w_o=True, mix=False).complete


def test_a_head_computed_anew_says_its_matrices_may_differ_anywhere():
    """After an edit of its weights a drawn head is computed anew: its weights, output and
    score matrices name the arrays they replace, with no lines (a view recolours them
    whole, comparing nothing); what it reuses, and the heads the edit did not touch, say
    nothing."""
    s = make(H=4, G=2, positional="rope")
    prev = engine.compute(s)
    drawn = prev.heads[2]
    for name in ("scores", "scaled", "masked"):
        getattr(drawn, name)
    new = engine.update(prev, s.with_cells("W_K", 1, 0, 0, np.array([[0.5]])), kv_heads=[1])
    head = new.heads[2]
    for name in ("scores", "scaled", "masked", "weights", "output"):
        claim = engine.unchanged_outside(head, name)
        assert claim is not None and claim[0]() is getattr(drawn, name) and claim[1] is None
        assert not np.array_equal(getattr(head, name), getattr(drawn, name)), name
    assert head.Q is drawn.Q and engine.unchanged_outside(head, "Q") is None
    assert (
        new.heads[0] is prev.heads[0] and engine.unchanged_outside(new.heads[0], "scores") is None
    )


@pytest.mark.parametrize("name", ["W_Q", "W_K", "W_V"])
def test_an_edits_preview_does_not_stack_the_edited_weights(name):
    """An edit copies one head of a weight stack; updates read the heads they need and
    never stack the whole (a Llama-3-8B layer's W_Q is 134 MB)."""
    s = make(H=4, G=2, positional="rope", qk_norm="rms")
    prev = engine.compute(s)
    head = 1
    edited = s.with_cells(name, head, 2, 1, np.array([[0.9, -0.4]]))
    told = (
        {"heads": [head]}
        if name == "W_Q"
        else {("kv_heads" if name == "W_K" else "v_heads"): [head]}
    )
    shown = 2 if name != "W_Q" else head  # (query head 3 reads key/value head 2)
    preview = engine.update(prev, edited, **told, preview_head=shown)
    final = engine.update(preview, edited, **told, current_heads=[shown])
    assert name not in vars(edited)  # not stacked by either
    again = edited.with_cells(name, head, 0, 0, np.array([[0.3]]))
    after = engine.update(final, again, **told)  # from a result of an edited scenario
    assert name not in vars(again)
    assert_same_result(after, engine.compute(again))
    assert_same_result(final, engine.compute(edited))
    # the same against a scenario built whole from the edited stack
    rebuilt = dataclasses.replace(s, **{name: np.array(getattr(edited, name))})
    assert_same_result(final, engine.compute(rebuilt))


# torch: the torch engine and SDPA / flex_attention ----------------------------------------


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
    broken = head.with_fields(scores=scores, scaled=scaled, masked=masked, weights=weights, m=m)
    for a in (scores, scaled, masked, weights, m):
        a.flags.writeable = False
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
    for name in ("scores", "scaled", "masked"):
        getattr(clean, name)
    weights = np.array(clean.weights)
    weights[0, 2] = 0.25
    weights.flags.writeable = False
    given = clean.with_fields(weights=weights, rule=None)
    result = dataclasses.replace(result, heads=[given])
    spec_for(result, "scaled", 0)  # as the pipeline does first: the scaled scores' extent
    spec = spec_for(result, "weights", 0)
    assert spec.finite and spec.leaked is not None and spec.leaked[0, 2] and spec.leaked.sum() == 1


def test_a_drawn_heads_scores_hold_no_other_heads_memory():
    """Drawn heads computed together keep their own score matrices: none is a window on
    an array of several heads, which a head left unedited later would keep alive whole."""
    s = make(n=16, H=4, G=4, seed=2)
    prev = engine.compute(s)
    for h in (0, 1):
        assert prev.heads[h].scores.shape == (16, 16)  # made, as a view does
    one = s.with_cells("W_Q", 0, 0, 0, np.array([[0.5]]))
    both = one.with_cells("W_Q", 1, 0, 0, np.array([[-0.5]]))
    for edited, heads in ((both, {0, 1}), (one, {0})):
        new = engine.update(prev, edited, heads=heads)
        for h in heads:
            scores = new.heads[h].scores
            owner = scores if scores.base is None else scores.base
            assert owner.size == scores.size, (heads, h)
