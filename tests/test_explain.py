"""Worked arithmetic for single cells of the worked example, checked by hand."""

import math

import numpy as np
import pytest
import reference as ref

from attnviz.core.maths.engine import compute
from attnviz.core.maths.explain import explain, format_text
from attnviz.core.maths.scenario import Settings
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
