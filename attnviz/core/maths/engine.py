"""The reference engine: every intermediate of (multi-head) attention in float64.

``compute(scenario)`` returns a frozen ``Result``, one ``Head`` per head; the work is
vectorised over heads and tokens. ``update`` recomputes only what an edit touches;
``one_head`` and ``layer`` give one head, or concat and final, for a fraction of the
memory (exports at long sequences).
Symbols follow the brief: ``Q = X W_Q``, ``S = Q Kᵀ``, scaled ``S / √d_k``, masked,
``softmax`` along keys, head output ``weights · V``, ``concat`` in head order, final
``concat · W_O``.
"""

from __future__ import annotations

import dataclasses
import math
import weakref
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from attnviz.core.maths.changes import Changes, same
from attnviz.core.maths.scenario import MINUS_INF_MASKS, Scenario, Settings
from attnviz.core.maths.variants import (
    alibi_slopes,
    query_offset,
    rms_norm,
    rope,
    tanh,
    visible,
)

HEAD_MATRICES = ("Q", "K", "V", "scores", "scaled", "masked", "weights", "output")
TURNED_MATRICES = ("Q_rot", "K_rot")  # Q and K as the scores see them: after QK-norm and RoPE
SCORE_MATRICES = ("scores", "scaled", "masked")  # derived from a head's Q_rot and K_rot
ROW_MATRICES = ("Q", "Q_rot", "K", "V", "K_rot")  # one row per query or per key
Lines = tuple[np.ndarray, np.ndarray]  # rows, columns
LAYER_MATRICES = ("X", "concat", "final")
KEPT_DISTANCES = 1 << 22  # cells of ALiBi's distance matrix a rule keeps (16 MiB)


@dataclass(frozen=True, eq=False)
class Rule:
    """How one computation turns a head's raw scores into what its softmax sees: times
    the scale, soft-capped, plus the ALiBi bias, then masked. Shared by the heads of a
    result, so that ``scaled`` and ``masked`` are derived from the scores when a view
    asks instead of being stored."""

    settings: Settings
    d_k: int  # the width whose root scores are divided by
    future: np.ndarray  # (n, m) bool: the keys the mask hides (hidden_keys)
    qpos: np.ndarray  # (n,) the queries' positions
    slopes: np.ndarray | None  # ALiBi: one slope per query head of the scenario
    # ALiBi terms a view showed (alibi): kept while it shows them, not longer
    _alibi: weakref.WeakValueDictionary[int, np.ndarray] = field(
        default_factory=weakref.WeakValueDictionary, repr=False
    )

    @staticmethod
    def of(s: Scenario, future: np.ndarray) -> Rule:
        st = s.settings
        slopes = None
        if st.positional == "alibi":
            slopes = np.asarray(st.alibi_slopes or alibi_slopes(s.n_heads), dtype=np.float64)
        d_k = s.d_k if st.projections else s.d_model
        return Rule(st, d_k, future, positions(s)[0], slopes)

    def scale(
        self,
        a: np.ndarray,
        heads: Sequence[int],
        rows: Any = slice(None),
        cols: Any = slice(None),
        source: np.ndarray | None = None,
    ) -> None:
        """Raw scores (H', r, c) of the given query heads, query rows and key columns, in
        place (or the raw scores source into a): times the scale, soft-capped, plus ALiBi."""
        st = self.settings
        scale = scale_of(st, self.d_k)
        raw = a if source is None else source
        if scale is None:
            np.divide(raw, np.sqrt(self.d_k), out=a)
        elif scale != 1.0:
            np.multiply(raw, scale, out=a)
        elif source is not None:
            np.copyto(a, source)
        if st.softcap is not None:
            a /= st.softcap
            tanh(a, out=a)
            a *= st.softcap
        if self.slopes is not None:
            distance = self.distance(rows, cols)
            for k, h in enumerate(heads):
                a[k] -= self.slopes[h] * distance

    def mask(self, a: np.ndarray, rows: Any = slice(None), cols: Any = slice(None)) -> None:
        """Scaled scores (…, r, c) in place: −∞ (causal, sliding-window, custom) or 0
        (causal-zero) on the hidden keys of the given query rows and key columns."""
        if self.masks:
            value = -np.inf if self.settings.mask in MINUS_INF_MASKS else 0.0
            np.copyto(a, value, where=self.future[rows][:, cols])

    def scaled_extent(self, low: float, high: float, head: int) -> tuple[float, float] | None:
        """The smallest and largest scaled score of a query head from its smallest and
        largest raw score, when scaling is one multiplication (or division) of every
        score, no soft-cap, no ALiBi: that keeps the scores' order, and each rounds alike.
        None otherwise."""
        if self.settings.softcap is not None or self.slopes is not None:
            return None
        ends = np.array([[[low, high]]])
        self.scale(ends, [head])
        return float(ends.min()), float(ends.max())

    def distance(self, rows: Any = slice(None), cols: Any = slice(None)) -> np.ndarray:
        """(r, c) int32: |query position − key position| of the given query rows and key
        columns, what ALiBi's slopes multiply. Up to KEPT_DISTANCES cells the whole matrix
        is made once and kept (the rule outlives a result: every edit after uses it)."""
        if self.future.size <= KEPT_DISTANCES:
            return self._distances[rows][:, cols]  # type: ignore[no-any-return]
        return self._distances_of(rows, cols)

    @cached_property
    def _distances(self) -> np.ndarray:
        return _frozen(self._distances_of(slice(None), slice(None)))

    def _distances_of(self, rows: Any, cols: Any) -> np.ndarray:
        kpos = np.arange(self.future.shape[1], dtype=np.int32)[cols]
        return np.abs(self.qpos[rows].astype(np.int32)[:, None] - kpos[None, :])

    def alibi(self, head: int) -> np.ndarray:
        """The ALiBi term query head ``head``'s scaled scores hold, −slope · distance
        (what scale subtracts): the same array each time it is asked for, while a view
        still shows it."""
        if self.slopes is None:
            raise ValueError("these settings add no ALiBi term")
        term = self._alibi.get(head)
        if term is None:
            term = self._alibi[head] = _frozen(-(self.slopes[head] * self.distance()))
        return term

    @cached_property
    def ends(self) -> np.ndarray:
        """For each query row, the column after its last key the mask lets through (0
        when it hides them all)."""
        seen = ~self.future
        last = seen.shape[1] - np.argmax(seen[:, ::-1], axis=1)
        return np.where(seen.any(axis=1), last, 0)

    def row_ends(self, rows: Any, count: int) -> np.ndarray | None:
        """ends of the given query rows (count of them) when a block of rows at a time may
        stop there: more rows than a block, under a −∞ mask (every later weight is 0).
        None otherwise."""
        if count > SOFTMAX_ROWS and self.settings.mask in MINUS_INF_MASKS:
            return self.ends[rows]  # type: ignore[no-any-return]
        return None

    @property
    def masks(self) -> bool:
        """Whether the mask sets the hidden keys' scores (−∞ or 0) before softmax."""
        return self.settings.mask in (*MINUS_INF_MASKS, "causal-zero")

    @property
    def reweighted(self) -> bool:
        """Whether the weights differ from the softmax (drop-after-softmax, dropout)."""
        return self.settings.mask == "drop-after-softmax" or self.settings.dropout > 0


