"""Worked arithmetic for single cells of the worked example, checked by hand."""

import math

import numpy as np
import pytest
import reference as ref

from attnviz.core.maths.explain import EXPLAINABLE, explain, format_text
from attnviz.core.maths.forward import compute
from attnviz.core.maths.scenario import Settings, from_heads
from attnviz.core.presets import worked_example


@pytest.fixture
def ex():
    s = worked_example()
    return s, compute(s)


def test_scaled_score_shows_products_sum_and_division(ex):
    s, r = ex
    # Head 1, query "saw" against key "she": Q = [1.15, -1.29], K = [1.18, -1.13].
    e = explain(s, r, "scaled", 0, 1, 0)
    assert [t.factors for t in e.terms] == [
        pytest.approx((1.15, 1.18)),
        pytest.approx((-1.29, -1.13)),
    ]
    total = 1.15 * 1.18 + 1.29 * 1.13  # 1.357 + 1.4577 = 2.8147
    assert [st.value for st in e.steps] == pytest.approx(
        [total, math.sqrt(2), total / math.sqrt(2)]
    )
    assert e.value == pytest.approx(2.8147 / math.sqrt(2))


def test_weight_shows_exponentials_sum_and_quotient(ex):
    s, r = ex
    e = explain(s, r, "weights", 0, 1, 0)  # head 1, "saw" attends to "she"
    S = (ref.X @ ref.W_Q[0])[1] @ (ref.X @ ref.W_K[0])[:2].T / math.sqrt(2)
    exps = np.exp(S - S.max())
    assert [t.value for t in e.terms[:2]] == pytest.approx(exps.tolist())
    assert e.terms[2].value == 0.0 and e.terms[3].value == 0.0  # masked keys: exp(−∞) = 0
    assert e.value == pytest.approx(exps[0] / exps.sum())
    text = format_text(e)
    assert "Σ exp" in text and f"{exps[0] / exps.sum():.6g}" in text


def test_masked_cell_says_why(ex):
    s, r = ex
    e = explain(s, r, "masked", 0, 0, 3)
    assert e.value == -math.inf and "−∞" in e.note
    zero = worked_example(Settings(mask="causal-zero"))
    e0 = explain(zero, compute(zero), "masked", 0, 0, 3)
    assert e0.value == 0.0 and "leak" in e0.note


def test_output_is_a_weighted_sum_of_value_rows(ex):
    s, r = ex
    e = explain(s, r, "output", 1, 2, 1)  # head 2, token "the", column 2
    _, W, out = ref.head(ref.X, ref.W_Q[1], ref.W_K[1], ref.W_V[1])
    V = ref.X @ ref.W_V[1]
    assert [t.factors for t in e.terms] == [pytest.approx((W[2, k], V[k, 1])) for k in range(4)]
    assert e.value == pytest.approx(out[2, 1])


def test_final_output_adds_head_blocks(ex):
    s, r = ex
    e = explain(s, r, "final", None, 3, 2)
    _, concat, final = ref.multi_head(ref.X, ref.W_Q, ref.W_K, ref.W_V, ref.W_O)
    per_head = [concat[3, 0:2] @ ref.W_O[0:2, 2], concat[3, 2:4] @ ref.W_O[2:4, 2]]
    assert [t.value for t in e.terms] == pytest.approx(per_head)
    assert e.value == pytest.approx(final[3, 2])
    assert "head 2" in e.terms[1].label


def test_concat_points_at_its_head(ex):
    s, r = ex
    e = explain(s, r, "concat", None, 0, 3)
    assert "head 2" in e.note and e.value == r.output[1, 0, 1]


def test_projection_and_positional_inputs(ex):
    s, r = ex
    e = explain(s, r, "Q", 0, 0, 1)
    assert [t.value for t in e.terms] == pytest.approx([0.27, -0.09, 0.21, 0.14])
    p = worked_example(Settings(positional="sinusoidal"))
    e = explain(p, compute(p), "X", None, 1, 0)
    assert e.value == pytest.approx(0.2 + math.sin(1))


