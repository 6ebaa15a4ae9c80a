"""The NumPy engine on the worked example, against hand arithmetic and a plain reference."""

import dataclasses
import math
from collections.abc import Iterable

import numpy as np
import pytest
import reference as ref
from variant_reference import random_scenario

from attnviz.core.maths.forward import compute
from attnviz.core.maths.positions import sinusoidal
from attnviz.core.maths.reuse import Base, Plan
from attnviz.core.maths.scenario import Scenario, Settings
from attnviz.core.maths.scoring import softmax_rows
from attnviz.core.presets import make_preset, worked_example


def test_worked_example_by_hand():
    r = compute(worked_example())
    # Head 1, token "she": x = [0.9, 0.1, -0.3, 0.2].
    # Q = x·W_Q[:,1] = 0.09 + 0.07 - 0.09 - 0.18 = -0.11
    #     x·W_Q[:,2] = 0.27 - 0.09 + 0.21 + 0.14 = 0.53
    assert r.Q[0, 0] == pytest.approx([-0.11, 0.53])
    # K = 0.81 + 0.06 + 0.27 + 0.04 = 1.18;  -0.81 - 0.03 - 0.21 - 0.08 = -1.13
    assert r.K[0, 0] == pytest.approx([1.18, -1.13])
    # S = -0.11·1.18 + 0.53·(-1.13) = -0.1298 - 0.5989 = -0.7287; scaled by √2
    assert r.scores[0, 0, 0] == pytest.approx(-0.7287)
    assert r.scaled[0, 0, 0] == pytest.approx(-0.7287 / math.sqrt(2))
    # Under the causal mask "she" sees only itself: weight 1, output = its value row.
    assert r.weights[0, 0].tolist() == [1.0, 0.0, 0.0, 0.0]
    # V = 0.45 + 0.01 + 0.09 + 0.14 = 0.69;  -0.18 + 0.06 - 0.12 + 0.02 = -0.22
    assert r.output[0, 0] == pytest.approx([0.69, -0.22])
    assert np.isneginf(r.masked[0, 0, 1:]).all()


@pytest.mark.parametrize("mask", ["none", "causal", "causal-zero", "drop-after-softmax"])
@pytest.mark.parametrize("scale", [True, False])
def test_worked_example_against_reference(mask, scale):
    r = compute(worked_example(Settings(mask=mask, scale=scale)))
    weights, concat, final = ref.multi_head(ref.X, ref.W_Q, ref.W_K, ref.W_V, ref.W_O, mask, scale)
    for h in range(2):
        np.testing.assert_allclose(r.weights[h], weights[h], atol=1e-14)
    np.testing.assert_allclose(r.concat, concat, atol=1e-14)
    np.testing.assert_allclose(r.final, final, atol=1e-14)


def test_heads_concatenated_in_order():
    r = compute(worked_example())
    np.testing.assert_array_equal(r.concat[:, 0:2], r.output[0])
    np.testing.assert_array_equal(r.concat[:, 2:4], r.output[1])


def test_stage_one_has_one_head_of_x():
    r = compute(worked_example(Settings(projections=False, scale=False, mask="none")))
    X = ref.X
    S = X @ X.T
    e = np.exp(S - S.max(axis=1, keepdims=True))
    W = e / e.sum(axis=1, keepdims=True)
    assert r.n_heads == 1
    np.testing.assert_allclose(r.scores[0], S, atol=1e-15)
    np.testing.assert_allclose(r.final, W @ X, atol=1e-15)
    np.testing.assert_array_equal(r.final, r.concat)


def test_leak_row_sum_and_entropy_per_mask():
    causal = compute(worked_example(Settings(mask="causal")))
    zero = compute(worked_example(Settings(mask="causal-zero")))
    drop = compute(worked_example(Settings(mask="drop-after-softmax")))
    _, W_zero, _ = ref.head(ref.X, ref.W_Q[0], ref.W_K[0], ref.W_V[0], "causal-zero")
    assert causal.leak.max() == 0.0
    np.testing.assert_allclose(zero.leak[0], np.triu(W_zero, 1).sum(axis=1), atol=1e-15)
    assert (zero.leak[:, :-1] > 0).all() and (zero.leak[:, -1] == 0).all()
    np.testing.assert_allclose(causal.row_sum, 1.0, atol=1e-15)
    assert (drop.row_sum[:, :-1] < 1).all()
    # Entropy of the first row under causal is 0 (one visible key); last row by hand.
    assert causal.entropy[:, 0] == pytest.approx([0.0, 0.0], abs=1e-12)
    w = causal.weights[0, 3]
    assert causal.entropy[0, 3] == pytest.approx(-(w * np.log(w)).sum())