@dataclass(frozen=True, eq=False)
class Head:
    """One head's intermediates; all arrays read-only float64 (empty_rows and keep bool).

    ``Q`` and ``output`` are n × d_k, ``K`` and ``V`` m × d_k (the key/value head this
    query head reads; m = n without cross-attention): the projections with their biases.
    ``Q_rot`` and ``K_rot`` are Q and K after QK-norm and RoPE, what the scores use (the
    same arrays as Q and K when neither is on). ``weights`` is n × m. ``m`` and ``Z`` are
    each row's softmax offset and denominator (Σ exp(s − m), with the sink's term): m is
    the row's maximum, or more after an update patched the row (_patch_rows keeps Z ≥ 1,
    so m within ln n of the maximum).

    Derived from those on first use, and kept (a view of one head asks for one head):
    ``scores`` (Q_rot K_rotᵀ), ``scaled`` (times the scale, soft-capped, plus ALiBi) and
    ``masked`` (what softmax sees), all n × m; and per row (length n):

    - ``leak``: total weight on the keys the mask hides (future keys, and under a sliding
      window the keys that fell out of it, or those a custom mask hides);
    - ``row_sum``: total weight of the row (1, except with a sink, after
      drop-after-softmax or dropout);
    - ``entropy``: entropy in nats of the row's softmax distribution (with the sink as
      one more outcome; before drop-after-softmax and dropout).

    Stored per row: ``sink``, the share of the row's softmax the sink took (0 without
    sinks), and ``empty_rows``, True where every score of the row is masked (−∞) and
    there is no sink. Such a row has no distribution: its weights, output and entropy are
    defined as 0, never NaN. ``keep`` is the n × m dropout mask (True = kept), or None.
    """

    Q: np.ndarray
    K: np.ndarray
    V: np.ndarray
    Q_rot: np.ndarray
    K_rot: np.ndarray
    weights: np.ndarray
    output: np.ndarray
    m: np.ndarray
    Z: np.ndarray
    empty_rows: np.ndarray
    sink: np.ndarray
    keep: np.ndarray | None
    index: int = 0  # which query head of the scenario (its ALiBi slope, its sink)
    rule: Rule | None = None  # None: every derived field was given (the torch engine)

    @cached_property
    def scores(self) -> np.ndarray:
        return _frozen(self.Q_rot @ np.ascontiguousarray(self.K_rot.T))

    @cached_property
    def scaled(self) -> np.ndarray:
        a = self.scores.copy()
        self._rule.scale(a[None], [self.index])
        return _frozen(a)

    @cached_property
    def masked(self) -> np.ndarray:
        if self._rule.settings.mask in ("none", "drop-after-softmax"):
            return self.scaled
        a = self.scaled.copy()
        self._rule.mask(a)
        return _frozen(a)

    @cached_property
    def entropy(self) -> np.ndarray:
        p = self.weights
        if self._rule.reweighted:  # the softmax before the weights were changed
            p = np.exp(self.masked - self.m[:, None])
            p /= np.where(self.empty_rows, 1.0, self.Z)[:, None]
        entropy = row_entropy(self.masked, p, self.m, self.Z, self.empty_rows)
        sinks = self._rule.settings.sinks
        if sinks is not None:
            entropy += self.sink * (self.m - sinks[self.index])
        return _frozen(entropy)

    @cached_property
    def leak(self) -> np.ndarray:
        return _frozen(np.einsum("ij,ij->i", self.weights, self._rule.future.astype(np.float64)))

    @cached_property
    def row_sum(self) -> np.ndarray:
        return _frozen(self.weights.sum(axis=-1))

    def made(self, name: str) -> np.ndarray | None:
        """A derived matrix (scores, scaled, masked) if made already; None where asking
        for it would compute it."""
        return self.__dict__.get(name)

    def reusing(self, old: Head, queries: bool, keys: bool, values: bool = False) -> Head:
        """self with old's query arrays (Q, Q_rot), key and value arrays (K, V, K_rot), or
        values alone (V) where those did not change: equal values, and the very same
        arrays."""
        same: dict[str, Any] = {}
        if queries:
            same |= {"Q": old.Q, "Q_rot": old.Q_rot}
        if keys or values:
            same |= {"V": old.V}
        if keys:
            same |= {"K": old.K, "K_rot": old.K_rot}
        return self.with_fields(**same) if same else self

    def with_fields(self, **values: np.ndarray) -> Head:
        """A copy with the given fields replaced, derived ones (entropy, …) as if computed;
        the derived values self already holds are kept."""
        stored: dict[str, Any] = {k: v for k, v in values.items() if k not in DERIVED}
        head = dataclasses.replace(self, **stored)
        known = {k: v for k, v in self.__dict__.items() if k in DERIVED}
        head.__dict__.update(known | {k: v for k, v in values.items() if k in DERIVED})
        return head

    def carrying(self, old: Head, rows: Sequence[int], cols: Sequence[int]) -> Head:
        """self with the derived matrices old holds (scores, scaled, masked) taken over,
        the given query rows and key columns recomputed: right when only those rows of
        Q_rot and K_rot differ from old's. The other cells stay the very same numbers (a
        view recolours only what changed), and a matrix no view asked for stays unmade."""
        held, rule = old.__dict__, self._rule

        def patch(name: str, part: Any) -> None:
            a = held[name].copy()
            if rows:
                a[rows] = part(rows, slice(None))
            if cols:
                a[:, cols] = part(slice(None), cols)
            self.__dict__[name] = _frozen(a)

        def scaled(r: Any, c: Any) -> np.ndarray:
            a = self.scores[r][:, c]
            rule.scale(a[None], [self.index], r, c)
            return a

        def masked(r: Any, c: Any) -> np.ndarray:
            a = self.scaled[r][:, c]
            rule.mask(a, r, c)
            return a

        # What a view needs to recolour only these lines (the weights and the output are
        # rescaled row by row: any cell of theirs may differ).
        names = [*ROW_MATRICES, *(name for name in SCORE_MATRICES if name in held)]
        self._note_since(old, names, rows, cols, anywhere=["weights", "output"])
        # (scaled is made from scores, and masked from scaled: each implies the one before)
        if "scores" in held:
            patch("scores", lambda r, c: self.Q_rot[r] @ self.K_rot[c].T)
        if "scaled" in held:
            patch("scaled", scaled)
        if "masked" in held:
            if held["masked"] is held["scaled"]:
                self.__dict__["masked"] = self.scaled
            else:
                patch("masked", masked)
        return self

    def replacing(self, old: Head) -> Head:
        """self, computed anew in place of old (after an edit of its weights or of many
        rows of the input): its weights, output and the score matrices old had made may
        differ from old's in any cell (a view recolours them whole, without comparing
        first)."""
        names = [name for name in SCORE_MATRICES if old.made(name) is not None]
        self._note_since(old, anywhere=[*names, "weights", "output"])
        return self

    def _note_since(
        self,
        old: Head,
        names: Iterable[str] = (),
        rows: Sequence[int] = (),
        cols: Sequence[int] = (),
        anywhere: Iterable[str] = (),
    ) -> None:
        """Remember, for unchanged_outside, the arrays of old that these matrices differ
        from (weakly: not kept alive for it): ``names`` in the given rows and columns,
        ``anywhere`` in any cell."""
        anywhere = tuple(anywhere)
        refs = {name: weakref.ref(getattr(old, name)) for name in (*names, *anywhere)}
        self.__dict__["_patched"] = (refs, tuple(rows), tuple(cols), anywhere)

    @property
    def _rule(self) -> Rule:
        assert self.rule is not None, "a head without a rule was given every field"
        return self.rule


def unchanged_outside(head: Head, name: str) -> tuple[weakref.ref[np.ndarray], Lines | None] | None:
    """(a weak reference to an earlier array, (rows, columns)) when head's matrix ``name``
    equals that array but in those rows and columns: after an edit of a few rows of X (or
    X_kv), the array of the head it was patched from (its Q, K, V, Q_rot, K_rot, and the
    score matrices it had made). The lines are None when any cell may differ: the weights
    and output of such a head, and those and the score matrices of a head computed anew
    (Head.replacing).
    None when not known: a view compares for itself. (Weak, so that nothing keeps an
    earlier matrix alive for this.)"""
    patched = head.__dict__.get("_patched")
    if patched is None or name not in patched[0] or patched[0][name]() is None:
        return None
    refs, rows, cols, anywhere = patched
    before = refs[name]
    if name in anywhere:
        return before, None
    if name in SCORE_MATRICES:
        lines = (rows, cols)
    elif name in ("Q", "Q_rot"):
        lines = (rows, ())
    else:  # K, V, K_rot: one row per key
        lines = (cols, ())
    return before, (np.array(lines[0], dtype=np.intp), np.array(lines[1], dtype=np.intp))


def _frozen(*arrays: np.ndarray) -> np.ndarray:
    """Make the arrays read-only; returns the first."""
    for a in arrays:
        a.flags.writeable = False
    return arrays[0]


DERIVED = ("scores", "scaled", "masked", "entropy", "leak", "row_sum")


def _stacked(name: str) -> cached_property[Any]:
    """A Result attribute that stacks one field of every head on axis 0 (on first use)."""

    def stack(self: Result) -> np.ndarray | None:
        parts = [getattr(h, name) for h in self.heads]
        if parts[0] is None:
            return None
        array = np.stack(parts)
        array.flags.writeable = False
        return array

    stack.__name__ = name
    return cached_property(stack)


