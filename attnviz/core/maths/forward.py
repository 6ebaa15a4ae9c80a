"""The reference forward pass: every intermediate of multi-head attention in float64.

The layer, in the brief's symbols (``compute``)::

    X   = X + positions                      (sinusoidal, when chosen)
    Q   = X W_Q + b_Q,  K = X_kv W_K + b_K,  V = X_kv W_V + b_V
    Q', K' = rope(norm(Q)), rope(norm(K))    (QK-norm and RoPE, when chosen: "turned")
    S   = Q' K'ᵀ                             the raw scores
    S   = softcap(S · scale) − slope·|i − j|  scaled (soft-cap and ALiBi when chosen)
    S   = mask(S)                            −∞ (or 0: the leak) on the hidden keys
    P   = softmax(S)                         along the keys, a sink in the denominator
    P   = reweight(P)                        drop-after-softmax, dropout
    out = P V;  concat = [out_1 … out_h];  final = concat W_O + b_O

Each step is a small function below; heads are computed together (one GEMM for the
projections, batched products for the scores). ``compute`` gives a ``Result`` of every
head, ``one_head`` a ``HeadResult`` of one.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from attnviz.core.maths.scenario import MINUS_INF_MASKS, Scenario, Settings
from attnviz.core.maths.variants import alibi_slopes, query_offset, rms_norm, rope, tanh, visible

HEAD_MATRICES = ("Q", "K", "V", "scores", "scaled", "masked", "weights", "output")
TURNED_MATRICES = ("Q_rot", "K_rot")  # Q and K as the scores see them: after QK-norm and RoPE
STAGE_MATRICES = ("scores", "scaled", "masked")  # what a head's softmax was made from
LAYER_MATRICES = ("X", "concat", "final")
SOFTMAX_ROWS = 128  # rows at a time when the trailing −∞ of each row are skipped
FEW_ROWS = 8  # an edited row or two: projected without reshaping every head's W


# Inputs and positions -----------------------------------------------------------------


def sinusoidal(n: int, d_model: int, rows: Any = slice(None)) -> np.ndarray:
    """Sinusoidal position encoding, the given rows (positions) of its n × d_model table:
    PE[p, 2i] = sin(p / 10000^(2i/d)), PE[p, 2i+1] = cos(...). Each cell's sin or cos
    alone, the same numbers whichever rows are asked for."""
    pos = np.arange(n)[rows][:, None]
    pair = np.arange(d_model) // 2
    angle = pos / np.power(10000.0, 2 * pair / d_model)
    out: np.ndarray = np.empty_like(angle)
    np.sin(angle[:, 0::2], out=out[:, 0::2])
    np.cos(angle[:, 1::2], out=out[:, 1::2])
    return out


def inputs(s: Scenario) -> tuple[np.ndarray, np.ndarray]:
    """X plus the sinusoidal encoding, if any, and the keys' input: that same X, or X_kv
    as given under cross-attention (an encoder's output already carries its positions)."""
    X = s.X + sinusoidal(s.n, s.d_model) if s.settings.positional == "sinusoidal" else s.X
    _frozen(X)
    return X, X if s.X_kv is None else s.X_kv


def future_mask(n: int) -> np.ndarray:
    """(n, n) bool, True where key j comes after query i."""
    return np.triu(np.ones((n, n), dtype=bool), k=1)


def hidden_keys(s: Scenario) -> np.ndarray:
    """(n, m) bool, True where the mask hides key j from query i: the future keys (under
    the causal alignment), and under a sliding window or a custom mask what those hide.
    (With no mask, the future keys all the same: what the leak is measured on.)"""
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


# Projections --------------------------------------------------------------------------


def project(X: np.ndarray, W: np.ndarray) -> np.ndarray:
    """X @ W[h] for every head as one GEMM: (n, d) @ (h, d, d_k) -> (h, n, d_k).

    numpy's broadcast matmul over a stack does not reach BLAS; one wide product does.
    """
    h, d, d_k = W.shape
    if X.shape[0] <= FEW_ROWS:
        few: np.ndarray = np.matmul(X, W)
        return few
    flat = X @ W.transpose(1, 0, 2).reshape(d, h * d_k)
    return np.ascontiguousarray(flat.reshape(X.shape[0], h, d_k).transpose(1, 0, 2))


def turns(st: Settings) -> bool:
    """Whether Q and K as the scores see them differ from Q and K (QK-norm or RoPE)."""
    return st.qk_norm == "rms" or st.positional == "rope"


def turn(st: Settings, A: np.ndarray, norm: np.ndarray | None, pos: np.ndarray) -> np.ndarray:
    """Q or K as the scores see them: RMS-normalised (times the norm weights) with
    QK-norm, then rotated by position with RoPE; A itself when neither is on."""
    if st.qk_norm == "rms":
        A = rms_norm(A, norm, st.qk_norm_eps)
    if st.positional == "rope":
        dims = min(rope_width(st, A.shape[-1]), A.shape[-1] - A.shape[-1] % 2)
        if dims:
            A = rope(A, pos, st.rope_base, st.rope_style, dims)
    return A


def queries(
    s: Scenario, X: np.ndarray, heads: Sequence[int], rows: Any = slice(None)
) -> tuple[np.ndarray, np.ndarray]:
    """Q and Q turned (H', r, d_k) of the given query heads, for the given rows of X."""
    qpos = positions(s)[0][rows]
    if not s.settings.projections:
        Q = X[None, rows]
        return Q, turn(s.settings, Q, None, qpos)
    Q = project(X[rows], s.W_Q.take(heads)) + s.b_Q.take(heads)
    return Q, turn(s.settings, Q, s.q_norm.take(heads), qpos)


def keys(
    s: Scenario, X_kv: np.ndarray, kv: Sequence[int], rows: Any = slice(None)
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """K, V and K turned (G', r, d_k) of the given key/value heads, for rows of X_kv."""
    kpos = positions(s)[1][rows]
    if not s.settings.projections:
        K = X_kv[None, rows]
        return K, K, turn(s.settings, K, None, kpos)
    K = project(X_kv[rows], s.W_K.take(kv)) + s.b_K.take(kv)
    return K, values(s, X_kv, kv, rows), turn(s.settings, K, s.k_norm.take(kv), kpos)


def values(s: Scenario, X_kv: np.ndarray, kv: Sequence[int], rows: Any = slice(None)) -> np.ndarray:
    """V (G', r, d_k) of the given key/value heads."""
    return project(X_kv[rows], s.W_V.take(kv)) + s.b_V.take(kv)  # type: ignore[no-any-return]


def head_count(s: Scenario) -> int:
    """Heads in a result: one (Q = K = V = X) with projections off."""
    return s.n_heads if s.settings.projections else 1


def kv_of(s: Scenario, heads: Sequence[int]) -> list[int]:
    """The key/value head each of the given query heads reads."""
    return [s.kv_head_of(h) if s.settings.projections else 0 for h in heads]


# From scores to weights ---------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Rule:
    """How a computation turns raw scores into what softmax sees, and softmax into the
    weights: the scale, soft-cap, ALiBi, the mask and the reweighting. Made once per
    scenario (``Rule.of``), every array in it made then and read-only."""

    settings: Settings
    d_k: int  # the width whose root scores are divided by
    future: np.ndarray  # (n, m) bool: the keys the mask hides (hidden_keys)
    slopes: np.ndarray | None  # ALiBi: one slope per query head of the scenario
    distance: np.ndarray | None  # ALiBi: (n, m) |query position − key position|
    ends: np.ndarray | None  # under a −∞ mask: each row's column after its last seen key

    @staticmethod
    def of(s: Scenario, future: np.ndarray | None = None) -> Rule:
        st = s.settings
        future = hidden_keys(s) if future is None else future
        slopes = distance = ends = None
        if st.positional == "alibi":
            slopes = np.asarray(st.alibi_slopes or alibi_slopes(s.n_heads), dtype=np.float64)
            qpos, kpos = positions(s)
            distance = np.abs(qpos[:, None] - kpos[None, :]).astype(np.float64)
        if st.mask in MINUS_INF_MASKS:
            seen = ~future
            last = seen.shape[1] - np.argmax(seen[:, ::-1], axis=1)
            ends = np.where(seen.any(axis=1), last, 0)
        d_k = s.d_k if st.projections else s.d_model
        return Rule(st, d_k, _frozen(future), slopes, distance, ends)

    def scale(self, a: np.ndarray, heads: Sequence[int], rows: Any = slice(None)) -> None:
        """Raw scores a (H', r, m) of the given query heads and query rows, in place:
        times the scale, soft-capped, plus ALiBi."""
        st, scale = self.settings, scale_of(self.settings, self.d_k)
        if scale is None:
            a /= np.sqrt(self.d_k)
        elif scale != 1.0:
            a *= scale
        if st.softcap is not None:
            a /= st.softcap
            tanh(a, out=a)
            a *= st.softcap
        if self.slopes is not None and self.distance is not None:
            for k, h in enumerate(heads):
                a[k] -= self.slopes[h] * self.distance[rows]

    def mask(self, a: np.ndarray, rows: Any = slice(None)) -> None:
        """Scaled scores (…, r, m) in place: −∞ (causal, sliding-window, custom) or 0
        (causal-zero) on the hidden keys of the given query rows."""
        if self.masks:
            value = -np.inf if self.settings.mask in MINUS_INF_MASKS else 0.0
            np.copyto(a, value, where=self.future[rows])

    def reweight(self, w: np.ndarray, keep: np.ndarray | None, rows: Any = slice(None)) -> None:
        """Softmax weights (…, r, m) in place to the weights: drop-after-softmax zeroes
        the hidden keys; dropout keeps some (keep) and rescales them."""
        if self.settings.mask == "drop-after-softmax":
            np.copyto(w, 0.0, where=self.future[rows])
        if keep is not None:
            w *= keep
            w /= 1.0 - self.settings.dropout

    def alibi(self, head: int) -> np.ndarray:
        """The ALiBi term query head ``head``'s scaled scores hold: −slope · distance."""
        if self.slopes is None or self.distance is None:
            raise ValueError("these settings add no ALiBi term")
        return _frozen(-(self.slopes[head] * self.distance))

    def row_ends(self, rows: Any, count: int) -> np.ndarray | None:
        """ends of the given query rows when a block of rows at a time may stop there:
        more rows than a block, under a −∞ mask (every later weight is 0)."""
        if count > SOFTMAX_ROWS and self.ends is not None:
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

    def sinks(self, heads: Sequence[int]) -> np.ndarray | None:
        """(H', 1) the given query heads' sink logits, or None without sinks."""
        sinks = self.settings.sinks
        return None if sinks is None else np.asarray(sinks, dtype=np.float64)[list(heads)][:, None]


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
    for r0, r1, end in row_blocks(ends):
        parts.append(_softmax_part(a[..., r0:r1, :end], sink))
        a[..., r0:r1, end:] = 0.0
    m, Z, empty = (np.concatenate([part[k] for part in parts], axis=-1) for k in range(3))
    return m, Z, empty


def row_blocks(ends: np.ndarray) -> Iterator[tuple[int, int, int]]:
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
    q·(m − sink).
    """
    gap = m[..., None] - masked  # ≥ 0; +∞ on masked keys, whose p is exactly 0
    np.minimum(gap, np.finfo(np.float64).max, out=gap)  # so that 0·gap is 0, not NaN
    with np.errstate(divide="ignore"):
        return np.where(empty, 0.0, np.log(Z) + np.einsum("...j,...j->...", p, gap))


def weighted(rule: Rule, w: np.ndarray, V: np.ndarray, rows: Any = slice(None)) -> np.ndarray:
    """w @ V for weights (…, r, m) of the given query rows; under a −∞ mask a block of
    rows at a time, each by the values up to the last key a row of it sees (37 % less
    work at n = 512 under a causal mask)."""
    ends = rule.row_ends(rows, w.shape[-2])
    if ends is None:
        return w @ V  # type: ignore[no-any-return]
    out = np.empty((*w.shape[:-1], V.shape[-1]))
    for r0, r1, end in row_blocks(ends):
        np.matmul(w[..., r0:r1, :end], V[..., :end, :], out=out[..., r0:r1, :])
    return out


# Heads and results --------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Stages:
    """What one head's softmax was made from, n × m each: the raw scores Q' K'ᵀ, scaled
    (times the scale, soft-capped, plus ALiBi) and masked (what softmax sees)."""

    scores: np.ndarray
    scaled: np.ndarray
    masked: np.ndarray


@dataclass(frozen=True, eq=False)
class RowStats:
    """Per query row of one head: weight on the hidden keys, the row's total weight,
    and the entropy (nats) of its softmax distribution."""

    leak: np.ndarray
    row_sum: np.ndarray
    entropy: np.ndarray


@dataclass(frozen=True, eq=False)
class Head:
    """One head's intermediates; all arrays read-only float64 (empty_rows and keep bool).

    ``Q`` and ``output`` are n × d_k, ``K`` and ``V`` m × d_k (the key/value head this
    query head reads): the projections with their biases. ``Q_rot`` and ``K_rot`` are Q
    and K as the scores see them (after QK-norm and RoPE; Q and K themselves otherwise).
    ``weights`` is n × m. Per row: ``m`` and ``Z``, the softmax's offset (the row's
    maximum) and denominator Σ exp(s − m) with the sink's term; ``sink``, the share of
    the row's softmax the sink took (0 without sinks); ``empty_rows``, True where every
    score is −∞ and there is no sink (weights, output and entropy 0, never NaN).
    ``keep`` is the n × m dropout mask (True = kept), or None.

    ``stages`` (scores, scaled, masked) are kept for the heads a computation was asked to
    keep them for (the shown head); for any other they are made again when asked for,
    never stored afterwards. ``rows`` likewise (leak, row_sum, entropy).
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
    index: int  # which query head of the scenario (its ALiBi slope, its sink)
    rule: Rule | None  # None: stages and rows were given (the torch engine)
    stages: Stages | None = None
    rows: RowStats | None = None

    def made_stages(self) -> Stages:
        """The head's stages: kept, or made again from Q' and K'."""
        if self.stages is not None:
            return self.stages
        assert self.rule is not None, "a head without a rule was given its stages"
        scores = self.Q_rot @ np.ascontiguousarray(self.K_rot.T)
        scaled = scores.copy()
        self.rule.scale(scaled[None], [self.index])
        masked = scaled
        if self.rule.masks:
            masked = scaled.copy()
            self.rule.mask(masked)
        return Stages(_frozen(scores), _frozen(scaled), _frozen(masked))

    @property
    def scores(self) -> np.ndarray:
        return self.made_stages().scores

    @property
    def scaled(self) -> np.ndarray:
        return self.made_stages().scaled

    @property
    def masked(self) -> np.ndarray:
        return self.made_stages().masked

    def row_stats(self) -> RowStats:
        """leak, row_sum and entropy: given, or made from the weights and the stages."""
        if self.rows is not None:
            return self.rows
        assert self.rule is not None
        rule, masked = self.rule, self.masked
        p = self.weights
        if rule.reweighted:  # the softmax before the weights were changed
            p = np.exp(masked - self.m[:, None])
            p /= np.where(self.empty_rows, 1.0, self.Z)[:, None]
        entropy = row_entropy(masked, p, self.m, self.Z, self.empty_rows)
        if rule.settings.sinks is not None:
            entropy += self.sink * (self.m - rule.settings.sinks[self.index])
        leak = np.einsum("ij,ij->i", self.weights, rule.future.astype(np.float64))
        return RowStats(_frozen(leak), _frozen(self.weights.sum(axis=-1)), _frozen(entropy))

    @property
    def leak(self) -> np.ndarray:
        return self.row_stats().leak

    @property
    def row_sum(self) -> np.ndarray:
        return self.row_stats().row_sum

    @property
    def entropy(self) -> np.ndarray:
        return self.row_stats().entropy


@dataclass(frozen=True, eq=False)
class Computed:
    """What every result of one scenario holds beside its heads: the tokens, settings,
    the input actually used (X plus the positional encoding, if any) and the mask."""

    tokens: tuple[str, ...]
    settings: Settings
    X: np.ndarray
    future: np.ndarray  # (n, m) bool: the mask hides key j from query i (hidden_keys)
    key_tokens: tuple[str, ...] | None  # the keys' labels under cross-attention
    X_kv: np.ndarray | None  # the keys' input under cross-attention
    biases: tuple[str, ...]  # the biases in use (not all zero): of b_Q, b_K, b_V, b_O
    n_heads: int
    d_k: int

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

    def head(self, h: int) -> Head:
        """Query head h (0-based); KeyError when this result does not hold it."""
        raise KeyError(f"head {h + 1}: this result holds no heads")

    def matrix(self, name: str, head: int | None = None) -> np.ndarray:
        """One intermediate as a 2-D array; head (0-based) for the per-head ones."""
        if name in HEAD_MATRICES or name in TURNED_MATRICES:
            if head is None:
                raise KeyError(f"{name}: which head?")
            return getattr(self.head(head), name)  # type: ignore[no-any-return]
        if name in LAYER_MATRICES:
            return self._layer_matrix(name)
        raise KeyError(f"unknown matrix {name!r}")

    def _layer_matrix(self, name: str) -> np.ndarray:
        if name == "X":
            return self.X
        raise KeyError(f"{name}: this result holds one head, not the mix")


@dataclass(frozen=True, eq=False)
class HeadResult(Computed):
    """One query head of a scenario, computed before (or without) the others: what a
    view of that head draws first. It holds no mix, and no other head."""

    index: int
    one: Head

    def head(self, h: int) -> Head:
        if h != self.index:
            raise KeyError(f"head {h + 1}: this result holds head {self.index + 1} alone")
        return self.one


@dataclass(frozen=True, eq=False)
class Result(Computed):
    """Every intermediate of one scenario; all arrays are read-only.

    ``heads`` holds one ``Head`` per query head, in order; each head field is also
    available stacked with the head on axis 0 (``result.weights[h, i, j]``, made on
    each use). With projections off there is one head with Q = K = V = X (K = V = X_kv
    under cross-attention) and ``final`` equals ``concat`` (no W_O). A result of
    ``layer()`` (streaming) holds concat and final but no heads.
    """

    heads: tuple[Head, ...]
    concat: np.ndarray
    final: np.ndarray

    def head(self, h: int) -> Head:
        if not 0 <= h < len(self.heads):
            raise KeyError(f"head {h + 1} does not exist ({len(self.heads)} heads)")
        return self.heads[h]

    def _layer_matrix(self, name: str) -> np.ndarray:
        return self.X if name == "X" else self.concat if name == "concat" else self.final

    def stacked(self, name: str) -> np.ndarray | None:
        """One field of every head stacked on axis 0 (None for a field heads lack)."""
        parts = [getattr(h, name) for h in self.heads]
        if not parts or parts[0] is None:
            return None
        return _frozen(np.stack(parts))

    Q = property(lambda self: self.stacked("Q"))
    K = property(lambda self: self.stacked("K"))
    V = property(lambda self: self.stacked("V"))
    Q_rot = property(lambda self: self.stacked("Q_rot"))
    K_rot = property(lambda self: self.stacked("K_rot"))
    scores = property(lambda self: self.stacked("scores"))
    scaled = property(lambda self: self.stacked("scaled"))
    masked = property(lambda self: self.stacked("masked"))
    weights = property(lambda self: self.stacked("weights"))
    output = property(lambda self: self.stacked("output"))
    leak = property(lambda self: self.stacked("leak"))
    row_sum = property(lambda self: self.stacked("row_sum"))
    sink = property(lambda self: self.stacked("sink"))
    entropy = property(lambda self: self.stacked("entropy"))
    empty_rows = property(lambda self: self.stacked("empty_rows"))
    keep = property(lambda self: self.stacked("keep"))


# The layer ----------------------------------------------------------------------------


def attend(
    rule: Rule,
    heads: Sequence[int],
    Q: np.ndarray,
    Q_rot: np.ndarray,
    K: np.ndarray,
    V: np.ndarray,
    K_rot: np.ndarray,
    keep: np.ndarray | None = None,
    staged: Sequence[int] = (),
) -> list[Head]:
    """The given query heads from their projections, stacked on axis 0 (K, V, K_rot one
    per query head: GQA's shared heads repeated): scores, softmax, weights, outputs.
    The scores are computed into the array that becomes the weights; the heads in
    ``staged`` keep copies of their stages, made on the way."""
    w = Q_rot @ np.ascontiguousarray(K_rot.transpose(0, 2, 1))
    kept = {heads.index(h): {"scores": _frozen(w[heads.index(h)].copy())} for h in staged}
    rule.scale(w, heads)
    for k, stage in kept.items():
        stage["scaled"] = _frozen(w[k].copy())
    rule.mask(w)
    for k, stage in kept.items():
        stage["masked"] = _frozen(w[k].copy()) if rule.masks else stage["scaled"]
    sink = rule.sinks(heads)
    m, Z, empty = softmax_in_place(w, sink, rule.row_ends(slice(None), w.shape[-2]))
    share = np.zeros(m.shape) if sink is None else np.exp(sink - m) / Z
    rule.reweight(w, keep)
    out = weighted(rule, w, V)
    _frozen(Q, Q_rot, K, V, K_rot, w, out, m, Z, empty, share)
    return [
        Head(
            Q[k],
            K[k],
            V[k],
            Q_rot[k],
            K_rot[k],
            w[k],
            out[k],
            m[k],
            Z[k],
            empty[k],
            share[k],
            None if keep is None else _frozen(keep[k]),
            h,
            rule,
            Stages(**kept[k]) if k in kept else None,
        )
        for k, h in enumerate(heads)
    ]


def revalued(head: Head, V: np.ndarray) -> Head:
    """head with new values V (its W_V or b_V changed): the same weights, a new output."""
    assert head.rule is not None
    output = weighted(head.rule, head.weights, V)
    return replace(head, V=_frozen(V), output=_frozen(output))


def kept_columns(settings: Settings, n_heads: int, d_k: int) -> np.ndarray:
    """Which columns of concat (rows of W_O) belong to heads that are not ablated."""
    return np.repeat([h not in settings.ablated for h in range(n_heads)], d_k)


def final_of(s: Scenario, concat: np.ndarray) -> np.ndarray:
    """concat · W_O + b_O (ablated heads' columns left out); concat with projections off."""
    if not s.settings.projections:
        return concat
    if s.settings.ablated:
        kept = kept_columns(s.settings, s.n_heads, concat.shape[1] // s.n_heads)
        final = concat[:, kept] @ s.W_O[kept]
    else:
        final = concat @ s.W_O
    return final + s.b_O if s.b_O.any() else final  # type: ignore[no-any-return]


def mix(s: Scenario, outputs: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """concat of the head outputs in head order, and the final output. Ablated heads keep
    their outputs in concat but contribute nothing to the final mix."""
    concat = np.concatenate(outputs, axis=1)
    return _frozen(concat), _frozen(final_of(s, concat))


def biases_in_use(s: Scenario) -> tuple[str, ...]:
    """The biases that are not all zero (none with projections off)."""
    if not s.settings.projections:
        return ()
    return tuple(name for name in ("b_Q", "b_K", "b_V", "b_O") if getattr(s, name).any())


def context(s: Scenario, X: np.ndarray, future: np.ndarray) -> dict[str, Any]:
    """The fields of a Computed for scenario s (its input X, its mask)."""
    return {
        "tokens": s.tokens,
        "settings": s.settings,
        "X": X,
        "future": future,
        "key_tokens": s.kv_tokens,
        "X_kv": s.X_kv,
        "biases": biases_in_use(s),
        "n_heads": head_count(s),
        "d_k": s.d_k if s.settings.projections else s.d_model,
    }


def compute(s: Scenario, staged: Sequence[int] = ()) -> Result:
    """Every intermediate of attention over the scenario, in float64; the heads in
    ``staged`` keep their stages (scores, scaled, masked)."""
    X, X_kv = inputs(s)
    rule = Rule.of(s)
    heads = list(range(head_count(s)))
    group = kv_of(s, heads)
    Q, Q_rot = queries(s, X, heads)
    K, V, K_rot = keys(s, X_kv, sorted(set(group)))
    keep = dropout_keep(s.settings, (len(heads), s.n, s.m))
    if group != list(range(len(K))):  # (GQA: each query head reads its group's K and V)
        K, V = K[group], V[group]
        K_rot = K_rot[group] if turns(s.settings) else K
    out = attend(rule, heads, Q, Q_rot, K, V, K_rot, keep, staged)
    concat, final = mix(s, [h.output for h in out])
    return Result(**context(s, X, rule.future), heads=tuple(out), concat=concat, final=final)


def head_inputs(s: Scenario, h: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Query head h's Q and K as the scores see them (after QK-norm and RoPE), and its V:
    (n, d), (m, d), (m, d); nothing n × m is computed."""
    check_head(s, h)
    X, X_kv = inputs(s)
    _, Q_rot = queries(s, X, [h])
    _, V, K_rot = keys(s, X_kv, kv_of(s, [h]))
    return Q_rot[0], K_rot[0], V[0]


def one_head(s: Scenario, h: int, staged: bool = False) -> HeadResult:
    """Head h (0-based) of compute(s), without computing the other heads: the same
    numbers, but that BLAS may round a single-column product (d_k or n of 1) in
    another order. For a view of one head, and figures at long sequences."""
    check_head(s, h)
    X, X_kv = inputs(s)
    rule = Rule.of(s)
    Q, Q_rot = queries(s, X, [h])
    K, V, K_rot = keys(s, X_kv, kv_of(s, [h]))
    keep = dropout_keep(s.settings, (1, s.n, s.m), skip=h)
    head = attend(rule, [h], Q, Q_rot, K, V, K_rot, keep, [h] if staged else ())[0]
    return HeadResult(**context(s, X, rule.future), index=h, one=head)


def compute_head(s: Scenario, h: int) -> Head:
    """Head h (0-based) of compute(s), computing that head only."""
    return one_head(s, h).one


def check_head(s: Scenario, h: int) -> None:
    count = head_count(s)
    if not 0 <= h < count:
        raise KeyError(f"head {h + 1} does not exist ({count} head(s))")


def _frozen(*arrays: np.ndarray) -> np.ndarray:
    """Make the arrays read-only; returns the first."""
    for a in arrays:
        a.flags.writeable = False
    return arrays[0]