def test_last_row_unchanged_by_causal_mask():
    none = compute(worked_example(Settings(mask="none")))
    causal = compute(worked_example(Settings(mask="causal")))
    np.testing.assert_allclose(none.weights[:, -1], causal.weights[:, -1], atol=1e-15)


def test_sinusoidal_encoding_added_to_x():
    r = compute(worked_example(Settings(positional="sinusoidal")))
    # pos 1, d_model 4: [sin(1), cos(1), sin(1/100), cos(1/100)]
    pe1 = [math.sin(1), math.cos(1), math.sin(0.01), math.cos(0.01)]
    np.testing.assert_allclose(r.X[1] - ref.X[1], pe1, atol=1e-15)
    np.testing.assert_allclose(r.X[0] - ref.X[0], [0, 1, 0, 1], atol=1e-15)
    assert sinusoidal(3, 5).shape == (3, 5)


def test_sinusoidal_rows_are_the_tables_rows_and_an_x_edit_turns_only_its_own():
    """Any rows of the encoding are those rows of the whole table, bit for bit, each cell
    by the formula; after an X edit, a result made from the one before holds the edited
    row plus its encoding and equals a compute of the edited scenario."""
    table = sinusoidal(50, 7)
    np.testing.assert_allclose(table, table_of(50, 7), atol=1e-15)
    np.testing.assert_array_equal(sinusoidal(50, 7, [3, 49, 0]), table[[3, 49, 0]])
    s = make_preset("gpt2-small", n=40).with_settings(positional="sinusoidal")
    edited = s.with_cells("X", None, 17, 5, [[2.5]])
    got = Plan(edited, Base(s, compute(s))).result()
    np.testing.assert_array_equal(got.X[17], edited.X[17] + table_of(40, s.d_model)[17])
    want = compute(edited)
    np.testing.assert_array_equal(got.X, want.X)
    np.testing.assert_allclose(got.final, want.final, rtol=1e-12, atol=1e-12)


