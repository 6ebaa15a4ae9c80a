"""Properties of attention over random shapes and values (hypothesis)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from attnviz.core.maths.explain import explain
from attnviz.core.maths.forward import compute
from attnviz.core.maths.results import HEAD_MATRICES, LAYER_MATRICES
from attnviz.core.maths.scenario import MASKS, Scenario, Settings, permute_tokens
from attnviz.core.maths.scoring import softmax_rows

values = st.floats(-2, 2, allow_nan=False, allow_infinity=False)


@st.composite
def scenarios(draw, masks=MASKS, positional=("none", "sinusoidal")):
    n = draw(st.integers(1, 6))
    d_model = draw(st.integers(1, 6))
    h = draw(st.integers(1, 5))
    d_k = draw(st.integers(1, 4))

    def mat(*shape):
        return draw(hnp.arrays(np.float64, shape, elements=values))

    s = Settings(
        projections=draw(st.booleans()),
        scale=draw(st.booleans()),
        mask=draw(st.sampled_from(masks)),
        positional=draw(st.sampled_from(positional)),
        window=draw(st.integers(1, 7)),
    )
    return Scenario(
        tokens=tuple(f"t{i}" for i in range(n)),
        X=mat(n, d_model),
        W_Q=mat(h, d_model, d_k),
        W_K=mat(h, d_model, d_k),
        W_V=mat(h, d_model, d_k),
        W_O=mat(h * d_k, d_model),
        settings=s,
    )


@settings(max_examples=150, deadline=None)
@given(scenarios())
def test_rows_sum_to_one_and_masks_hold(s):
    r = compute(s)
    future = np.triu(np.ones((s.n, s.n), bool), 1)
    if s.settings.mask == "drop-after-softmax":
        assert (r.weights.sum(axis=-1) <= 1 + 1e-12).all()
        assert (r.weights[:, future] == 0).all()
    else:
        np.testing.assert_allclose(r.weights.sum(axis=-1), 1.0, atol=1e-12)
    if s.settings.mask == "causal":
        assert (r.weights[:, future] == 0).all()
        assert (r.leak == 0).all()
    if s.settings.mask == "causal-zero":
        # Every row but the last has a future key with score 0, so weight exp(0 − m) > 0,
        # where float64 holds exp(−m) at all (its largest score m under about 745).
        representable = r.masked.max(axis=-1)[:, :-1] < 700
        assert (r.leak[:, :-1][representable] > 0).all()
    if s.settings.mask == "sliding-window":
        i, j = np.indices((s.n, s.n))
        outside = (j > i) | (j <= i - s.settings.window)
        assert (r.weights[:, outside] == 0).all() and (r.leak == 0).all()
    assert (r.weights >= 0).all() and not r.empty_rows.any()
    np.testing.assert_allclose(r.row_sum, r.weights.sum(axis=-1), atol=1e-12)


@settings(max_examples=100, deadline=None)
@given(
    hnp.arrays(
        np.float64,
        st.tuples(st.integers(1, 3), st.integers(1, 5), st.integers(1, 5)),
        elements=values,
    ),
    st.floats(-50, 50),
)
def test_adding_a_constant_to_a_row_changes_no_weight(S, c):
    shift = np.arange(S.shape[1])[None, :, None] * c  # a different constant per row
    a, *_ = softmax_rows(S)
    b, *_ = softmax_rows(S + shift)
    np.testing.assert_allclose(a, b, atol=1e-12)


@settings(max_examples=100, deadline=None)
@given(scenarios(masks=("none",), positional=("none",)), st.randoms(use_true_random=False))
def test_without_mask_or_position_permuting_tokens_permutes_outputs(s, rnd):
    order = list(range(s.n))
    rnd.shuffle(order)
    a = compute(s)
    b = compute(permute_tokens(s, order))
    np.testing.assert_allclose(b.final, a.final[order], atol=1e-12)


@settings(max_examples=60, deadline=None)
@given(scenarios())
def test_numpy_torch_and_sdpa_agree(s):
    pytest.importorskip("torch")
    from attnviz.core.maths.torch_engine import cross_check

    c = cross_check(s, "cpu", "float64")
    assert c.torch_diff < 1e-12
    if s.settings.mask in ("none", "causal", "sliding-window", "custom"):
        assert c.sdpa_diff is not None and c.sdpa_diff < 1e-12
    else:
        assert c.sdpa_diff is None and c.sdpa_note


@settings(max_examples=150, deadline=None)
@given(scenarios(), st.data())
def test_explanation_recomputes_the_cell(s, data):
    r = compute(s)
    name = data.draw(st.sampled_from(HEAD_MATRICES + LAYER_MATRICES))
    head = data.draw(st.integers(0, r.n_heads - 1)) if name in HEAD_MATRICES else None
    m = r.matrix(name, head)
    i = data.draw(st.integers(0, m.shape[0] - 1))
    j = data.draw(st.integers(0, m.shape[1] - 1))
    e = explain(s, r, name, head, i, j)
    if np.isneginf(m[i, j]):
        assert e.value == -np.inf
    else:
        assert e.value == pytest.approx(m[i, j], abs=1e-12)
    if e.terms and name not in ("weights", "X"):
        # Sums of products: the terms' values are their factors multiplied.
        for t in e.terms:
            if len(t.factors) == 2 and name != "final":
                assert t.value == pytest.approx(t.factors[0] * t.factors[1], abs=1e-15)


@settings(max_examples=100, deadline=None)
@given(scenarios(), st.data())
def test_a_result_made_from_the_one_before_an_edit_matches_a_full_compute(s, data):
    from attnviz.core.maths.reuse import Base, Plan

    prev = compute(s)
    edited = s
    for _ in range(data.draw(st.integers(1, 4))):
        name = data.draw(st.sampled_from(["X", "W_Q", "W_K", "W_V", "W_O"]))
        head = data.draw(st.integers(0, s.n_heads - 1)) if name.startswith("W_") else None
        m = edited.matrix(name, head) if name != "W_O" else edited.W_O
        i = data.draw(st.integers(0, m.shape[0] - 1))
        j = data.draw(st.integers(0, m.shape[1] - 1))
        edited = edited.with_cells(
            name, head if name != "W_O" else None, i, j, [[data.draw(values)]]
        )
    full = compute(edited)
    # The shown head first, as the window asks, then the whole layer.
    plan = Plan(edited, Base(s, prev))
    first = data.draw(st.integers(0, full.n_heads - 1))
    shown = plan.head_result(first)
    for name in ("Q", "weights", "output"):
        np.testing.assert_allclose(shown.matrix(name, first), full.matrix(name, first), atol=1e-12)
    fast = plan.result()
    for name in ("Q", "K", "V", "weights", "output", "final", "leak", "entropy"):
        a, b = getattr(fast, name), getattr(full, name)
        np.testing.assert_allclose(a, b, atol=1e-12, err_msg=name)
    np.testing.assert_array_equal(np.isneginf(fast.masked), np.isneginf(full.masked))
