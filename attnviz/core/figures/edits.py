"""Where an edit changed a head's matrices, from the edit's record (changes_between):
the rows and columns of each view that may differ, so that a view redraws those alone
rather than comparing every cell. None: any cell may differ."""

from __future__ import annotations

import numpy as np

from attnviz.core.maths.changes import Changes
from attnviz.core.maths.scenario import Scenario

Lines = tuple[np.ndarray, np.ndarray]  # rows, columns


def _lines(rows: set[int], cols: set[int] | None = None) -> Lines:
    return np.array(sorted(rows), dtype=np.intp), np.array(sorted(cols or ()), dtype=np.intp)


def changed_in(c: Changes, s: Scenario, view: str, head: int) -> Lines | None:
    """The lines of query head ``head``'s view (of s, after changes c) that may differ
    from the same view before them; None when any may."""
    if c.reshaped or c.projections:
        return None
    g = s.kv_head_of(head) if s.settings.projections else 0
    queries = head in c.q_heads  # (its weights: every row of Q)
    keys = g in c.k_heads
    values = g in c.v_heads
    rows, key_rows = c.x_rows, c.kv_rows if s.cross else c.x_rows
    scores = None if queries or keys else _lines(rows, key_rows)
    moved = bool(rows or key_rows) or queries or keys or c.attention
    whole = {
        "Q": None if queries else _lines(rows),
        "Q_rot": None if queries else _lines(rows),
        "K": None if keys else _lines(key_rows),
        "K_rot": None if keys else _lines(key_rows),
        "V": None if values else _lines(key_rows),
        "scores": scores,
        "scaled": None if c.attention else scores,
        "masked": None if c.attention else scores,
        "alibi": None if c.attention else _lines(set()),
        "weights": None if moved else _lines(set()),
        "sink": None if moved else _lines(set()),
        "output": None if moved or values else _lines(set()),
    }
    return whole[view]