def table_of(n: int, d: int) -> np.ndarray:
    """The sinusoidal table by its formula, cell by cell."""
    p, i = np.meshgrid(np.arange(n), np.arange(d), indexing="ij")
    angle = p / 10000.0 ** (2 * (i // 2) / d)
    return np.where(i % 2 == 0, np.sin(angle), np.cos(angle))  # type: ignore[no-any-return]


def test_dropout_is_seeded_and_rescales():
    s = worked_example(Settings(mask="none", dropout=0.5, dropout_seed=7))
    a, b = compute(s), compute(s)
    np.testing.assert_array_equal(a.weights, b.weights)
    plain = compute(worked_example(Settings(mask="none")))
    kept = a.keep
    assert kept is not None and 0 < kept.sum() < kept.size
    np.testing.assert_allclose(a.weights, plain.weights * kept / 0.5, atol=1e-15)
    other = compute(s.with_settings(dropout_seed=8))
    assert not np.array_equal(other.keep, kept)


def test_fully_masked_row_is_flagged_not_nan():
    S = np.array([[[0.5, -np.inf], [-np.inf, -np.inf]]])
    w, _, _, empty = softmax_rows(S)
    assert empty.tolist() == [[False, True]]
    assert w.tolist() == [[[1.0, 0.0], [0.0, 0.0]]]


def test_softmax_survives_large_scores():
    # exp(1000) overflows; subtracting the row maximum first must not.
    w, *_ = softmax_rows(np.array([[[1000.0, 999.0, 0.0]]]))
    e = np.exp([0.0, -1.0, -1000.0])
    np.testing.assert_allclose(w[0, 0], e / e.sum())


def test_brief_saturation_example():
    w, *_ = softmax_rows(np.array([[[2.0, 1.0, 0.0, -1.0]]]))
    np.testing.assert_allclose(w[0, 0], [0.64, 0.24, 0.09, 0.03], atol=0.005)
    w8, *_ = softmax_rows(np.array([[[16.0, 8.0, 0.0, -8.0]]]))
    assert w8[0, 0, 0] > 0.999


def test_result_is_read_only():
    r = compute(worked_example())
    for name in ("Q", "scores", "weights", "final", "leak"):
        with pytest.raises(ValueError):
            getattr(r, name)[0] = 1.0


def test_ablated_head_leaves_the_mix():
    r = compute(worked_example(Settings(ablated=(1,))))
    _, concat, final = ref.multi_head(ref.X, ref.W_Q, ref.W_K, ref.W_V, ref.W_O)
    np.testing.assert_allclose(r.concat, concat, atol=1e-15)  # head 2 still computed
    only_head_1 = concat[:, :2] @ ref.W_O[:2]
    np.testing.assert_allclose(r.final, only_head_1, atol=1e-15)
    assert not np.allclose(r.final, final)


@pytest.mark.parametrize("with_sink", [False, True])
def test_softmax_skipping_each_rows_trailing_minus_infinity_equals_the_whole(with_sink):
    """Rows in blocks, each cut where its −∞ begin (a causal mask, a row hidden whole):
    the weights and statistics of the plain softmax, computed here in a few lines."""
    from attnviz.core.maths.scoring import softmax_in_place

    rng = np.random.default_rng(4)
    n = 300  # more than two blocks of rows
    scores = rng.normal(0, 3, (2, n, n))
    future = np.triu(np.ones((n, n), dtype=bool), 1)
    future[150] = True  # a row that sees no key
    scores[:, future] = -np.inf
    sink = np.array([[0.5], [-1.0]]) if with_sink else None
    ends = np.array([0 if future[i].all() else i + 1 for i in range(n)])

    m = scores.max(axis=-1)
    if with_sink:
        m = np.maximum(m, sink)
    empty = np.isneginf(m)
    m_safe = np.where(empty, 0.0, m)
    e = np.exp(scores - m_safe[..., None])
    Z = e.sum(axis=-1) + (np.exp(sink - m_safe) if with_sink else 0.0)
    want = e / np.where(empty, 1.0, Z)[..., None]

    got = scores.copy()
    got_m, got_Z, got_empty = softmax_in_place(got, sink, ends)
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-15)
    np.testing.assert_array_equal(got[:, future], 0.0)
    np.testing.assert_allclose(got_Z, Z, rtol=1e-13)
    np.testing.assert_array_equal(got_empty, empty)
    np.testing.assert_array_equal(got_m, m_safe)


def test_the_mix_after_edits_of_single_heads_is_concat_times_w_o_by_hand():
    rng = np.random.default_rng(11)
    n, d_model, H, d_k = 5, 12, 8, 2
    # 8 query heads over 4 key/value heads: W_K and W_V edits change a group of two
    s = random_scenario(rng, n, n, d_model, H, 4, d_k, mask="causal", ablated=(3,))
    s = dataclasses.replace(s, b_O=rng.normal(size=(1, d_model)))

    def by_hand(r, s):  # concat and final from the heads' outputs, in plain NumPy
        concat = np.concatenate([h.output for h in r.heads], axis=1)
        kept = np.repeat([h not in s.settings.ablated for h in range(H)], d_k)
        return concat, concat[:, kept] @ s.W_O[kept] + s.b_O

    r = compute(s)
    edits = [("W_V", 1), ("W_Q", 3), ("W_K", 0), ("W_O", None), ("X", None)]
    for k in range(40):
        name, head = edits[k % len(edits)]
        shape = s.matrix(name, head).shape
        edited = s.with_cells(name, head, k % shape[0], k % shape[1], [[0.3 * k - 1.0]])
        r, s = Plan(edited, Base(s, r)).result(), edited
        concat, final = by_hand(r, s)
        np.testing.assert_allclose(r.concat, concat, rtol=0, atol=1e-12)
        np.testing.assert_allclose(r.final, final, rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    "name, head",
    [("X", None), ("W_Q", 1), ("W_K", 0), ("W_V", 1), ("b_Q", 0), ("W_O", None), ("b_O", None)],
)
@pytest.mark.parametrize("mask", ["causal", "causal-zero", "none"])
def test_a_large_value_set_and_taken_back_leaves_no_rounding_error(name, head, mask):
    """A cell of 1e5 set and put back, each result made from the one before: nothing is
    carried from the large value (an engine that added changes kept an error the size of
    the change: 1.7e-10 in final after W_Q, 6.5e-10 after W_O)."""
    rng = np.random.default_rng(3)
    s = random_scenario(rng, 8, 8, 8, 4, 2, 4, mask=mask, positional="rope")
    r = compute(s)
    shape = s.matrix(name, head).shape
    row, col = min(2, shape[0] - 1), 1
    for value in (1e5, -3e4, 1e3, 0.25):
        new = s.with_cells(name, head, row, col, np.array([[value]]))
        r, s = Plan(new, Base(s, r)).result(), new
    want = compute(s)
    np.testing.assert_allclose(r.final, want.final, rtol=0, atol=1e-12)
    for got, expected in zip(r.heads, want.heads, strict=True):
        for field in ("Q", "K", "V", "weights", "output"):
            np.testing.assert_allclose(
                getattr(got, field), getattr(expected, field), rtol=0, atol=1e-12
            )


def _dominant_key(n: int = 12) -> Scenario:
    """Row i's logit for key j is x_i x_j / 0.03 (column 0 of X): x_j in every row but
    row 2, for x is 0.03 but at key 2, whose value the test sets; every value row is
    [0, 1], so no output cancels."""
    X = np.ones((n, 2))
    X[:, 0] = 0.03
    return Scenario(
        tokens=tuple(f"t{i}" for i in range(n)),
        X=X,
        W_Q=np.eye(2)[None],
        W_K=np.array([[[1.0, 0.0], [0.0, 0.0]]]) / 0.03,  # k_j = x_j / 0.03: q_i·k_j = x_j
        W_V=np.array([[[0.0, 0.0], [0.0, 1.0]]]),
        W_O=np.eye(2),
        settings=Settings(scale=False),
    )


def _softmax_by_hand(s: Scenario) -> np.ndarray:
    logits = np.outer(s.X[:, 0], s.X[:, 0]) / 0.03  # q_i · k_j
    logits[np.triu_indices(s.n, 1)] = -np.inf
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)  # type: ignore[no-any-return]