def test_out_of_range_cell_is_refused(ex):
    s, r = ex
    with pytest.raises(KeyError, match="outside"):
        explain(s, r, "weights", 0, 4, 0)
    with pytest.raises(KeyError):
        explain(s, r, "nonsense", 0, 0, 0)


def test_final_output_with_an_ablated_head():
    s = worked_example(Settings(ablated=(0,)))
    r = compute(s)
    e = explain(s, r, "final", None, 2, 1)
    assert e.terms[0].value == 0.0 and "ablated" in e.terms[0].label
    _, concat, _ = ref.multi_head(ref.X, ref.W_Q, ref.W_K, ref.W_V, ref.W_O)
    assert e.value == pytest.approx(concat[2, 2:4] @ ref.W_O[2:4, 1])


# What current models add: each term's arithmetic with the real numbers. --------------

TOKENS = ("she", "saw", "the", "cat")
X_KV = np.array(  # six key/value tokens for cross-attention
    [
        [0.5, -0.2, 0.1, 0.4],
        [0.3, 0.3, -0.6, 0.2],
        [-0.1, 0.7, 0.2, -0.5],
        [0.6, 0.1, 0.0, 0.3],
        [0.2, -0.4, 0.5, 0.1],
        [-0.3, 0.2, 0.4, 0.6],
    ]
)
KV_TOKENS = ("le", "chat", "a", "vu", "la", "souris")


def variant(settings=None, kv=False, cross=False, **extra):
    """The worked example's matrices with some of what current models add; kv: one
    key/value head (head 1's) shared by both query heads; cross: keys from X_KV."""
    heads = [
        {"W_Q": ref.W_Q[h], **({} if kv else {"W_K": ref.W_K[h], "W_V": ref.W_V[h]})}
        for h in range(2)
    ]
    for name in ("b_Q", "q_norm") + (() if kv else ("b_K", "b_V", "k_norm")):
        for h, value in enumerate(extra.pop(name, ())):
            heads[h][name] = value
    kv_heads = [{"W_K": ref.W_K[0], "W_V": ref.W_V[0]}] if kv else None
    if cross:
        extra.update(kv_tokens=KV_TOKENS, X_kv=X_KV)
    s = from_heads(TOKENS, ref.X, heads, ref.W_O, settings, kv_heads=kv_heads, **extra)
    return s, compute(s)


def softmax(row):
    e = np.exp(row - row.max())
    return e / e.sum()


def test_biases_are_terms_of_the_projection_and_of_the_final_output():
    b_Q, b_K, b_V = [[0.1, -0.2], [0.3, 0.4]], [[0.05, 0.0], [-0.5, 0.2]], [[0.0, 0.3], [1, 2]]
    s, r = variant(Settings(mask="none"), b_Q=b_Q, b_K=b_K, b_V=b_V)
    for name, b, W in (("Q", b_Q, ref.W_Q), ("K", b_K, ref.W_K), ("V", b_V, ref.W_V)):
        e = explain(s, r, name, 1, 2, 0)  # head 2, token "the", column 1
        products = ref.X[2] * W[1][:, 0]
        assert [t.value for t in e.terms[:4]] == pytest.approx(products.tolist())
        assert e.terms[4].label == f"b_{name}[1] (bias)" and e.terms[4].factors == (b[1][0],)
        assert e.value == pytest.approx(products.sum() + b[1][0])
        assert f"+ b_{name}[j]" in e.formula
    b_O = [0.1, 0.2, 0.3, 0.4]
    s, r = variant(b_O=b_O)
    e = explain(s, r, "final", None, 3, 2)
    _, _, final = ref.multi_head(ref.X, ref.W_Q, ref.W_K, ref.W_V, ref.W_O)
    assert e.terms[-1].label == "b_O[3] (bias)" and e.terms[-1].value == 0.3
    assert e.value == pytest.approx(final[3, 2] + 0.3)
    assert e.steps[-1].label == "sum over heads + b_O"