@dataclass(frozen=True, eq=False)
class Result:
    """Every intermediate of one computation; all arrays are read-only.

    ``heads`` holds one ``Head`` per query head, in order. For convenience each head field
    is also available stacked with the head on axis 0 (``result.weights[h, i, j]``), built
    on first use; K and V repeat across the query heads that share them. With projections
    off there is one head with Q = K = V = X (K = V = X_kv under cross-attention),
    ``concat`` is its output and ``final`` equals ``concat`` (no W_O).

    A result with ``complete`` False is published while a large update is still running:
    only the heads in ``fresh`` (and ``X``) are current, the other heads, ``concat`` and
    ``final`` those of the previous result. That is a preview of the shown head, or every
    head before the mix (``heads_current``).
    """

    tokens: tuple[str, ...]
    settings: Settings
    X: np.ndarray  # the input actually used: X plus the positional encoding, if any
    heads: tuple[Head, ...]
    concat: np.ndarray
    final: np.ndarray
    future: np.ndarray  # (n, m) bool: the mask hides key j from query i (hidden_keys)
    complete: bool = True
    fresh: tuple[int, ...] = ()
    key_tokens: tuple[str, ...] | None = None  # the keys' labels under cross-attention
    X_kv: np.ndarray | None = None  # the keys' input under cross-attention
    biases: tuple[str, ...] = ()  # the biases in use (not all zero): of b_Q, b_K, b_V, b_O
    mixed_with: tuple[np.ndarray, np.ndarray] | None = None  # (W_O, b_O) of final
    mix_updates: int = 0  # rank updates final has had since it was mixed whole
    projected_with: Scenario | None = None  # whose W_Q, b_Q, W_K, … made the heads
    # per row of X: how many times in a row its projections were moved by its change
    # (_input_shift) rather than projected again; None: none was
    row_updates: np.ndarray | None = None

    Q = _stacked("Q")
    K = _stacked("K")
    V = _stacked("V")
    Q_rot = _stacked("Q_rot")
    K_rot = _stacked("K_rot")
    scores = _stacked("scores")
    scaled = _stacked("scaled")
    masked = _stacked("masked")
    weights = _stacked("weights")
    output = _stacked("output")
    leak = _stacked("leak")
    row_sum = _stacked("row_sum")
    sink = _stacked("sink")
    entropy = _stacked("entropy")
    empty_rows = _stacked("empty_rows")
    keep = _stacked("keep")

    @property
    def n_heads(self) -> int:
        return len(self.heads)

    @property
    def heads_current(self) -> bool:
        """Whether every head is current (the mix may not be yet)."""
        return self.complete or len(self.fresh) == len(self.heads)

    @property
    def d_k(self) -> int:
        return self.heads[0].Q.shape[1]

    @property
    def keys(self) -> tuple[str, ...]:
        """The labels of the keys (the columns of scores and weights)."""
        return self.tokens if self.key_tokens is None else self.key_tokens

    @property
    def scale_factor(self) -> float:
        """What raw scores are divided by: √d_k, 1/scale_value, or 1 with scaling off."""
        st = self.settings
        if not st.scale:
            return 1.0
        if st.scale_value is not None:
            return 1.0 / st.scale_value
        return float(np.sqrt(self.d_k))

    def matrix(self, name: str, head: int | None = None) -> np.ndarray:
        """One intermediate as a 2-D array; head (0-based) for the per-head ones."""
        if name in HEAD_MATRICES or name in TURNED_MATRICES:
            if head is None or not 0 <= head < self.n_heads:
                raise KeyError(f"{name}: head {head} does not exist")
            return getattr(self.heads[head], name)  # type: ignore[no-any-return]
        if name in LAYER_MATRICES:
            return getattr(self, name)  # type: ignore[no-any-return]
        raise KeyError(f"unknown matrix {name!r}")


def sinusoidal(n: int, d_model: int, rows: Any = slice(None)) -> np.ndarray:
    """Sinusoidal position encoding, the given rows (positions) of its n × d_model table:
    PE[p, 2i] = sin(p / 10000^(2i/d)), PE[p, 2i+1] = cos(...). Each cell's sin or cos
    alone (not both, one thrown away), the same numbers whichever rows are asked for."""
    pos = np.arange(n)[rows][:, None]
    pair = np.arange(d_model) // 2
    angle = pos / np.power(10000.0, 2 * pair / d_model)
    out = np.empty_like(angle)
    np.sin(angle[:, 0::2], out=out[:, 0::2])
    np.cos(angle[:, 1::2], out=out[:, 1::2])
    return out


def future_mask(n: int) -> np.ndarray:
    """(n, n) bool, True where key j comes after query i."""
    return np.triu(np.ones((n, n), dtype=bool), k=1)


def hidden_keys(s: Scenario) -> np.ndarray:
    """(n, m) bool, True where the mask hides key j from query i: the future keys (under
    the causal alignment), and under a sliding window or a custom mask what those hide.
    (With no mask, the future keys all the same: what the leak and the marks are
    measured on.)"""
    st = s.settings
    if st.mask in ("sliding-window", "custom"):
        return ~visible(s.n, s.m, st.mask, st.window, st.causal_alignment, s.mask_matrix)
    return ~visible(s.n, s.m, "causal", alignment=st.causal_alignment)


def positions(s: Scenario) -> tuple[np.ndarray, np.ndarray]:
    """The positions of the queries and of the keys (RoPE and ALiBi): keys 0 … m − 1,
    queries from m − n under bottom-right alignment, else from 0."""
    offset = query_offset(s.n, s.m, s.settings.causal_alignment)
    return np.arange(s.n) + offset, np.arange(s.m)


def rope_width(st: Settings, width: int) -> int:
    """How many leading features RoPE turns: rope_dims, else all of an even width (one
    fewer for an odd one)."""
    return st.rope_dims if st.rope_dims is not None else width - width % 2


def scale_of(st: Settings, d_k: int) -> float | None:
    """What scores are multiplied by: scale_value, or None to divide by √d_k exactly (the
    textbook operation, so its numbers are the brief's), or 1.0 with scaling off."""
    if not st.scale:
        return 1.0
    return st.scale_value


def dropout_keep(settings: Settings, shape: tuple[int, ...], skip: int = 0) -> np.ndarray | None:
    """The seeded dropout keep-mask (True = kept), or None when dropout is off.

    ``skip``: how many leading heads (slices of axis 0) of a larger draw to pass over, so
    that head h alone is ``dropout_keep(st, (1, n, m), skip=h)[0]``, bit for bit the same
    as ``dropout_keep(st, (heads, n, m))[h]`` without drawing the others.
    """
    if settings.dropout == 0:
        return None
    bits = np.random.PCG64(settings.dropout_seed)  # what default_rng(seed) uses
    bits.advance(skip * math.prod(shape[1:]))  # one 64-bit step per float64 drawn
    return np.random.Generator(bits).random(shape) >= settings.dropout


