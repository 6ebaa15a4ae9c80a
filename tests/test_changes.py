"""changes_between: what differs between two scenarios, in the terms of what a result of
one can reuse for the other (the edits made, by hand; and the result made from the one
before equals the reference)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from variant_reference import assert_matches_reference, random_scenario

from attnviz.core.maths.changes import Changes, changes_between
from attnviz.core.maths.forward import compute
from attnviz.core.maths.reuse import Base, Plan
from attnviz.core.maths.scenario import insert_token, with_kv_heads

# (name, head or None); heads 0–3 query 0–1 key/value (GQA 4 over 2), cross-attention
EDITS = [
    ("X", None),
    ("X_kv", None),
    ("W_Q", 0),
    ("W_Q", 3),
    ("b_Q", 1),
    ("q_norm", 2),
    ("W_K", 1),
    ("b_K", 0),
    ("k_norm", 1),
    ("W_V", 0),
    ("b_V", 1),
    ("W_O", None),
    ("b_O", None),
]


def scenario(mask: str = "causal"):
    rng = np.random.default_rng(7)
    return random_scenario(rng, 6, 5, 8, 4, 2, 3, mask=mask, positional="rope")


@given(
    edits=st.lists(
        st.tuples(st.sampled_from(EDITS), st.integers(0, 40), st.integers(0, 40)),
        max_size=6,
    ),
    mask=st.sampled_from(["causal", "causal-zero", "none"]),
)
@settings(max_examples=60, deadline=None)
def test_the_changes_found_are_the_edits_made_and_reuse_gives_the_reference(edits, mask):
    old = scenario(mask)
    new, want = old, Changes()
    for (name, head), row, col in edits:
        shape = new.matrix(name, head).shape
        row, col = row % shape[0], col % shape[1]
        new = new.with_cells(name, head, row, col, np.array([[1.5 + row + col / 8]]))
        # by hand: what each matrix's edit changes
        if name == "X":
            want.x_rows.add(row)
        elif name == "X_kv":
            want.kv_rows.add(row)
        elif name in ("W_Q", "b_Q", "q_norm"):
            want.q_heads.add(head)
        elif name in ("W_V", "b_V"):
            want.v_heads.add(head)
        elif name in ("W_K", "b_K", "k_norm"):
            want.k_heads.add(head)
        else:
            want.mix = True
    assert changes_between(old, new) == want
    assert_matches_reference(new, Plan(new, Base(old, compute(old))).result())


def test_a_cell_set_to_the_value_it_had_is_no_change():
    old = scenario()
    same = old.with_cells("W_K", 1, 2, 1, old.matrix("W_K", 1)[2:3, 1:2])
    same = same.with_cells("X", None, 3, 0, old.X[3:4, 0:1])
    assert changes_between(old, same).none


def test_settings_are_told_apart_by_what_depends_on_them():
    old = scenario()
    assert changes_between(old, old.with_settings(mask="causal-zero")) == Changes(attention=True)
    assert changes_between(old, old.with_settings(ablated=(1,))) == Changes(mix=True)
    assert changes_between(old, old.with_settings(qk_norm="rms")).projections
    renamed = old.with_tokens(tuple(f"w{i}" for i in range(old.n)))
    assert changes_between(old, renamed).none  # (labels change no number)


@pytest.mark.parametrize(
    "other",
    [
        lambda s: s.with_settings(mask="causal-zero"),
        lambda s: insert_token(s, 2, "new"),
        lambda s: with_kv_heads(s, 4),
    ],
    ids=["settings", "a token", "key/value heads"],
)
def test_anything_but_cells_still_gives_the_reference(other):
    old = scenario()
    new = other(old)
    assert not changes_between(old, new).none
    assert_matches_reference(new, Plan(new, Base(old, compute(old))).result())