def test_a_query_head_names_the_key_value_head_it_reads():
    s, r = variant(kv=True)  # multi-query: both heads read key/value head 1
    e = explain(s, r, "K", 1, 1, 1)  # head 2's K is head 1's: X W_K of head 1
    assert [t.factors for t in e.terms] == [
        pytest.approx((ref.X[1, k], ref.W_K[0][k, 1])) for k in range(4)
    ]
    assert e.value == pytest.approx(ref.X[1] @ ref.W_K[0][:, 1])
    assert "query head 2 reads key/value head 1 (of 1)" in e.note
    assert "query heads 1–2 share" in e.note
    e = explain(s, r, "scaled", 1, 3, 2)  # head 2's query against the shared key
    q, k = ref.X[3] @ ref.W_Q[1], ref.X[2] @ ref.W_K[0]
    assert e.value == pytest.approx(q @ k / math.sqrt(2))
    assert "key/value head 1" in e.note
    e = explain(s, r, "V", 0, 1, 1)
    assert e.value == pytest.approx(ref.X[1] @ ref.W_V[0][:, 1])
    assert "reads" not in explain(*variant(), "K", 1, 1, 1).note  # one each: nothing to say


def test_cross_attention_keys_and_values_come_from_x_kv():
    s, r = variant(Settings(mask="none"), cross=True)
    e = explain(s, r, "K", 0, 5, 1)  # key "souris", row 6 of X_kv
    assert e.terms[0].label.startswith("X_kv[souris]")
    assert [t.factors[0] for t in e.terms] == X_KV[5].tolist()
    assert e.value == pytest.approx(X_KV[5] @ ref.W_K[0][:, 1])
    assert "row 6 of X_kv (souris)" in e.note
    e = explain(s, r, "V", 1, 2, 0)
    assert e.value == pytest.approx(X_KV[2] @ ref.W_V[1][:, 0]) and "X_kv (a)" in e.note
    Q, K = ref.X @ ref.W_Q[0], X_KV @ ref.W_K[0]
    e = explain(s, r, "weights", 0, 1, 3)  # "saw" attends to "vu"
    assert [t.label for t in e.terms] == [f"exp(s[{k}] − m)" for k in KV_TOKENS]
    assert e.value == pytest.approx(softmax(Q[1] @ K.T / math.sqrt(2))[3])
    e = explain(s, r, "scores", 0, 1, 3)
    assert e.terms[0].label == "Q[saw][1]·K[vu][1]"
    assert e.value == pytest.approx(Q[1] @ K[3])


def test_qk_norm_shows_the_rms_eps_and_norm_weight():
    st = Settings(qk_norm="rms", qk_norm_eps=1e-3, mask="none")
    s, r = variant(st, q_norm=[[1.5, 0.5], [1, 1]], k_norm=[[2.0, -1.0], [1, 1]])
    q = ref.X[1] @ ref.W_Q[0]
    rms = math.sqrt((q[0] ** 2 + q[1] ** 2) / 2 + 1e-3)
    e = explain(s, r, "Q_rot", 0, 1, 1)  # head 1, "saw", feature 2
    assert [t.value for t in e.terms] == pytest.approx((q**2).tolist())
    steps = {st.label: st.value for st in e.steps}
    assert steps["RMS = √(mean + ε), ε = 0.001"] == pytest.approx(rms)
    assert steps["× q_norm[2] = 0.5"] == pytest.approx(q[1] / rms * 0.5)
    assert e.value == pytest.approx(q[1] / rms * 0.5)
    k = ref.X[3] @ ref.W_K[0]
    k_rot = k / math.sqrt((k**2).mean() + 1e-3) * np.array([2.0, -1.0])
    e = explain(s, r, "K_rot", 0, 3, 1)
    assert e.value == pytest.approx(k_rot[1]) and "× k_norm[2] = -1" in format_text(e)
    # the scores use the normalised rows
    q_rot = q / rms * np.array([1.5, 0.5])
    e = explain(s, r, "scores", 0, 1, 3)
    assert "Q_rot[i,k] · K_rot[j,k]" in e.formula
    assert [t.factors for t in e.terms] == [pytest.approx((q_rot[c], k_rot[c])) for c in (0, 1)]
    assert e.value == pytest.approx(q_rot @ k_rot)


