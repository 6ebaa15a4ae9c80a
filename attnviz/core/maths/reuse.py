"""Exact reuse: after an edit, what a computation of the scenario before still holds
exactly, and the rest computed whole.

A ``Plan`` compares the new scenario with the ``Base`` (a scenario and its complete
result) and then makes each head on request, so that the shown head can come first and
a superseded computation can stop between heads:

- the input X with its positions: the base's, the edited rows made again;
- each head's projections (Q, K, V and Q, K as the scores see them): the base's when
  nothing they are made from changed; its edited rows projected again after an edit of
  rows of X; projected whole after an edit of the head's weights (V alone after W_V);
- each head's attention: the base's head when its projections and the settings are as
  before; its weights times the new V when V alone changed; else computed whole;
- the mix: the base's when no head changed, nor W_O, b_O or the heads switched off;
  else concat and one product with W_O.

Nothing is patched or rescaled: every number is computed from the edited scenario by
the same steps as ``forward.compute``, so a result equals compute(s) (to the rounding
of a product of fewer rows, ~1e-16).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from attnviz.core.maths.changes import Changes, changes_between
from attnviz.core.maths.forward import (
    attend,
    check_head,
    compute,
    context,
    final_of,
    head_count,
    inputs,
    keys,
    kv_of,
    queries,
    revalued,
    turns,
    values,
)
from attnviz.core.maths.positions import dropout_keep, sinusoidal
from attnviz.core.maths.results import Head, HeadResult, Result
from attnviz.core.maths.scenario import Scenario
from attnviz.core.maths.scoring import Rule

KeyParts = tuple[np.ndarray, np.ndarray, np.ndarray]  # K, V, K turned: one key/value head
QueryParts = tuple[np.ndarray, np.ndarray]  # Q, Q turned: one query head


@dataclass(frozen=True, eq=False)
class Base:
    """A complete computation an edit may reuse: a scenario and its result."""

    scenario: Scenario
    result: Result


class Plan:
    """How to compute scenario s from base, one head at a time (``head``), then the
    whole layer (``result``). Used by one thread at a time."""

    def __init__(self, s: Scenario, base: Base | None = None):
        self.s = s
        changes = None if base is None else changes_between(base.scenario, s)
        if changes is None or changes.reshaped or changes.projections:
            base = None  # (the inputs and every projection are made anew)
        if changes is not None and not s.settings.projections:
            changes.q_heads, changes.k_heads, changes.v_heads = set(), set(), set()
        self.base, self.changes = base, changes or Changes(reshaped=True)
        self.X, self.X_kv = self._inputs()
        kept = None if base is None or self.changes.attention else base.result.heads[0].rule
        self.rule = kept or Rule.of(s)  # (the same settings, sizes and mask: the same rule)
        self._keys: dict[int, KeyParts] = {}
        self._heads: dict[int, Head] = {}
        self._queries: tuple[np.ndarray, np.ndarray] | None = None  # every head's, at once
        self._all_keys: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    def _inputs(self) -> tuple[np.ndarray, np.ndarray]:
        """X with its positions, and the keys' input: the base's, edited rows made again."""
        s, base = self.s, self.base
        if base is None:
            return inputs(s)
        rows = sorted(self.changes.x_rows)
        X = base.result.X
        if rows and s.settings.positional == "sinusoidal":
            X = X.copy()
            X[rows] = s.X[rows] + sinusoidal(s.n, s.d_model, rows)
            X.flags.writeable = False
        elif rows:
            X = s.X
        return X, X if s.X_kv is None else s.X_kv

    # One head ---------------------------------------------------------------------------

    def head(self, h: int, staged: bool = False) -> Head:
        """Query head h of s (its stages kept when staged)."""
        check_head(self.s, h)
        head = self._heads.get(h)
        if head is None:
            head = self._heads[h] = self._make(h, staged)
        if staged and head.stages is None:
            head = self._heads[h] = replace(head, stages=head.made_stages())
        return head

    def head_result(self, h: int) -> HeadResult:
        """Head h alone, its stages kept: what a view of that head draws first."""
        return HeadResult(
            **context(self.s, self.X, self.rule.future), index=h, one=self.head(h, True)
        )

    def _make(self, h: int, staged: bool) -> Head:
        g = kv_of(self.s, [h])[0]
        old = self._base_head(h)
        c = self.changes
        rows_changed = bool(c.x_rows or c.kv_rows)
        if old is not None and not (rows_changed or h in c.q_heads or g in c.k_heads):
            if g not in c.v_heads:
                return old if not c.attention else self._attend(h, g, staged)
            if not c.attention:
                return revalued(old, self._key_parts(g)[1])
        return self._attend(h, g, staged)

    def _base_head(self, h: int) -> Head | None:
        if self.base is None:
            return None
        return self.base.result.heads[h]

    def _attend(self, h: int, g: int, staged: bool) -> Head:
        Q, Q_rot = self._query_parts(h)
        K, V, K_rot = self._key_parts(g)
        parts = (Q[None], Q_rot[None], K[None], V[None], K_rot[None])
        return attend(self.rule, [h], *parts, self._keep(h), [h] if staged else [])[0]

    def _keep(self, h: int) -> np.ndarray | None:
        """Head h's dropout mask: the base's when the dropout and sizes are as before."""
        old = self._base_head(h)
        if old is not None and old.keep is not None and not self.changes.attention:
            return old.keep[None]
        return dropout_keep(self.s.settings, (1, self.s.n, self.s.m), skip=h)

    def _query_parts(self, h: int) -> QueryParts:
        s, old, c = self.s, self._base_head(h), self.changes
        if old is None:  # every head's, as compute() makes them (one product)
            if self._queries is None:
                self._queries = queries(s, self.X, range(head_count(s)))
            return self._queries[0][h], self._queries[1][h]
        if h in c.q_heads:
            Q, Q_rot = queries(s, self.X, [h])
            return Q[0], Q_rot[0]
        rows = sorted(c.x_rows)
        if not rows:
            return old.Q, old.Q_rot
        Q_rows, Q_rot_rows = queries(s, self.X, [h], rows)
        Q = _with_rows(old.Q, rows, Q_rows[0])
        return Q, _with_rows(old.Q_rot, rows, Q_rot_rows[0]) if turns(s.settings) else Q

    def _key_parts(self, g: int) -> KeyParts:
        parts = self._keys.get(g)
        if parts is None:
            parts = self._keys[g] = self._make_keys(g)
        return parts

    def _make_keys(self, g: int) -> KeyParts:
        s, c = self.s, self.changes
        reader = self._reader(g)
        old = self._base_head(reader) if reader is not None else None
        if old is None:  # every key/value head's, as compute() makes them
            if self._all_keys is None:
                self._all_keys = keys(s, self.X_kv, kv_heads(s))
            K, V, K_rot = self._all_keys
            return K[g], V[g], K_rot[g]
        if g in c.k_heads:
            K, V, K_rot = keys(s, self.X_kv, [g])
            return K[0], V[0], K_rot[0]
        rows = sorted(c.kv_rows if s.cross else c.x_rows)
        K, V, K_rot = old.K, old.V, old.K_rot
        if rows:
            K_rows, V_rows, K_rot_rows = keys(s, self.X_kv, [g], rows)
            K, V = _with_rows(K, rows, K_rows[0]), _with_rows(V, rows, V_rows[0])
            K_rot = _with_rows(K_rot, rows, K_rot_rows[0]) if turns(s.settings) else K
        if g in c.v_heads:
            V = values(s, self.X_kv, [g])[0]
        return K, V, K_rot

    def _reader(self, g: int) -> int | None:
        """A query head of key/value head g (whose base head holds g's K and V)."""
        return next((h for h in range(self.s.n_heads) if kv_of(self.s, [h])[0] == g), None)

    # The layer --------------------------------------------------------------------------

    def result(self, heads: Sequence[Head] | None = None) -> Result:
        """The whole layer of s from its heads (all made here when not given)."""
        if heads is None:
            heads = [self.head(h) for h in range(head_count(self.s))]
        s, base, changes = self.s, self.base, self.changes
        unchanged = base is not None and all(
            a.output is b.output for a, b in zip(heads, base.result.heads, strict=True)
        )
        if base is not None and unchanged:
            concat = base.result.concat
            final = base.result.final if not changes.mix else final_of(s, concat)
        else:
            concat = np.concatenate([h.output for h in heads], axis=1)
            final = final_of(s, concat)
        concat.flags.writeable = final.flags.writeable = False
        return Result(
            **context(s, self.X, self.rule.future), heads=tuple(heads), concat=concat, final=final
        )


def kv_heads(s: Scenario) -> list[int]:
    """The key/value heads the query heads read (one, Q = K = V = X, without projections)."""
    return sorted(set(kv_of(s, range(head_count(s)))))


def _with_rows(a: np.ndarray, rows: Sequence[int], new: np.ndarray) -> np.ndarray:
    """A read-only copy of a with the given rows replaced."""
    out = a.copy()
    out[rows] = new
    out.flags.writeable = False
    return out


def compute_from(s: Scenario, base: Base | None) -> Result:
    """compute(s), reusing what base holds exactly (forward.compute when base is None)."""
    return compute(s) if base is None else Plan(s, base).result()