def softmax_rows(
    masked: np.ndarray, sink: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Softmax along the last axis of scores that may hold −∞.

    Subtracts the row maximum first. Returns (weights, row max m, sum of exp(s − m) Z,
    empty) where ``empty`` flags rows whose every score is −∞: their weights are 0.
    ``sink``: logits (broadcast against the rows) whose exp(sink − m) joins Z only, so
    that a row's weights sum to less than 1; m is then at least the sink, and no row is
    empty.
    """
    weights = np.array(masked, dtype=np.float64)
    return (weights, *softmax_in_place(weights, sink))


SOFTMAX_ROWS = 128  # rows at a time when the trailing −∞ of each row are skipped


def softmax_in_place(
    a: np.ndarray, sink: np.ndarray | None = None, ends: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """softmax_rows with a as the weights: a (masked scores) becomes its softmax; returns
    (m, Z, empty). ``ends``: for each row, the column after its last score that may be
    finite (all later ones are −∞: a causal mask's future); those weights are set to 0
    without exp, a block of rows at a time (half the work under a causal mask)."""
    if ends is None or a.shape[-2] <= SOFTMAX_ROWS:
        return _softmax_part(a, sink)
    parts = []
    for r0, r1, end in _row_blocks(ends):
        parts.append(_softmax_part(a[..., r0:r1, :end], sink))
        a[..., r0:r1, end:] = 0.0
    m, Z, empty = (np.concatenate([part[k] for part in parts], axis=-1) for k in range(3))
    return m, Z, empty


def _row_blocks(ends: np.ndarray) -> Iterator[tuple[int, int, int]]:
    """(first row, row after the last, end) for each block of SOFTMAX_ROWS rows, end the
    column after the last key a row of the block may see (at least 1)."""
    for r0 in range(0, len(ends), SOFTMAX_ROWS):
        r1 = min(len(ends), r0 + SOFTMAX_ROWS)
        yield r0, r1, max(1, int(ends[r0:r1].max()))


def _softmax_part(
    a: np.ndarray, sink: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    m = a.max(axis=-1)
    if sink is not None:
        m = np.maximum(m, sink)
    empty = np.isneginf(m)
    if empty.any():
        m = np.where(empty, 0.0, m)
    a -= m[..., None]
    np.exp(a, out=a)
    Z = a.sum(axis=-1)
    if sink is not None:
        Z += np.exp(sink - m)
    a /= np.where(empty, 1.0, Z)[..., None]
    return m, Z, empty


def row_entropy(
    masked: np.ndarray, p: np.ndarray, m: np.ndarray, Z: np.ndarray, empty: np.ndarray
) -> np.ndarray:
    """Entropy in nats of each row's softmax, from softmax_rows' outputs (0 for empty rows).

    −Σ p log p with log p = (s − m) − log Z is log Z + Σ p·(m − s): two sums of terms
    that are never negative, so nothing cancels at any score size. (The textbook
    log Z + m − Σ p·s subtracts two numbers near m and loses every digit once |s| is
    large: 0 instead of ln 8 for 8 equal scores of 1e12.) A sink of share q adds
    q·(m − sink) (see _attend).
    """
    gap = m[..., None] - masked  # ≥ 0; +∞ on masked keys, whose p is exactly 0
    np.minimum(gap, np.finfo(np.float64).max, out=gap)  # so that 0·gap is 0, not NaN
    with np.errstate(divide="ignore"):
        return np.where(empty, 0.0, np.log(Z) + np.einsum("...j,...j->...", p, gap))


def _inputs(s: Scenario) -> tuple[np.ndarray, np.ndarray]:
    """X plus the sinusoidal encoding, if any, and the keys' input: that same X, or X_kv
    as given under cross-attention (an encoder's output already carries its positions)."""
    X = s.X + sinusoidal(s.n, s.d_model) if s.settings.positional == "sinusoidal" else s.X
    return X, X if s.X_kv is None else s.X_kv


FEW_ROWS = 8
CANCELLING = 4.0  # a rank update this many times larger than its sum: computed whole


def _project(X: np.ndarray, W: np.ndarray) -> np.ndarray:
    """X @ W[h] for every head as one GEMM: (n, d) @ (h, d, d_k) -> (h, n, d_k).

    numpy's broadcast matmul over a stack does not reach BLAS; one wide product does.
    """
    h, d, d_k = W.shape
    if X.shape[0] <= FEW_ROWS:  # an edited row or two: not worth reshaping all of W
        return np.matmul(X, W)
    flat = X @ W.transpose(1, 0, 2).reshape(d, h * d_k)
    return np.ascontiguousarray(flat.reshape(X.shape[0], h, d_k).transpose(1, 0, 2))


def _turns(st: Settings) -> bool:
    """Whether Q and K as the scores see them may differ from Q and K (QK-norm or RoPE)."""
    return st.qk_norm == "rms" or st.positional == "rope"


def _turn(st: Settings, A: np.ndarray, norm: np.ndarray | None, pos: np.ndarray) -> np.ndarray:
    """Q or K as the scores see them: RMS-normalised (times the norm weights) with
    QK-norm, then rotated by position with RoPE; A itself when neither is on."""
    if st.qk_norm == "rms":
        A = rms_norm(A, norm, st.qk_norm_eps)
    if st.positional == "rope":
        dims = min(rope_width(st, A.shape[-1]), A.shape[-1] - A.shape[-1] % 2)
        if dims:
            A = rope(A, pos, st.rope_base, st.rope_style, dims)
    return A


@dataclass
class _Projections:
    """Q (H', n, d) for some query heads, K and V (G', m, d) for some key/value heads,
    and Q, K as the scores see them."""

    Q: np.ndarray
    K: np.ndarray
    V: np.ndarray
    Q_rot: np.ndarray
    K_rot: np.ndarray

    def read_by(self, kv_index: Sequence[int]) -> _Projections:
        """The same, with K, V and K_rot repeated for the query heads: query head k reads
        key/value head kv_index[k]."""
        if list(kv_index) == list(range(len(self.K))):  # each its own: no copies
            return self
        K = self.K[kv_index]
        K_rot = K if self.K_rot is self.K else self.K_rot[kv_index]
        return _Projections(self.Q, K, self.V[kv_index], self.Q_rot, K_rot)


def _queries(
    s: Scenario, X: np.ndarray, heads: Sequence[int], rows: Any = slice(None)
) -> tuple[np.ndarray, np.ndarray]:
    """Q and Q_rot of the given query heads, for the given rows of X (all by default)."""
    qpos = positions(s)[0][rows]
    if not s.settings.projections:
        Q = X[None, rows]
        return Q, _turn(s.settings, Q, None, qpos)
    Q = _project(X[rows], s.stacked("W_Q", heads)) + s.b_Q[heads]
    return Q, _turn(s.settings, Q, s.q_norm[heads], qpos)


def _keys(
    s: Scenario, X_kv: np.ndarray, kv: Sequence[int], rows: Any = slice(None)
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """K, V and K_rot of the given key/value heads, for the given rows of X_kv."""
    kpos = positions(s)[1][rows]
    if not s.settings.projections:
        K = X_kv[None, rows]
        return K, K, _turn(s.settings, K, None, kpos)
    K = _project(X_kv[rows], s.stacked("W_K", kv)) + s.b_K[kv]
    V = _project(X_kv[rows], s.stacked("W_V", kv)) + s.b_V[kv]
    return K, V, _turn(s.settings, K, s.k_norm[kv], kpos)


def _softmax_of(
    rule: Rule,
    a: np.ndarray,
    heads: Sequence[int],
    rows: Any = slice(None),
    stages: dict[int, dict[str, np.ndarray]] | None = None,
    raw: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
    """Raw scores a (H', r, m) of the given query heads and query rows, in place, to
    their softmax: × scale, soft-cap, + ALiBi, mask, softmax with any sink. Returns
    (m, Z, empty, sink logits). ``stages``: for some indices k of a, filled with copies
    of a[k] on the way (scores, scaled, masked: a Head's derived matrices). ``raw``: the
    raw scores, left as they are and kept as the stages' scores; a (of their shape) is
    filled from them instead of holding them."""
    stages = {} if stages is None else stages

    def snapshot(name: str) -> None:
        for k, kept in stages.items():
            kept[name] = _frozen(a[k].copy())

    if raw is None:
        snapshot("scores")
    else:
        _frozen(raw)
        for k, kept in stages.items():
            kept["scores"] = raw[k]
    rule.scale(a, heads, rows, source=raw)
    snapshot("scaled")
    if rule.masks:
        rule.mask(a, rows)
        snapshot("masked")
    else:  # what softmax sees is the scaled scores themselves (Head.masked)
        for kept in stages.values():
            kept["masked"] = kept["scaled"]
    sinks = rule.settings.sinks
    sink = None if sinks is None else np.asarray(sinks, dtype=np.float64)[list(heads)][:, None]
    return (*softmax_in_place(a, sink, rule.row_ends(rows, a.shape[-2])), sink)


def _reweight(
    rule: Rule,
    w: np.ndarray,
    keep: np.ndarray | None,
    rows: Any = slice(None),
    cols: Any = slice(None),
) -> None:
    """Softmax weights (…, r, c) of the given query rows and key columns in place to the
    weights: drop-after-softmax zeroes the hidden keys; dropout keeps some (keep, of those
    rows and columns) and rescales them."""
    if rule.settings.mask == "drop-after-softmax":
        np.copyto(w, 0.0, where=rule.future[rows][:, cols])
    if keep is not None:
        w *= keep
        w /= 1.0 - rule.settings.dropout


def _attend(
    heads: Sequence[int],
    P: _Projections,
    kv_index: Sequence[int],
    rule: Rule,
    keep: np.ndarray | None,
    shown: Iterable[int] = (),
) -> list[Head]:
    """Weights, outputs and softmax statistics for the given query heads; query head
    heads[k] uses Q[k] and key/value head kv_index[k] of P. The scores are computed into
    the array that becomes the weights: nothing else n × m is kept, except for the
    heads in ``shown`` (a view draws them), whose scores, scaled and masked are copied
    on the way rather than computed again when the view asks (one shown head alone
    keeps the array its scores were computed into, and the weights are made in another)."""
    P = P.read_by(kv_index)
    w = P.Q_rot @ np.ascontiguousarray(P.K_rot.transpose(0, 2, 1))
    stages: dict[int, dict[str, np.ndarray]] = {heads.index(h): {} for h in shown}
    raw = None
    if len(heads) == 1 and stages:  # (of more heads, one left could hold them all)
        raw, w = w, np.empty_like(w)
    m, Z, empty, sink = _softmax_of(rule, w, heads, stages=stages, raw=raw)
    share = np.zeros(m.shape) if sink is None else np.exp(sink - m) / Z
    _reweight(rule, w, keep)
    out = _heads(P, heads, rule, keep, w, _weighted(rule, w, P.V), m, Z, empty, share)
    for k, kept in stages.items():
        out[k].__dict__.update(kept)
    return out


def _weighted(
    rule: Rule | None, w: np.ndarray, V: np.ndarray, rows: Any = slice(None)
) -> np.ndarray:
    """w @ V for weights (…, r, m) of the given query rows; a block of rows at a time,
    each by the values up to the last key a row of it sees, where the weights after are
    0 (Rule.row_ends: under a causal mask 37 % less work at n = 512, 47 % at 2048; BLAS
    may round the last bit otherwise)."""
    ends = None if rule is None else rule.row_ends(rows, w.shape[-2])
    if ends is None:
        return w @ V  # type: ignore[no-any-return]
    out = np.empty((*w.shape[:-1], V.shape[-1]))
    for r0, r1, end in _row_blocks(ends):
        np.matmul(w[..., r0:r1, :end], V[..., :end, :], out=out[..., r0:r1, :])
    return out


def _values(s: Scenario, X_kv: np.ndarray, kv: Sequence[int]) -> np.ndarray:
    """V of the given key/value heads."""
    return _project(X_kv, s.stacked("W_V", kv)) + s.b_V[kv]  # type: ignore[no-any-return]


def _revalued(old: Head, V: np.ndarray) -> Head:
    """old with new values V: the same weights (and all derived from them), a new output."""
    return old.with_fields(V=_frozen(V), output=_frozen(_weighted(old.rule, old.weights, V)))


def _patch_rows(
    rule: Rule,
    heads: Sequence[int],
    kv_index: Sequence[int],
    old: Sequence[Head],
    P: _Projections,
    rows: Sequence[int],
    krows: Sequence[int],
    keep: np.ndarray | None,
) -> list[Head]:
    """Heads whose weights did not change after some rows of the input did: ``rows`` of
    the queries (their rows of the scores) and ``krows`` of the keys and values (their
    columns of the scores). P holds the new projections, keep the heads' dropout masks.

    Only the changed rows are recomputed. Every other row j has new logits c in the
    changed columns; the softmax's offset m_j (its maximum, or more once that fell: any
    offset at least the maximum gives the same softmax) becomes m'_j = max(m_j, c), and
    with s = exp(m_j − m'_j) the denominator Z'_j = s (Z_j − Σ e_old) + Σ e_new, where
    e_old = exp(old logit − m_j) and e_new = exp(c − m'_j); so the row's other weights are
    multiplied by f = s Z_j / Z'_j and its output becomes
    f (out_j − w_old · V_old) + w_new · V_new in the changed columns. A row whose Z'_j is
    under half of s Z_j (the subtraction lost digits: the changed columns held the row's
    weight and lost it) or under 1 (its offset would drift from the maximum, the rounding
    error Z carries growing as Z shrinks, edit after edit: Z ≥ 1 keeps m_j within ln n of
    it, as when m_j is the maximum), or whose output would lose digits the same way
    (w_old · V_old more than CANCELLING times the new output, in norm: a large value taken
    back), is recomputed whole.
    Under drop-after-softmax or dropout the weights are the softmax reweighted cell by
    cell, which the rescaling keeps; e_old of a kept weight is then the weight times Z,
    its keep rate taken back, and of a dropped one (0) comes from its old logit; the new
    weights are reweighted alike.
    """
    n = P.Q_rot.shape[1]
    P = P.read_by(kv_index)
    K_rot, V = P.K_rot, P.V
    W = np.empty((len(heads), *old[0].weights.shape))
    out = np.stack([h.output for h in old])
    m, Z, empty, share = (
        np.stack([getattr(h, f) for h in old]) for f in ("m", "Z", "empty_rows", "sink")
    )
    full = np.zeros((len(heads), n), dtype=bool)
    full[:, list(rows)] = True

    def logits(K_cols: np.ndarray) -> np.ndarray:
        """(H', n, r): each row's logits in the changed columns, for these keys."""
        c = P.Q_rot @ K_cols.transpose(0, 2, 1)
        rule.scale(c, heads, cols=cols)
        rule.mask(c, cols=cols)
        return c

    if krows:
        cols = list(krows)
        c = logits(K_rot[:, cols])  # the new ones
        w_old = np.stack([h.weights[:, cols] for h in old])
        # (the edited query rows, recomputed whole below, may overflow in e_old: their new
        # queries against the old keys)
        with np.errstate(over="ignore", invalid="ignore"):
            e_old = w_old * Z[..., None]  # (as exact as Z: the weight is e_old / Z)
            if rule.reweighted:  # a weight dropped (0) from its old logit; one kept as above,
                # its keep rate taken back (other rows of Q are the same as before)
                if keep is not None:
                    e_old *= 1.0 - rule.settings.dropout
                dropped = np.exp(logits(np.stack([h.K_rot[cols] for h in old])) - m[..., None])
                np.copyto(e_old, dropped, where=w_old == 0)
            m_new = np.maximum(m, c.max(axis=-1))  # (a new logit above m: the new max)
            shrink = np.exp(m - m_new)
            e_new = np.exp(c - m_new[..., None])
            Z_new = shrink * (Z - e_old.sum(axis=-1)) + e_new.sum(axis=-1)
        moved = ~(Z_new >= np.maximum(0.5 * shrink * Z, 1.0))  # (NaN: moved)
        seen = ~rule.future[:, cols].all(axis=-1) if rule.masks else np.ones(n, dtype=bool)
        patch = seen & ~moved & ~full
        full |= seen & moved
        Z_new = np.where(patch, Z_new, Z)
        m = np.where(patch, m_new, m)
        den = np.where(patch, Z_new, 1.0)  # (an empty row's Z is 0)
        f = np.where(patch, shrink * Z / den, 1.0)
        for k, head in enumerate(old):  # the copy and the rescaling in one pass
            np.multiply(head.weights, f[k, :, None], out=W[k])
        with np.errstate(over="ignore", invalid="ignore"):
            w_new = e_new / den[..., None]
            _reweight(rule, w_new, None if keep is None else keep[:, :, cols], cols=cols)
        w_new = np.where(patch[..., None], w_new, w_old)
        W[:, :, cols] = w_new
        removed = _product(w_old, np.stack([h.V[cols] for h in old]))
        out -= removed  # (in place: out is a fresh stack)
        out *= f[..., None]
        out += _product(w_new, V[:, cols])
        # (a row whose removed part dwarfs what is left, after a large value was taken
        # back, would keep a rounding error of its size: computed whole below)
        full |= _square_sums(removed) > CANCELLING**2 * _square_sums(out)
        share = share * f
        Z = Z_new
    else:
        for k, head in enumerate(old):
            W[k] = head.weights
    # The rows any head recomputes whole, in every head at once (a row recomputed is
    # exact; they are few, and one batched product costs less than one per head).
    r = np.flatnonzero(full.any(axis=0))
    if r.size:
        a = P.Q_rot[:, r] @ K_rot.transpose(0, 2, 1)
        mk, Zk, ek, sink = _softmax_of(rule, a, heads, r)
        _reweight(rule, a, None if keep is None else keep[:, r], r)
        W[:, r], m[:, r], Z[:, r], empty[:, r] = a, mk, Zk, ek
        share[:, r] = 0.0 if sink is None else np.exp(sink - mk) / Zk
        out[:, r] = a @ V
    return _heads(P, heads, rule, keep, W, out, m, Z, empty, share)


def _product(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a @ b; over an inner dimension of 1 (an outer product, after an edit of one row)
    as a broadcast product, the same numbers: matmul takes a slow path there (3× slower)."""
    return a * b if a.shape[-1] == 1 else a @ b  # type: ignore[no-any-return]


def _square_sums(a: np.ndarray) -> np.ndarray:
    """Σ a² along the last axis (one pass, no temporary)."""
    return np.einsum("...j,...j->...", a, a)  # type: ignore[no-any-return]


def _heads(
    P: _Projections,
    heads: Sequence[int],
    rule: Rule,
    keep: np.ndarray | None,
    *attended: np.ndarray,
) -> list[Head]:
    """The given query heads from their projections (P, read by them) and the stacks of
    their weights, output, m, Z, empty_rows and sink share, in that order."""
    stacks = {"Q": P.Q, "K": P.K, "V": P.V, "Q_rot": P.Q_rot, "K_rot": P.K_rot}
    names = ("weights", "output", "m", "Z", "empty_rows", "sink")
    stacks |= dict(zip(names, attended, strict=True))
    return split_heads(stacks, keep, heads, rule)


STORED = ("Q", "K", "V", "Q_rot", "K_rot", "weights", "output", "m", "Z", "empty_rows", "sink")


def split_heads(
    stacks: dict[str, np.ndarray],
    keep: np.ndarray | None,
    heads: Sequence[int] | None = None,
    rule: Rule | None = None,
) -> list[Head]:
    """Per-head views of arrays stacked on axis 0, frozen, for the given query heads (in
    order, by default all). Without a rule, stacks also holds every derived field."""
    _frozen(*stacks.values(), *(() if keep is None else (keep,)))
    numbers = range(stacks["Q"].shape[0]) if heads is None else heads
    out = []
    for k, h in enumerate(numbers):
        head = Head(
            **{name: stacks[name][k] for name in STORED},
            keep=None if keep is None else keep[k],
            index=h,
            rule=rule,
        )
        if rule is None:
            head.__dict__.update({name: stacks[name][k] for name in DERIVED})
        out.append(head)
    return out


def _mix(s: Scenario, outputs: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """concat of the head outputs in head order, and the final output concat · W_O + b_O.

    Ablated heads keep their outputs in concat but contribute nothing to the final mix.
    """
    concat = np.concatenate(outputs, axis=1)
    final = _final(s, concat)
    _frozen(concat, final)
    return concat, final


def _final(s: Scenario, concat: np.ndarray) -> np.ndarray:
    """concat · W_O + b_O for these rows of concat (ablated heads' columns left out)."""
    if not s.settings.projections:
        return concat
    if s.settings.ablated:
        kept = kept_columns(s.settings, s.n_heads, concat.shape[1] // s.n_heads)
        final = concat[:, kept] @ s.W_O[kept]
    else:
        final = concat @ s.W_O
    return final + s.b_O if s.b_O.any() else final  # type: ignore[no-any-return]


def _outputs(heads: Iterable[Head]) -> list[np.ndarray]:
    return [h.output for h in heads]


def kept_columns(settings: Settings, n_heads: int, d_k: int) -> np.ndarray:
    """Which columns of concat (rows of W_O) belong to heads that are not ablated."""
    return np.repeat([h not in settings.ablated for h in range(n_heads)], d_k)


def _head_count(s: Scenario) -> int:
    return s.n_heads if s.settings.projections else 1


def _kv_of(s: Scenario, heads: Sequence[int]) -> list[int]:
    return [s.kv_head_of(h) if s.settings.projections else 0 for h in heads]


def biases_in_use(s: Scenario) -> tuple[str, ...]:
    """The biases that are not all zero (none with projections off)."""
    if not s.settings.projections:
        return ()
    return tuple(name for name in ("b_Q", "b_K", "b_V", "b_O") if getattr(s, name).any())


def _result(
    s: Scenario, X: np.ndarray, heads: Sequence[Head], future: np.ndarray, **more: Any
) -> Result:
    # What the heads were projected and mixed with; not for a preview, whose other heads
    # and mix are those of an earlier scenario (it is given that one's mix).
    current = s.settings.projections and more.get("complete", True)
    more.setdefault("mixed_with", (s.W_O, s.b_O) if current else None)
    return Result(
        s.tokens,
        s.settings,
        X,
        tuple(heads),
        future=future,
        key_tokens=s.kv_tokens,
        X_kv=s.X_kv,
        biases=biases_in_use(s),
        projected_with=s if current else None,
        **more,
    )


def _with_rows(a: np.ndarray, rows: Sequence[int], values: np.ndarray) -> np.ndarray:
    """A copy of a with the given rows replaced."""
    a = a.copy()
    a[rows] = values
    return a


def _stack_of(
    arrays: Sequence[np.ndarray],
    ids: Sequence[int],
    rows: Sequence[int] = (),
    new_rows: dict[int, np.ndarray] | None = None,
) -> np.ndarray:
    """The arrays at ids stacked on a new axis 0 (one of them, as it is: a view, no copy),
    with the given rows of those in new_rows (by id) replaced by its values."""
    new_rows = new_rows or {}
    if len(ids) == 1 and ids[0] not in new_rows:
        return arrays[ids[0]][None]
    stack = np.stack([arrays[i] for i in ids])
    for k, i in enumerate(ids):
        if i in new_rows:
            stack[k, rows] = new_rows[i]
    return stack


def _plus(old: np.ndarray, change: np.ndarray) -> np.ndarray | None:
    """old + change (a rank update), or None when the change is many times larger than
    the sum: after a large value is set and taken back, old + change cancels and keeps a
    rounding error the size of the change (1e-10 after a cell of 1e5), so the caller
    computes it whole instead."""
    new = old + change
    if _largest(change) > CANCELLING * _largest(new):
        return None
    return new


def _largest(a: np.ndarray) -> float:
    """max |a| (0 when empty), without a temporary of |a|."""
    return max(float(a.max()), -float(a.min())) if a.size else 0.0


def _reprojected(
    prev: Result, s: Scenario, X: np.ndarray, name: str, index: int, old: np.ndarray
) -> np.ndarray | None:
    """Head index's projection ``name`` (W_Q, W_K or W_V, with its bias) of X from its
    previous value old, when only a few rows of the head's weights changed since prev:
    old + X[:, rows] · ΔW[rows] + Δb (old itself when the head's weights and the bias are
    prev's very arrays); None when more changed (project again). Reads the one head, so
    that a stack an edit left as its heads is not stacked for it."""
    before_s = prev.projected_with
    if before_s is None:
        return None
    bias = "b_" + name[-1]
    b, b_old = getattr(s, bias), getattr(before_s, bias)
    if s.shares_head(before_s, name, index) and b is b_old:
        return old
    before, now = before_s.matrix(name, index), s.matrix(name, index)
    changed = np.flatnonzero((before != now).any(axis=1))
    if len(changed) > FEW_ROWS:
        return None
    change = X[:, changed] @ (now[changed] - before[changed])
    if (b[index] != b_old[index]).any():
        change += b[index] - b_old[index]
    return _plus(old, change)


ROW_UPDATES = 32  # moves of a row's projections by its input's change (each rounds) in a row


def _input_shift(
    prev: Result, X: np.ndarray, rows: Sequence[int]
) -> tuple[np.ndarray, np.ndarray] | None:
    """How the given rows of the input moved since prev: (their change in the columns
    that changed, those columns), when few did and no row has been moved so ROW_UPDATES
    times in a row; else None (the rows are projected again)."""
    if prev.row_updates is not None and (prev.row_updates[rows] >= ROW_UPDATES).any():
        return None
    change = X[rows] - prev.X[rows]
    cols = np.flatnonzero((change != 0).any(axis=0))
    if len(cols) > FEW_ROWS:
        return None
    return change[:, cols], cols


def _shifted_rows(
    s: Scenario,
    shift: tuple[np.ndarray, np.ndarray],
    rows: Sequence[int],
    old: Sequence[np.ndarray],
    name: str,
    heads: Sequence[int],
) -> np.ndarray | None:
    """The given rows of projections ``old`` (one per head, of W ``name``'s given heads)
    moved by the input's shift: old rows + ΔX[:, cols] · W[cols]; (H', r, d). None when
    that would cancel (the move many times the row it leaves: a large value taken back)."""
    change, cols = shift
    moved = change @ np.stack([s.matrix(name, h)[cols] for h in heads])
    new = np.stack([a[rows] for a in old]) + moved
    if (_square_sums(moved) > CANCELLING**2 * _square_sums(new)).any():
        return None
    return new


MIX_UPDATES = 32  # rank updates of final in a row (each rounds) before a whole mix


def _mixed(prev: Result, s: Scenario, heads: Sequence[Head]) -> tuple[np.ndarray, np.ndarray, int]:
    """concat and final of these heads, and the rank updates final has had since it was
    mixed whole: from prev's mix when W_O and b_O are those it was mixed with. When the
    outputs of a quarter of the heads or fewer differ from its concat (an edit of one
    head's weights, or of a group's under GQA), final + Σ (output − old) · W_O[its rows]
    over those heads (at GPT-2 size a 64-wide product for a 768-wide one: 10 ms less);
    else, when some rows of concat are as they were, the others mixed again."""
    concat = np.concatenate(_outputs(heads), axis=1)
    final, updates = None, 0
    mixed_with = _updatable_mix(prev)
    if mixed_with is not None and same(mixed_with[0], s.W_O) and same(mixed_with[1], s.b_O):
        changed = _changed_outputs(prev, heads, most=len(heads) // 4)
        if changed is not None:
            d_k, ablated = prev.d_k, s.settings.ablated
            cols = [c for h in changed if h not in ablated for c in range(h * d_k, (h + 1) * d_k)]
            final = _plus(prev.final, (concat[:, cols] - prev.concat[:, cols]) @ s.W_O[cols])
            updates = 0 if final is None else prev.mix_updates + 1
        else:  # rows of X edited: the rows whose outputs changed (under a causal mask,
            # the edited row and those after it) mixed again, unless all did
            rows = np.flatnonzero((concat != prev.concat).any(axis=1))
            if len(rows) < len(concat):
                final = prev.final.copy()
                final[rows] = _final(s, concat[rows])
                updates = prev.mix_updates
    if final is None:
        final = _final(s, concat)
    _frozen(concat, final)
    return concat, final, updates


def _updatable_mix(prev: Result) -> tuple[np.ndarray, np.ndarray] | None:
    """The W_O and b_O prev's final was mixed with, when that final may be updated rather
    than mixed whole (not after MIX_UPDATES rank updates in a row)."""
    return prev.mixed_with if prev.mix_updates < MIX_UPDATES else None


def _changed_outputs(prev: Result, heads: Sequence[Head], most: int) -> list[int] | None:
    """The heads whose output differs from their block of prev's concat (a complete
    result's heads that are its very own did not change; a preview's concat is older than
    its heads); None as soon as more than ``most`` do."""
    d_k, changed = prev.d_k, []
    for h, head in enumerate(heads):
        if prev.complete and head is prev.heads[h]:
            continue
        if not np.array_equal(head.output, prev.concat[:, h * d_k : (h + 1) * d_k]):
            changed.append(h)
            if len(changed) > most:
                return None
    return changed


def _remix(prev: Result, s: Scenario) -> np.ndarray | None:
    """final for s from prev's, when only a few rows of W_O (or b_O) changed since:
    final + concat[:, rows] · ΔW_O[rows] + Δb_O; None when more changed."""
    mixed_with = _updatable_mix(prev)
    if mixed_with is None:
        return None
    W_O, b_O = mixed_with
    changed = np.flatnonzero((s.W_O != W_O).any(axis=1))
    if len(changed) > FEW_ROWS:
        return None
    kept = kept_columns(s.settings, prev.n_heads, prev.d_k)
    rows = changed[kept[changed]]
    change = prev.concat[:, rows] @ (s.W_O[rows] - W_O[rows])
    if (s.b_O != b_O).any():
        change += s.b_O - b_O
    final = _plus(prev.final, change)
    return None if final is None else _frozen(final)


def _kv_all(s: Scenario, X_kv: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return _keys(s, X_kv, range(s.kv_heads if s.settings.projections else 1))


def compute(s: Scenario) -> Result:
    """Every intermediate of attention over the scenario, in float64."""
    X, X_kv = _inputs(s)
    heads = list(range(_head_count(s)))
    Q, Q_rot = _queries(s, X, heads)
    K, V, K_rot = _kv_all(s, X_kv)
    future = hidden_keys(s)
    _frozen(X, future)
    keep = dropout_keep(s.settings, (len(heads), s.n, s.m))
    P = _Projections(Q, K, V, Q_rot, K_rot)
    out = _attend(heads, P, _kv_of(s, heads), Rule.of(s, future), keep)
    concat, final = _mix(s, _outputs(out))
    return _result(s, X, out, future, concat=concat, final=final)


def compute_head(s: Scenario, h: int) -> Head:
    """Head h (0-based) of compute(s), computing that head only: the same numbers."""
    return one_head(s, h).heads[0]


def _check_head(s: Scenario, h: int) -> None:
    count = _head_count(s)
    if not 0 <= h < count:
        raise KeyError(f"head {h} does not exist ({count} head(s))")


def one_head(s: Scenario, h: int) -> Result:
    """X and head h (0-based) of compute(s), without computing the other heads: bit for bit,
    except that BLAS may round a single-column product (d_k or n of 1) in another order.

    The Result holds that head alone, as its head 0; ``concat`` and ``final`` need every
    head and are left empty (0 × 0). For figures of one head at long sequences.
    """
    _check_head(s, h)
    X, X_kv = _inputs(s)
    Q, Q_rot = _queries(s, X, [h])
    K, V, K_rot = _keys(s, X_kv, _kv_of(s, [h]))
    future = hidden_keys(s)
    empty = np.empty((0, 0))
    _frozen(X, future, empty)
    keep = dropout_keep(s.settings, (1, s.n, s.m), skip=h)
    P = _Projections(Q, K, V, Q_rot, K_rot)
    heads = _attend([h], P, [0], Rule.of(s, future), keep)
    return _result(s, X, heads, future, concat=empty, final=empty)


def head_inputs(s: Scenario, h: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Query head h's Q and K as the scores see them (after QK-norm and RoPE), and its V:
    (n, d), (m, d), (m, d); nothing n × m is computed."""
    _check_head(s, h)
    return _head_inputs(s, h, *_inputs(s))


def _head_inputs(
    s: Scenario, h: int, X: np.ndarray, X_kv: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    _, Q_rot = _queries(s, X, [h])
    _, V, K_rot = _keys(s, X_kv, _kv_of(s, [h]))
    return Q_rot[0], K_rot[0], V[0]


def _head_output(
    s: Scenario,
    h: int,
    X: np.ndarray,
    X_kv: np.ndarray,
    rule: Rule,
    keep: np.ndarray | None,
    block: int = 256,
) -> np.ndarray:
    """Head h's output weights · V as _attend computes it (the same steps; BLAS may round
    a block's products differently in the last bit), a block of query rows at a time: no
    n × n intermediate is stored."""
    Q_rot, K_rot, V = _head_inputs(s, h, X, X_kv)
    Kt = np.ascontiguousarray(K_rot.T)
    out = np.empty((s.n, V.shape[1]))
    for a in range(0, s.n, block):
        rows = slice(a, min(s.n, a + block))
        w = (Q_rot[rows] @ Kt)[None]
        _softmax_of(rule, w, [h], rows)
        _reweight(rule, w, None if keep is None else keep[rows], rows)
        out[rows] = _weighted(rule, w[0], V, rows)
    return out


def layer(s: Scenario, block: int = 256) -> Result:
    """X, concat and final of compute(s) (to the last bit or two), one head and one block
    of query rows at a time: no n × m matrix is stored, for the layer-wide views at long
    sequences.

    The Result has no heads (``heads`` is empty).
    """
    X, X_kv = _inputs(s)
    future = hidden_keys(s)
    _frozen(X, future)
    rule = Rule.of(s, future)
    outputs = []
    for h in range(_head_count(s)):
        keep = dropout_keep(s.settings, (1, s.n, s.m), skip=h)
        keep = None if keep is None else keep[0]
        outputs.append(_head_output(s, h, X, X_kv, rule, keep, block))
    concat, final = _mix(s, outputs)
    return _result(s, X, (), future, concat=concat, final=final)


def update_with(prev: Result, s: Scenario, changes: Changes, **more: Any) -> Result:
    """update(prev, s) for these changes (compute(s) when they are ``full``); ``more``
    as update's ``preview_head`` and ``current_heads``."""
    if changes.full:
        return compute(s)
    return update(
        prev,
        s,
        changes.x_rows,
        changes.heads,
        changes.w_o,
        kv_heads=changes.kv_heads,
        kv_rows=changes.kv_rows,
        v_heads=changes.v_heads,
        **more,
    )


def update(
    prev: Result,
    s: Scenario,
    x_rows: Iterable[int] = (),
    heads: Iterable[int] = (),
    w_o: bool = False,
    *,
    kv_heads: Iterable[int] = (),
    kv_rows: Iterable[int] = (),
    v_heads: Iterable[int] = (),
    preview_head: int | None = None,
    current_heads: Iterable[int] = (),
    mix: bool = True,
) -> Result:
    """compute(s), reusing prev where only the named parts of the scenario changed.

    prev must come from a scenario that differs from s only in the given rows of X
    (``x_rows``) and of X_kv (``kv_rows``), the weights of the given query heads
    (``heads``: W_Q, b_Q, q_norm), of the given key/value heads (``kv_heads``: W_K, W_V,
    their biases, k_norm; ``v_heads``: only W_V or b_V), and (``w_o``) W_O and b_O. An X
    row changes that row of every head's Q (and of K and V without cross-attention); an
    X_kv row that row of every K and V; a head's weights change that head (a key/value
    head's, every query head of its group); W_O changes the final output only (a few of
    its rows, a rank update of final). Anything else (settings, sizes, the custom mask,
    no projections) is a full compute.

    What did not change is not recomputed: a head whose queries, keys or values did not
    change keeps those very arrays (views tell by identity that they need not redraw); a
    head whose values alone changed keeps its weights and multiplies them by the new V;
    after an edit of a few rows of X the other heads are patched row by row
    (``_patch_rows``).

    ``preview_head``: recompute just that head and return a preview (``complete`` False).
    ``current_heads``: heads of prev that are already current (from such a preview).
    ``mix`` False: return once every head is current, before the mix (``complete``
    False), when a head changed.
    """
    st = s.settings
    rows, krows = sorted(set(x_rows)), sorted(set(kv_rows))
    heads, kv_heads, current = set(heads), set(kv_heads), set(current_heads)
    v_heads = set(v_heads) - kv_heads
    if not s.cross:
        krows = rows
    same = (
        prev.settings == st
        and st.projections
        and prev.X.shape == s.X.shape
        and prev.n_heads == s.n_heads
        and prev.heads[0].K.shape == (s.m, s.d_k)
        and prev.heads[0].Q.shape == (s.n, s.d_k)
        and (prev.X_kv is None) == (s.X_kv is None)
        and (st.mask != "custom" or np.array_equal(prev.future, hidden_keys(s)))
    )
    if not same:
        return compute(s)
    X = prev.X
    if rows and st.positional == "sinusoidal":  # only the edited rows' positions again
        X = _with_rows(X, rows, s.X[rows] + sinusoidal(s.n, s.d_model, rows))
    elif rows:
        X = s.X
    X_kv = X if s.X_kv is None else s.X_kv
    affected = set(range(s.n_heads)) if rows or krows else set(heads)
    group = [s.kv_head_of(h) for h in range(s.n_heads)]  # each query head's key/value head
    kv_changed = kv_heads | v_heads
    affected |= {h for h in range(s.n_heads) if group[h] in kv_changed}
    affected -= current
    if preview_head is not None:
        affected &= {preview_head}
    todo = sorted(affected)
    new = list(prev.heads)
    if todo:
        kvs = sorted({group[h] for h in todo})
        # Every query head of a group holds the same K, V and K_rot, to the last bit. A
        # group whose keys and values a preview already made (a head of it is current)
        # takes them from that head, not projected again (which may round otherwise).
        fresh = {group[h]: h for h in current}
        first = {g: group.index(g) for g in kvs}
        reader = {g: fresh.get(g, first[g]) for g in kvs}

        def arrays(names: Iterable[str], ids: Sequence[int], of: Any) -> list[list[np.ndarray]]:
            """Per name, the given heads' arrays (replaced below where they change, then
            stacked for the heads computed together)."""
            return [[getattr(prev.heads[of(i)], name) for i in ids] for name in names]

        Q, Q_rot = arrays(("Q", "Q_rot"), todo, lambda h: h)
        K, V, K_rot = arrays(("K", "V", "K_rot"), kvs, lambda g: reader[g])
        qpos, kpos = positions(s)
        for k in [k for k, h in enumerate(todo) if h in heads]:
            h = todo[k]
            Q_new = _reprojected(prev, s, X, "W_Q", h, prev.heads[h].Q)
            if Q_new is None:
                Q[k], Q_rot[k] = (a[0] for a in _queries(s, X, [h]))
            else:
                Q[k], Q_rot[k] = Q_new, _turn(st, Q_new, s.q_norm[h], qpos)
        # The edited rows of each head's projections, put in as the heads are stacked.
        q_rows: list[dict[int, np.ndarray]] = [{}, {}]  # Q's, Q_rot's: by index of todo
        # After an edit of X alone, every head's edited rows from the change of their input,
        # when few of its columns changed: a row of each W read, not all (14 MB at GPT-2 size).
        shift, moved = None, False  # (moved: some rows were, which counts to ROW_UPDATES)
        alone = not (heads or kv_changed or current or s.cross) and preview_head is None
        if rows and alone and prev.complete:
            shift = _input_shift(prev, X, rows)
        if rows:
            made = None if shift is None else _shifted_rows(s, shift, rows, Q, "W_Q", todo)
            moved = made is not None
            if made is None:
                made = _queries(s, X, todo, rows)[0]
            turned_rows = _turn(st, made, s.q_norm[todo], qpos[rows])
            for k, (q, q_rot) in enumerate(zip(made, turned_rows, strict=True)):
                q_rows[0][k], q_rows[1][k] = q, q_rot
        same_values = set()  # key/value heads whose V is old's very array
        stale = [k for k, g in enumerate(kvs) if g not in fresh]
        for k in stale:
            g = kvs[k]
            old = prev.heads[reader[g]]
            if g in kv_heads:
                K_new = _reprojected(prev, s, X_kv, "W_K", g, old.K)
                V_new = _reprojected(prev, s, X_kv, "W_V", g, old.V)
                if K_new is None or V_new is None:
                    K[k], V[k], K_rot[k] = (a[0] for a in _keys(s, X_kv, [g]))
                else:
                    K[k], V[k], K_rot[k] = K_new, V_new, _turn(st, K_new, s.k_norm[g], kpos)
                    if V_new is old.V and not krows:
                        same_values.add(g)
            elif g in v_heads:
                V_new = _reprojected(prev, s, X_kv, "W_V", g, old.V)
                V[k] = _values(s, X_kv, [g])[0] if V_new is None else V_new
        k_rows: list[dict[int, np.ndarray]] = [{}, {}, {}]  # K's, V's, K_rot's: by index of kvs
        if krows and stale:
            groups = [kvs[k] for k in stale]
            parts = None
            if shift is not None:
                K_made = _shifted_rows(s, shift, krows, [K[k] for k in stale], "W_K", groups)
                V_made = _shifted_rows(s, shift, krows, [V[k] for k in stale], "W_V", groups)
                if K_made is not None and V_made is not None:
                    moved = True
                    parts = (K_made, V_made, _turn(st, K_made, s.k_norm[groups], kpos[krows]))
            if parts is None:
                parts = _keys(s, X_kv, groups, krows)
            for i, k in enumerate(stale):
                for replaced, part in zip(k_rows, parts, strict=True):
                    replaced[k] = part[i]
        keeps = [prev.heads[h].keep for h in todo]
        keep = None if keeps[0] is None else np.stack(keeps)  # type: ignore[arg-type]
        kv_index = [kvs.index(group[h]) for h in todo]
        # The same settings, sizes and mask (checked above): prev's rule, its ends known.
        rule = prev.heads[0].rule or Rule.of(s, prev.future)
        # Heads whose weights changed are recomputed whole; those whose values alone did
        # keep their weights; the others (only rows of the input changed) are patched row
        # by row, when few rows did.
        revalued = {h for h in todo if group[h] in v_heads}
        rescored = heads | {h for h in todo if group[h] in kv_heads}
        if rows or krows:
            rescored |= revalued
        many = 8 * len(set(rows) | set(krows)) > max(s.n, s.m)  # too many rows to patch
        whole = [k for k, h in enumerate(todo) if h in rescored or many]
        patched = [k for k, h in enumerate(todo) if k not in whole and h not in revalued]
        for k, h in enumerate(todo):
            if h in revalued and h not in rescored:
                new[h] = _revalued(prev.heads[h], V[kv_index[k]])
        turned = _turns(st)  # (else Q_rot and K_rot are Q and K: stacked once)
        every = range(len(kvs))
        Ks, Vs = _stack_of(K, every, krows, k_rows[0]), _stack_of(V, every, krows, k_rows[1])
        Ks_rot = _stack_of(K_rot, every, krows, k_rows[2]) if turned else Ks
        for ks in (whole, patched):
            if not ks:
                continue
            hs, kvi = [todo[k] for k in ks], [kv_index[k] for k in ks]
            Qs = _stack_of(Q, ks, rows, q_rows[0])
            Qs_rot = _stack_of(Q_rot, ks, rows, q_rows[1]) if turned else Qs
            P = _Projections(Qs, Ks, Vs, Qs_rot, Ks_rot)
            kept = None if keep is None else keep[ks]
            if ks is whole:
                shown = [h for h in hs if prev.heads[h].made("scores") is not None]
                got = _attend(hs, P, kvi, rule, kept, shown)
            else:
                olds = [prev.heads[h] for h in hs]
                got = _patch_rows(rule, hs, kvi, olds, P, rows, krows, kept)
            for h, head in zip(hs, got, strict=True):
                old = prev.heads[h]
                queries = h not in heads and not rows
                keys = group[h] not in kv_changed and not krows
                values = group[h] in same_values
                new[h] = head.reusing(old, queries=queries, keys=keys, values=values)
                if ks is patched:  # rows of X alone: a drawn head's scores patched too
                    new[h] = new[h].carrying(old, rows, krows)
                else:
                    new[h] = new[h].replacing(old)
    _frozen(X)
    counts = prev.row_updates
    if rows and todo and preview_head is None:
        counts = np.zeros(s.n, dtype=np.int64) if counts is None else counts.copy()
        counts[rows] = counts[rows] + 1 if moved else 0
    if preview_head is not None or (not mix and todo):
        return _result(
            s,
            X,
            new,
            prev.future,
            concat=prev.concat,
            final=prev.final,
            complete=False,
            fresh=(preview_head,) if preview_head is not None else tuple(range(s.n_heads)),
            mixed_with=prev.mixed_with,
            mix_updates=prev.mix_updates,
            row_updates=counts,
        )
    concat, final, updates = prev.concat, prev.final, prev.mix_updates
    if todo or current or not prev.complete:
        concat, final, updates = _mixed(prev, s, new)
    elif w_o:
        remixed = _remix(prev, s)
        if remixed is None:
            concat, final, updates = (*_mix(s, _outputs(new)), 0)
        else:
            final, updates = remixed, updates + 1
    return _result(
        s, X, new, prev.future, concat=concat, final=final, mix_updates=updates, row_updates=counts
    )