@pytest.fixture
def wide():
    """One head of d_k 4 (two RoPE pairs) over the worked example's X."""
    rng = np.random.default_rng(7)
    W = {name: rng.standard_normal((4, 4)).round(2) for name in ("W_Q", "W_K", "W_V")}

    def make(**settings):
        st = Settings(positional="rope", rope_base=100.0, mask="none", **settings)
        s = from_heads(TOKENS, ref.X, [W], np.eye(4), st)
        return s, compute(s), ref.X @ W["W_Q"]

    return make


def test_rope_turns_a_pair_by_the_angle_of_its_position(wide):
    s, r, Q = wide()  # "half": feature 4 pairs with feature 2, frequency 100^(−2/4) = 0.1
    theta = 2 * 0.1
    e = explain(s, r, "Q_rot", 0, 2, 3)  # "the" is at position 3 (row 3): turned by 2 steps
    a, b = Q[2, 1], Q[2, 3]
    assert [t.factors for t in e.terms] == [
        pytest.approx((a, math.sin(theta))),
        pytest.approx((b, math.cos(theta))),
    ]
    assert e.value == pytest.approx(a * math.sin(theta) + b * math.cos(theta))
    steps = {st.label: st.value for st in e.steps}
    assert steps["position of the"] == 3
    assert steps["θ = (3 − 1) × 100^(−2/4)"] == pytest.approx(theta)
    assert "θ = (position − 1) · 100^(−2/4)" in e.formula and "position 3" in e.note
    assert steps["cos θ"] == pytest.approx(math.cos(theta))
    assert "a·sin θ + b·cos θ" in e.formula and "turns with feature 2" in e.note
    s, r, Q = wide(rope_style="interleaved")  # feature 3 pairs with feature 4
    e = explain(s, r, "Q_rot", 0, 2, 2)
    a, b = Q[2, 2], Q[2, 3]
    assert e.terms[1].label == "−Q[the,4]·sin θ" and e.terms[1].factors == pytest.approx(
        (-b, math.sin(theta))
    )
    assert e.value == pytest.approx(a * math.cos(theta) - b * math.sin(theta))
    assert "turns with feature 4" in e.note
    s, r, Q = wide(rope_dims=2)  # only features 1 and 2 turn
    e = explain(s, r, "Q_rot", 0, 2, 3)
    assert e.value == Q[2, 3] and "not turned" in e.note
    e = explain(s, r, "scores", 0, 2, 1)  # the scores use the turned rows
    assert e.value == pytest.approx(r.heads[0].Q_rot[2] @ r.heads[0].K_rot[1])
    assert e.terms[0].label == "Q_rot[the][1]·K_rot[saw][1]"


def test_rope_positions_are_offset_under_bottom_right_alignment():
    st = Settings(positional="rope", causal_alignment="bottom-right")
    s, r = variant(st, cross=True)  # 4 queries over 6 keys: queries start at position 3
    e = explain(s, r, "Q_rot", 0, 1, 0)  # "saw" (row 2) sits at position 4: 3 turns
    a, b = ref.X[1] @ ref.W_Q[0]
    assert e.value == pytest.approx(a * math.cos(3) - b * math.sin(3))
    position = next(st for st in e.steps if st.label.startswith("position of saw"))
    assert position.value == 4 and "2 + 2 (bottom-right" in position.label
    e = explain(s, r, "K_rot", 0, 4, 1)  # keys keep positions 1 … 6: "la" is at 5
    a, b = X_KV[4] @ ref.W_K[0]
    assert e.value == pytest.approx(a * math.sin(4) + b * math.cos(4))


