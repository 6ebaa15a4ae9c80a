"""What differs between two scenarios, in the terms of the engine's incremental update.

The compute service gathers ``Changes`` from the document's edits as they come;
``changes_between`` finds them by comparing two scenarios (unchanged matrices are the
very same arrays, so mostly by identity), for a result of one to be updated to the other.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from attnviz.core.maths.scenario import HEAD_NAMES, MATRIX_NAMES, Q_HEAD_NAMES, Scenario

VALUE_NAMES = ("W_V", "b_V")  # of a key/value head's matrices, those only its V reads


@dataclass
class Changes:
    """What changed in a scenario since a result was computed from it."""

    x_rows: set[int] = field(default_factory=set)
    heads: set[int] = field(default_factory=set)  # query heads' W_Q, b_Q, q_norm
    kv_heads: set[int] = field(default_factory=set)  # key/value heads' W_K, b_K, k_norm
    v_heads: set[int] = field(default_factory=set)  # key/value heads' W_V, b_V
    kv_rows: set[int] = field(default_factory=set)  # rows of X_kv
    w_o: bool = False  # W_O or b_O
    full: bool = False  # anything else: tokens, sizes, settings, the custom mask

    def note(self, name: str, head: int | None, rows: Iterable[int] = ()) -> None:
        """An edit of the given rows of matrix ``name`` (of one head, for a head's)."""
        if name == "X":
            self.x_rows.update(rows)
        elif name == "X_kv":
            self.kv_rows.update(rows)
        elif name in Q_HEAD_NAMES and head is not None:
            self.heads.add(head)
        elif name in VALUE_NAMES and head is not None:
            self.v_heads.add(head)
        elif name in HEAD_NAMES and head is not None:
            self.kv_heads.add(head)
        elif name in ("W_O", "b_O"):
            self.w_o = True
        else:  # the custom mask
            self.full = True


def changes_between(old: Scenario, new: Scenario) -> Changes:
    """What differs in new from old; ``full`` unless only cells of their matrices do."""
    changes = Changes()
    changes.full = (
        old.tokens != new.tokens
        or old.kv_tokens != new.kv_tokens
        or old.settings != new.settings
        or any(old.shape_of(name) != new.shape_of(name) for name in MATRIX_NAMES)
        or not same(old.mask_matrix, new.mask_matrix)
    )
    if changes.full:
        return changes
    for name in ("X", "X_kv"):
        a, b = getattr(old, name), getattr(new, name)
        if not same(a, b):
            changes.note(name, None, np.flatnonzero((a != b).any(axis=1)).tolist())
    for name in HEAD_NAMES:
        if old.array_id(name) != new.array_id(name):
            for head in range(new.shape_of(name)[0]):  # type: ignore[index]
                if not same(old.matrix(name, head), new.matrix(name, head)):
                    changes.note(name, head)
    if not (same(old.W_O, new.W_O) and same(old.b_O, new.b_O)):
        changes.note("W_O", None)
    return changes


def same(a: np.ndarray | None, b: np.ndarray | None) -> bool:
    """Equal: the same (read-only) array or memory, else compared."""
    if a is None or b is None:
        return a is b
    if a is b or (
        a.shape == b.shape
        and a.strides == b.strides
        and a.__array_interface__["data"] == b.__array_interface__["data"]
    ):
        return True  # (a head of a stack, seen through two views of it)
    return bool(np.array_equal(a, b))
