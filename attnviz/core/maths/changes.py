"""What differs between two scenarios, in the terms of what a computation of one can
reuse for the other (attnviz.core.maths.reuse).

Unchanged matrices are usually the very same arrays (an edit shares what it did not
touch), so most comparisons end at identity; the others compare values.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from attnviz.core.maths.scenario import HEAD_NAMES, MATRIX_NAMES, Q_HEAD_NAMES, Scenario, Settings
from attnviz.core.maths.variants import query_offset

VALUE_NAMES = ("W_V", "b_V")  # of a key/value head's matrices, those only its V reads


@dataclass
class Changes:
    """What changed from one scenario to another. ``reshaped``: nothing computed for the
    one fits the other (a size, the projections switched, cross-attention switched)."""

    reshaped: bool = False
    x_rows: set[int] = field(default_factory=set)  # rows of X
    kv_rows: set[int] = field(default_factory=set)  # rows of X_kv
    q_heads: set[int] = field(default_factory=set)  # query heads' W_Q, b_Q, q_norm
    k_heads: set[int] = field(default_factory=set)  # key/value heads' W_K, b_K, k_norm
    v_heads: set[int] = field(default_factory=set)  # key/value heads' W_V, b_V
    projections: bool = False  # a setting the projections depend on (positions, QK-norm)
    attention: bool = False  # a setting a head's attention depends on, or the custom mask
    mix: bool = False  # W_O, b_O or the heads switched off

    def note(self, name: str, head: int | None, rows: set[int]) -> None:
        """An edit of the given rows of matrix ``name`` (of one head, for a head's)."""
        if name == "X":
            self.x_rows |= rows
        elif name == "X_kv":
            self.kv_rows |= rows
        elif name in Q_HEAD_NAMES and head is not None:
            self.q_heads.add(head)
        elif name in VALUE_NAMES and head is not None:
            self.v_heads.add(head)
        elif name in HEAD_NAMES and head is not None:
            self.k_heads.add(head)
        elif name in ("W_O", "b_O"):
            self.mix = True
        else:  # the custom mask
            self.attention = True

    @property
    def none(self) -> bool:
        return self == Changes()


def projection_settings(s: Scenario) -> tuple[object, ...]:
    """The settings Q, K and V as the scores see them depend on: positions (sinusoidal,
    RoPE and where the queries sit among the keys) and QK-norm."""
    st = s.settings
    return (
        st.positional,
        st.rope_base,
        st.rope_style,
        st.rope_dims,
        st.rope_frequencies,
        st.rope_factor,
        st.qk_norm,
        st.qk_norm_eps,
        query_offset(s.n, s.m, st.causal_alignment),
    )


def attention_settings(st: Settings) -> Settings:
    """The settings a head's attention depends on, given its projections: all but which
    heads the mix leaves out and the loss (only the gradients depend on it)."""
    plain = Settings()
    return st.replace(
        ablated=(), loss=plain.loss, loss_target=plain.loss_target, loss_cell=plain.loss_cell
    )


def changes_between(old: Scenario, new: Scenario) -> Changes:
    """What differs in new from old (token labels aside: they change no number)."""
    changes = Changes()
    changes.reshaped = (
        old.settings.projections != new.settings.projections
        or old.cross != new.cross
        or any(old.shape_of(name) != new.shape_of(name) for name in MATRIX_NAMES)
    )
    if changes.reshaped:
        return changes
    changes.projections = projection_settings(old) != projection_settings(new)
    changes.attention = attention_settings(old.settings) != attention_settings(
        new.settings
    ) or not all(same(getattr(old, k), getattr(new, k)) for k in ("mask_matrix", "relative_bias"))
    changes.mix = (
        old.settings.ablated != new.settings.ablated
        or not same(old.W_O, new.W_O)
        or not same(old.b_O, new.b_O)
    )
    for name in ("X", "X_kv"):
        a, b = getattr(old, name), getattr(new, name)
        if a is not b and a is not None and b is not None:
            changes.note(name, None, set(np.flatnonzero((a != b).any(axis=1)).tolist()))
    for name in HEAD_NAMES:
        for head in range(len(getattr(new, name))):
            if not same(old.matrix(name, head), new.matrix(name, head)):
                changes.note(name, head, set())
    if new.settings.qk_norm == "rms-whole":  # one head's Q (K) feeds every head's norm
        if changes.q_heads:
            changes.q_heads = set(range(new.n_heads))
        if changes.k_heads:
            changes.k_heads = set(range(new.kv_heads))
    return changes


def same(a: np.ndarray | None, b: np.ndarray | None) -> bool:
    """Equal: the very same (read-only) array, else compared."""
    if a is None or b is None:
        return a is b
    return a is b or bool(np.array_equal(a, b))