def test_scale_value_and_soft_cap():
    s, r = variant(Settings(scale_value=0.25, softcap=1.5))
    S = (ref.X[3] @ ref.W_Q[0]) @ (ref.X[1] @ ref.W_K[0])
    e = explain(s, r, "scaled", 0, 3, 1)
    steps = {st.label: st.value for st in e.steps}
    assert steps["sum × scale_value 0.25"] == pytest.approx(S * 0.25)
    assert steps["tanh(s ÷ 1.5)"] == pytest.approx(math.tanh(S * 0.25 / 1.5))
    assert e.value == pytest.approx(1.5 * math.tanh(S * 0.25 / 1.5))
    assert e.formula.startswith("1.5·tanh(s / 1.5), s = S[i,j] · 0.25")
    assert r.scale_factor == 4.0


def test_alibi_subtracts_slope_times_distance():
    s, r = variant(Settings(positional="alibi"))  # the paper's slopes for 2 heads: 1/16, 1/256
    S = (ref.X[3] @ ref.W_Q[1]) @ (ref.X[1] @ ref.W_K[1]) / math.sqrt(2)
    e = explain(s, r, "scaled", 1, 3, 1)
    steps = {st.label: st.value for st in e.steps}
    assert steps["ALiBi slope of head 2 (the paper's, for 2 heads)"] == 1 / 256
    assert steps["ALiBi −0.00390625 × |4 − 2|"] == -2 / 256
    assert e.value == pytest.approx(S - 2 / 256) and "− slope·|i − j|" in e.formula
    s, r = variant(Settings(positional="alibi", alibi_slopes=(0.5, 0.25)))
    e = explain(s, r, "masked", 1, 3, 0)
    assert e.value == pytest.approx(
        (ref.X[3] @ ref.W_Q[1]) @ (ref.X[0] @ ref.W_K[1]) / math.sqrt(2) - 0.25 * 3
    )


def test_masks_name_the_window_the_custom_cell_and_the_alignment():
    st = Settings(mask="sliding-window", window=2, causal_alignment="bottom-right")
    s, r = variant(st, cross=True)  # "she" sits at key position 3: it sees keys 2 and 3
    e = explain(s, r, "masked", 0, 0, 0)
    assert e.value == -math.inf and "le is more than 1 before she" in e.note
    assert "1 + 2 = 3" in e.note and "bottom-right" in e.note
    assert "i + 2 − 2 < j ≤ i + 2" in e.formula
    e = explain(s, r, "masked", 0, 0, 3)
    assert e.value == -math.inf and "vu comes after she" in e.note
    e = explain(s, r, "masked", 0, 0, 2)
    Q, K = ref.X @ ref.W_Q[0], X_KV @ ref.W_K[0]
    assert e.note == "not masked" and e.value == pytest.approx(Q[0] @ K[2] / math.sqrt(2))
    s, r = variant(Settings(causal_alignment="bottom-right"), cross=True)
    e = explain(s, r, "masked", 0, 1, 4)  # "saw" at position 4 may not see "la" at 5
    assert e.value == -math.inf and "la comes after saw" in e.note and "2 + 2 = 4" in e.note
    mask = np.tril(np.ones((4, 4)))
    mask[2, 0] = 0.0  # "the" may not see "she"
    s, r = variant(Settings(mask="custom"), mask_matrix=mask)
    e = explain(s, r, "masked", 1, 2, 0)
    assert e.value == -math.inf and "mask_matrix[the,she] = 0" in e.note
    e = explain(s, r, "masked", 1, 2, 1)
    assert "mask_matrix[the,saw] = 1" in e.note
    assert e.value == pytest.approx((ref.X[2] @ ref.W_Q[1]) @ (ref.X[1] @ ref.W_K[1]) / 2**0.5)


