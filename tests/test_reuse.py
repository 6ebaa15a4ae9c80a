"""Exact reuse (attnviz.core.maths.reuse): after any chain of edits, a result made from
the one before equals compute() of the edited scenario, every field of every head.

compute() itself is checked against the independent loops of variant_reference.py
(test_variants_engine.py); here the chains end on it, and on that reference."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scenario_strategies import VARIANTS, make, scenarios
from variant_reference import FIELDS, assert_matches_reference

from attnviz.core.maths.forward import compute
from attnviz.core.maths.results import Result
from attnviz.core.maths.reuse import Base, Plan
from attnviz.core.maths.scenario import (
    HEAD_NAMES,
    MASKS,
    POSITIONALS,
    Scenario,
    ScenarioError,
    insert_token,
    move_token,
    remove_token,
    resized,
)

ROWS = ("leak", "row_sum", "entropy", "empty_rows", "sink", "m", "Z")


def _largest(a: np.ndarray) -> float:
    finite = np.abs(a[np.isfinite(a)])
    return float(finite.max()) if finite.size else 0.0


def assert_same(got: Result, want: Result) -> None:
    """Every field of every head, concat and final, to 1e-12 of the size of the numbers
    they are made from: a product of a few rows (an edited row projected again) may
    round otherwise than the same rows of a product of all (BLAS), and a score rounded
    u·|S| apart moves its weight by that share, where |S| is the head's largest scaled
    score. A row or a head taken from the wrong scenario is off by far more."""
    assert got.n_heads == want.n_heads and got.tokens == want.tokens
    sizes = []
    for h in range(want.n_heads):
        size = 1.0 + _largest(want.heads[h].scaled)
        sizes.append(size)
        for name in (*FIELDS, *ROWS):
            expected = np.asarray(getattr(want.heads[h], name), dtype=float)
            np.testing.assert_allclose(
                np.asarray(getattr(got.heads[h], name), dtype=float),
                expected,
                rtol=1e-12,
                atol=1e-12 * size * (1.0 + _largest(expected)),
                err_msg=f"head {h + 1} {name}",
            )
    size = max(sizes)
    for name in ("concat", "final"):
        expected = getattr(want, name)
        atol = 1e-12 * size * (1.0 + _largest(expected))
        np.testing.assert_allclose(getattr(got, name), expected, rtol=1e-12, atol=atol)


# Random edits of every kind ---------------------------------------------------------------


def edit_cells(s: Scenario, rng: np.random.Generator) -> Scenario:
    """A cell, a row or a block of one matrix: any value, or a large one (set and then
    taken back by a later edit, where rescaling would have cancelled)."""
    names = ["X", "W_O", "b_O", *HEAD_NAMES, *(["X_kv"] if s.cross else [])]
    if s.settings.mask == "custom":
        names.append("mask_matrix")
    name = str(rng.choice(names))
    head = None
    if name in HEAD_NAMES:
        head = int(rng.integers(len(getattr(s, name))))
    target = s.matrix(name, head)
    rows = int(rng.integers(1, target.shape[0] + 1)) if rng.random() < 0.2 else 1
    cols = int(rng.integers(1, target.shape[1] + 1))
    row = int(rng.integers(target.shape[0] - rows + 1))
    col = int(rng.integers(target.shape[1] - cols + 1))
    if name == "mask_matrix":
        values = (rng.random((rows, cols)) < 0.5).astype(float)
    elif rng.random() < 0.1:
        values = np.full((rows, cols), float(rng.choice([1e4, -1e4, 300.0])))
    else:
        values = rng.normal(size=(rows, cols))
    return s.with_cells(name, head, row, col, values)


def edit_settings(s: Scenario, rng: np.random.Generator) -> Scenario:
    """One setting: the mask, positions, scale, soft-cap, sinks, dropout, a head off."""
    H = s.n_heads
    choices = {
        "mask": lambda: {"mask": str(rng.choice(MASKS))},
        "positional": lambda: {"positional": str(rng.choice(POSITIONALS))},
        "scale": lambda: {"scale": not s.settings.scale},
        "softcap": lambda: {"softcap": None if s.settings.softcap else float(rng.uniform(0.5, 5))},
        "sinks": lambda: {"sinks": None if s.settings.sinks else tuple(rng.normal(size=H))},
        "dropout": lambda: {"dropout": 0.0 if s.settings.dropout else 0.25},
        "window": lambda: {"window": int(rng.integers(1, 6))},
        "alignment": lambda: {
            "causal_alignment": "top-left"
            if s.settings.causal_alignment == "bottom-right"
            else "bottom-right"
        },
        "qk_norm": lambda: {"qk_norm": "none" if s.settings.qk_norm == "rms" else "rms"},
        "ablated": lambda: {
            "ablated": tuple(sorted(set(s.settings.ablated) ^ {int(rng.integers(H))}))
        },
    }
    key = str(rng.choice(list(choices)))
    try:
        return s.with_settings(**choices[key]())
    except ScenarioError:  # (e.g. RoPE over more dims than d_k): no such edit
        return s


def edit_tokens(s: Scenario, rng: np.random.Generator) -> Scenario:
    """A label, or a token inserted, removed or moved."""
    i = int(rng.integers(s.n))
    kind = rng.integers(4)
    try:
        if kind == 0:
            return s.with_tokens((*s.tokens[:i], f"w{rng.integers(99)}", *s.tokens[i + 1 :]))
        if kind == 1 and s.n < 64:
            return insert_token(s, i, "new", rng.normal(size=s.d_model))
        if kind == 2:
            return remove_token(s, i)
        return move_token(s, i, int(rng.integers(s.n)))
    except ScenarioError:  # (the last token cannot go)
        return s


def edit_sizes(s: Scenario, rng: np.random.Generator) -> Scenario:
    """d_k or the number of heads."""
    try:
        if rng.random() < 0.5:
            return resized(s, d_k=int(rng.integers(1, 6)))
        return resized(s, heads=int(rng.integers(1, 5)))
    except ScenarioError:
        return s


def random_edit(s: Scenario, rng: np.random.Generator) -> Scenario:
    """Mostly cells (what a user does most), sometimes anything else."""
    roll = rng.random()
    if roll < 0.75:
        return edit_cells(s, rng)
    if roll < 0.9:
        return edit_settings(s, rng)
    if roll < 0.97:
        return edit_tokens(s, rng)
    return edit_sizes(s, rng)


def next_result(base: Base, s: Scenario, rng: np.random.Generator) -> Result:
    """s computed from base as the window does: sometimes a head first (the shown head,
    its stages kept), then the layer."""
    plan = Plan(s, base)
    if rng.random() < 0.5:
        shown = int(rng.integers(s.n_heads if s.settings.projections else 1))
        first = plan.head_result(shown)
        assert first.index == shown
    return plan.result()


def run_chain(s: Scenario, edits: int, seed: int, check_every: int = 1) -> tuple[Scenario, Result]:
    """edits random edits, each result made from the one before; checked against
    compute() every check_every edits and at the end. The last scenario and result."""
    rng = np.random.default_rng(seed)
    result = compute(s)
    for step in range(edits):
        edited = random_edit(s, rng)
        result, s = next_result(Base(s, result), edited, rng), edited
        if step % check_every == 0 or step == edits - 1:
            assert_same(result, compute(s))
    return s, result


# The chains -------------------------------------------------------------------------------

CHAIN = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@CHAIN
@given(s=scenarios(tokens=(1, 12)), seed=st.integers(0, 2**32 - 1))
def test_a_chain_of_random_edits_of_any_scenario_equals_compute(s, seed):
    last, result = run_chain(s, 30, seed)
    assert_matches_reference(last, result)


@pytest.mark.parametrize("variant", VARIANTS)
def test_500_edits_of_every_kind_under_each_variant_end_on_compute(variant):
    # 8 to 64 tokens: where the old engine's row thresholds switched strategy
    s = make(n=24, H=4, G=2, d_model=6, d_k=4, seed=len(variant), **VARIANTS[variant])
    run_chain(s, 500, seed=sum(map(ord, variant)), check_every=10)


@pytest.mark.parametrize("n", [8, 9, 33, 64])
def test_500_cell_edits_at_the_old_thresholds_end_on_compute(n):
    rng = np.random.default_rng(n)
    s = make(n=n, H=4, G=4, d_model=8, d_k=4, seed=n)
    result = compute(s)
    for _ in range(500):
        edited = edit_cells(s, rng)
        result, s = Plan(edited, Base(s, result)).result(), edited
    assert_same(result, compute(s))
    assert_matches_reference(s, result)


def test_a_cross_attention_chain_ends_on_compute():
    s = make(n=10, m=17, H=4, G=2, seed=3, causal_alignment="bottom-right", positional="rope")
    run_chain(s, 500, seed=11, check_every=25)


# What is reused, seen from outside --------------------------------------------------------


def test_a_result_from_a_base_under_another_mask_equals_compute():
    s = make(n=12, seed=5)
    base = Base(s, compute(s))
    for mask in MASKS:
        other = s.with_settings(mask=mask)
        assert_same(Plan(other, base).result(), compute(other))


def test_a_head_first_then_the_layer_is_the_same_head():
    s = make(n=12, seed=6, positional="rope")
    edited = s.with_cells("X", None, 3, 1, np.array([[2.5]]))
    plan = Plan(edited, Base(s, compute(s)))
    first = plan.head_result(2)
    whole = plan.result()
    np.testing.assert_array_equal(first.one.weights, whole.heads[2].weights)
    np.testing.assert_allclose(first.one.scores, compute(edited).heads[2].scores, rtol=1e-12)


def test_a_head_result_holds_its_head_alone():
    s = make(n=5, seed=2)
    first = Plan(s, None).head_result(1)
    with pytest.raises(KeyError, match="head 2 alone"):
        first.head(0)
    with pytest.raises(KeyError, match="not the mix"):
        first.matrix("final")


def test_an_edit_of_w_v_keeps_the_weights_and_equals_compute_under_dropout():
    s = make(n=9, seed=4, dropout=0.3, dropout_seed=2, mask="drop-after-softmax")
    edited = s.with_cells("W_V", 1, 2, 0, np.array([[3.0]]))
    got = Plan(edited, Base(s, compute(s))).result()
    assert_same(got, compute(edited))
    assert_matches_reference(edited, got)


def test_a_base_of_another_shape_is_not_used():
    s = make(n=6, seed=8)
    bigger = insert_token(s, 2, "x", np.ones(s.d_model))
    assert_same(Plan(bigger, Base(s, compute(s))).result(), compute(bigger))


def test_token_labels_alone_reuse_everything_and_name_the_new_tokens():
    s = make(n=4, seed=9)
    renamed = dataclasses.replace(s, tokens=("a", "b", "c", "d"))
    got = Plan(renamed, Base(s, compute(s))).result()
    assert got.tokens == ("a", "b", "c", "d")
    assert_same(got, compute(renamed))