def _set_key_2_step_by_step(s: Scenario, values: Iterable[float]) -> None:
    """Key 2 of _dominant_key set to each value in turn, each result made from the one
    before: every step within 1e-12 (relative) of a plain NumPy softmax, the entropy of
    the rows past key 2 too."""
    r = compute(s)
    for value in values:
        edited = s.with_cells("X", None, 2, 0, [[value]])
        r, s = Plan(edited, Base(s, r)).result(), edited
        want = _softmax_by_hand(s)
        np.testing.assert_allclose(r.weights[0], want, rtol=1e-12, atol=1e-300)
        p = want[3:]  # −Σ p log p by hand
        entropy = -(p * np.log(np.where(p > 0, p, 1.0))).sum(axis=1)
        np.testing.assert_allclose(r.heads[0].entropy[3:], entropy, rtol=1e-12, atol=1e-14)


def test_a_key_raised_then_lowered_step_by_step_keeps_every_row_exact():
    """Key 2's logit raised by 0.6 a step from 0.03 to 40, then lowered to −5: the steps
    where rescaling other rows lost digits (a key that held a row's weight, taken back)."""
    _set_key_2_step_by_step(
        _dominant_key(), [*np.arange(0.6, 40.0, 0.6), *np.arange(39.4, -5.0, -0.6)]
    )


@pytest.mark.parametrize("mask", ["drop-after-softmax", "causal"])
def test_a_dominant_key_raised_under_reweighting_keeps_its_rows_exact(mask):
    """Key 3 holds the later rows' weight (logits ~1e3) and is raised further: within
    2e-14 of compute()."""
    rng = np.random.default_rng(32)
    s = random_scenario(rng, 16, 16, 6, 1, 1, 4, mask=mask)
    col = int(rng.integers(6))
    before = s.with_cells("X", None, 3, col, [[200.0]])
    after = before.with_cells("X", None, 3, col, [[201.0]])
    got, want = Plan(after, Base(before, compute(before))).result(), compute(after)
    np.testing.assert_allclose(got.weights, want.weights, rtol=0, atol=2e-14)