def test_the_sink_joins_the_denominator_and_takes_its_share():
    s, r = variant(Settings(sinks=(0.5, -1.0)))
    S = (ref.X[1] @ ref.W_Q[0]) @ (ref.X[:2] @ ref.W_K[0]).T / math.sqrt(2)  # "saw": 2 keys
    m = max(S.max(), 0.5)
    Z = np.exp(S - m).sum() + math.exp(0.5 - m)
    e = explain(s, r, "weights", 0, 1, 0)
    assert e.terms[-1].label == "exp(sink − m)"
    assert e.terms[-1].value == pytest.approx(math.exp(0.5 - m))
    steps = {st.label: st.value for st in e.steps}
    assert steps["m = max(row max, sink)"] == pytest.approx(m)
    assert steps["Σ exp, the sink's included"] == pytest.approx(Z)
    assert steps["sink share exp(sink − m) ÷ Σ"] == pytest.approx(math.exp(0.5 - m) / Z)
    assert e.value == pytest.approx(math.exp(S[0] - m) / Z)
    e = explain(s, r, "output", 0, 1, 0)
    assert f"{math.exp(0.5 - m) / Z:.6g}" in e.note
    # a row with every key hidden gives all its weight to the sink
    mask = np.tril(np.ones((4, 4)))
    mask[0, 0] = 0.0
    s, r = variant(Settings(mask="custom", sinks=(0.5, -1.0)), mask_matrix=mask)
    e = explain(s, r, "weights", 0, 0, 0)
    assert e.value == 0.0 and e.steps[-1].value == 1.0


def test_q_rot_without_norm_or_rope_is_q_and_plain_text_is_unchanged(ex):
    s, r = ex
    assert EXPLAINABLE[:8] == ("Q", "K", "V", "scores", "scaled", "masked", "weights", "output")
    assert {"Q_rot", "K_rot", "X", "concat", "final"} <= set(EXPLAINABLE)
    e = explain(s, r, "Q_rot", 0, 0, 1)
    assert e.value == explain(s, r, "Q", 0, 0, 1).value and "Q_rot is Q" in e.note
    assert format_text(explain(s, r, "scaled", 0, 1, 0)) == (
        "scaled score\n"
        "  S[i,j] / √d_k = (Σ_k Q[i,k] · K[j,k]) / √d_k\n"
        "    Q[saw][1]·K[she][1] = 1.15 × 1.18 = 1.357\n"
        "    Q[saw][2]·K[she][2] = -1.29 × -1.13 = 1.4577\n"
        "  sum = 2.8147\n"
        "  √d_k = √2 = 1.41421\n"
        "  sum ÷ √d_k = 1.99029\n"
        "  value = 1.99029"
    )


def test_every_cell_of_every_variant_recomputes_to_the_engine():
    # The engine is not the code under test here: each explanation must land on its cell.
    st = Settings(
        positional="rope",
        qk_norm="rms",
        softcap=2.0,
        sinks=(0.5, -1.0),
        mask="sliding-window",
        window=2,
        causal_alignment="bottom-right",
    )
    cases = [
        variant(st, kv=True, cross=True, b_Q=[[0.1, 0.2], [0.3, -0.4]], b_O=[1, 2, 3, 4]),
        variant(st.replace(positional="alibi", rope_style="interleaved", scale_value=0.3)),
        variant(Settings(positional="alibi", mask="none", sinks=(1.0, 2.0)), cross=True),
    ]
    for s, r in cases:
        for name in EXPLAINABLE:
            for head in [None] if name in ("X", "concat", "final") else range(r.n_heads):
                M = r.matrix(name, head)
                for i, j in np.ndindex(M.shape):
                    e = explain(s, r, name, head, i, j)
                    assert e.value == pytest.approx(M[i, j], abs=1e-12), (name, head, i, j)


# Positions a learner reads count from 1, like the rows and columns. -------------------


def alibi_reference(Q, K, slope, query_from):
    """Scaled scores plus ALiBi, from NumPy: query i (1-based) at position query_from + i,
    key j at position j; bias −slope·|p_q − p_k|, written here with 1-based positions."""
    pq = query_from + np.arange(1, Q.shape[0] + 1)
    pk = np.arange(1, K.shape[0] + 1)
    bias = -slope * np.abs(pq[:, None] - pk[None, :])
    return Q @ K.T / math.sqrt(Q.shape[1]) + bias, bias, pq, pk


@pytest.mark.parametrize("cross", [False, True])
def test_alibi_weight_and_score_cells_name_1_based_positions(cross):
    st = Settings(positional="alibi", mask="none", causal_alignment="bottom-right")
    s, r = variant(st, cross=cross)
    X_k = X_KV if cross else ref.X
    keys = KV_TOKENS if cross else TOKENS
    for h, slope in enumerate((2**-4, 2**-8)):  # the paper's slopes for 2 heads
        Q, K = ref.X @ ref.W_Q[h], X_k @ ref.W_K[h]
        scaled, bias, pq, pk = alibi_reference(Q, K, slope, len(keys) - 4)
        for i in range(4):
            for j in range(len(keys)):
                e = explain(s, r, "scaled", h, i, j)
                assert e.value == pytest.approx(scaled[i, j])
                steps = {x.label: x.value for x in e.steps}
                label = f"ALiBi −{slope:.6g} × |{pq[i]} − {pk[j]}|"
                assert steps[label] == pytest.approx(bias[i, j]), (label, steps)
                where = f"query {TOKENS[i]} at position {pq[i]}, key {keys[j]} at {pk[j]}"
                assert where in e.note
                w = explain(s, r, "weights", h, i, j)
                assert f"ALiBi's −{slope:.6g} × |{pq[i]} − {pk[j]}| = " in w.note
                assert where in w.note
                shown = float(w.note.split(f"|{pq[i]} − {pk[j]}| = ")[1].split(":")[0])
                assert shown == pytest.approx(bias[i, j], abs=1e-6)
                row = np.exp(scaled[i] - scaled[i].max())
                assert w.value == pytest.approx(row[j] / row.sum())


def test_alibi_preset_cell_in_the_text_a_learner_reads():
    from attnviz.core.presets import make_preset

    s = make_preset("alibi", None, None)
    r = compute(s)
    text = format_text(explain(s, r, "weights", 1, 4, 1))  # head 2, row 5, column 2
    assert "× |5 − 2| = -0.1875" in text  # slope 1/16 × distance 3
    assert f"query {s.tokens[4]} at position 5, key {s.tokens[1]} at 2" in text
    assert "|4 − 1|" not in text and "position 4" not in text


def test_sinusoidal_input_names_the_row_as_a_learner_counts_it():
    p = worked_example(Settings(positional="sinusoidal"))
    e = explain(p, compute(p), "X", None, 2, 1)  # row 3, column 2: cos of position 3 − 1
    assert e.value == pytest.approx(ref.X[2, 1] + math.cos(2))
    assert "PE = cos((3 − 1) / 10000^(0/4))" in e.formula
    assert e.terms[1].label == "PE[3,2]"


def test_alignment_notes_count_positions_from_1():
    s, r = variant(Settings(causal_alignment="bottom-right"), cross=True)
    for i in range(3):  # 4 queries over 6 keys: row i sits at key position i + 2
        e = explain(s, r, "masked", 0, i, 5)  # key 6 comes after rows 1 to 3
        assert e.value == -math.inf
        assert f"at key position {i + 1} + 2 = {i + 3}" in e.note, e.note
