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

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from attnviz.core.maths.scenario import MINUS_INF_MASKS, Scenario, Settings
from attnviz.core.maths.variants import visible

HEAD_MATRICES = ("Q", "K", "V", "scores", "scaled", "masked", "weights", "output")
LAYER_MATRICES = ("X", "concat", "final")


@dataclass(frozen=True, eq=False)
class Head:
    """One head's intermediates; all arrays read-only float64 (empty_rows and keep bool).

    ``Q``, ``K``, ``V`` and ``output`` are n × d_k; ``scores``, ``scaled``, ``masked``
    and ``weights`` are n × n. Per row (length n):

    - ``leak``: total weight on the keys the mask hides (future keys j > i, and under a
      sliding window the keys that fell out of it);
    - ``row_sum``: total weight of the row (1, except after drop-after-softmax or dropout);
    - ``entropy``: entropy in nats of the row's softmax distribution (before
      drop-after-softmax and dropout);
    - ``empty_rows``: True where every score of the row is masked (−∞). Such a row has
      no distribution: its weights, output and entropy are defined as 0, never NaN.

    ``keep`` is the n × n dropout mask (True = kept), or None without dropout.
    """

    Q: np.ndarray
    K: np.ndarray
    V: np.ndarray
    scores: np.ndarray
    scaled: np.ndarray
    masked: np.ndarray
    weights: np.ndarray
    output: np.ndarray
    leak: np.ndarray
    row_sum: np.ndarray
    entropy: np.ndarray
    empty_rows: np.ndarray
    keep: np.ndarray | None


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

    ``heads`` holds one ``Head`` per head, in order. For convenience each head field is
    also available stacked with the head on axis 0 (``result.weights[h, i, j]``), built
    on first use. With projections off there is one head with Q = K = V = X, ``concat``
    is its output and ``final`` equals ``concat`` (no W_O).

    A result with ``complete`` False is a preview published while a large update is
    still running: only head ``fresh`` (and ``X``) are current; the other heads,
    ``concat`` and ``final`` are those of the previous result.
    """

    tokens: tuple[str, ...]
    settings: Settings
    X: np.ndarray  # the input actually used: X plus the positional encoding, if any
    heads: tuple[Head, ...]
    concat: np.ndarray
    final: np.ndarray
    future: np.ndarray  # (n, n) bool: the mask hides key j from query i (hidden_keys)
    complete: bool = True
    fresh: int | None = None

    Q = _stacked("Q")
    K = _stacked("K")
    V = _stacked("V")
    scores = _stacked("scores")
    scaled = _stacked("scaled")
    masked = _stacked("masked")
    weights = _stacked("weights")
    output = _stacked("output")
    leak = _stacked("leak")
    row_sum = _stacked("row_sum")
    entropy = _stacked("entropy")
    empty_rows = _stacked("empty_rows")
    keep = _stacked("keep")

    @property
    def n_heads(self) -> int:
        return len(self.heads)

    @property
    def d_k(self) -> int:
        return self.heads[0].Q.shape[1]

    @property
    def scale_factor(self) -> float:
        """What raw scores are divided by: √d_k, or 1 with scaling off."""
        return float(np.sqrt(self.d_k)) if self.settings.scale else 1.0

    def matrix(self, name: str, head: int | None = None) -> np.ndarray:
        """One intermediate as a 2-D array; head (0-based) for the per-head ones."""
        if name in HEAD_MATRICES:
            if head is None or not 0 <= head < self.n_heads:
                raise KeyError(f"{name}: head {head} does not exist")
            return getattr(self.heads[head], name)  # type: ignore[no-any-return]
        if name in LAYER_MATRICES:
            return getattr(self, name)  # type: ignore[no-any-return]
        raise KeyError(f"unknown matrix {name!r}")


def sinusoidal(n: int, d_model: int) -> np.ndarray:
    """Sinusoidal position encoding: PE[p, 2i] = sin(p / 10000^(2i/d)), PE[p, 2i+1] = cos(...)."""
    pos = np.arange(n)[:, None]
    pair = np.arange(d_model) // 2
    angle = pos / np.power(10000.0, 2 * pair / d_model)
    return np.where(np.arange(d_model) % 2 == 0, np.sin(angle), np.cos(angle))


def future_mask(n: int) -> np.ndarray:
    """(n, n) bool, True where key j comes after query i."""
    return np.triu(np.ones((n, n), dtype=bool), k=1)


def hidden_keys(n: int, st: Settings) -> np.ndarray:
    """(n, n) bool, True where the mask hides key j from query i: the future keys, and
    under a sliding window also the keys more than ``window`` − 1 places back. (With no
    mask, the future keys all the same: what the leak and the marks are measured on.)"""
    if st.mask == "sliding-window":
        return ~visible(n, n, "sliding-window", window=st.window)
    return future_mask(n)


def dropout_keep(settings: Settings, shape: tuple[int, ...], skip: int = 0) -> np.ndarray | None:
    """The seeded dropout keep-mask (True = kept), or None when dropout is off.

    ``skip``: how many leading heads (slices of axis 0) of a larger draw to pass over, so
    that head h alone is ``dropout_keep(st, (1, n, n), skip=h)[0]``, bit for bit the same
    as ``dropout_keep(st, (heads, n, n))[h]`` without drawing the others.
    """
    if settings.dropout == 0:
        return None
    bits = np.random.PCG64(settings.dropout_seed)  # what default_rng(seed) uses
    bits.advance(skip * math.prod(shape[1:]))  # one 64-bit step per float64 drawn
    return np.random.Generator(bits).random(shape) >= settings.dropout


def softmax_rows(masked: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Softmax along the last axis of scores that may hold −∞.

    Subtracts the row maximum first. Returns (weights, row max m, sum of exp(s − m) Z,
    empty) where ``empty`` flags rows whose every score is −∞: their weights are 0.
    """
    m = masked.max(axis=-1)
    empty = np.isneginf(m)
    if empty.any():
        m = np.where(empty, 0.0, m)
    weights = np.exp(masked - m[..., None])
    Z = weights.sum(axis=-1)
    weights /= np.where(empty, 1.0, Z)[..., None]
    return weights, m, Z, empty


def row_entropy(
    masked: np.ndarray, p: np.ndarray, m: np.ndarray, Z: np.ndarray, empty: np.ndarray
) -> np.ndarray:
    """Entropy in nats of each row's softmax, from softmax_rows' outputs (0 for empty rows).

    −Σ p log p with log p = (s − m) − log Z is log Z + Σ p·(m − s): two sums of terms
    that are never negative, so nothing cancels at any score size. (The textbook
    log Z + m − Σ p·s subtracts two numbers near m and loses every digit once |s| is
    large: 0 instead of ln 8 for 8 equal scores of 1e12.)
    """
    gap = m[..., None] - masked  # ≥ 0; +∞ on masked keys, whose p is exactly 0
    np.minimum(gap, np.finfo(np.float64).max, out=gap)  # so that 0·gap is 0, not NaN
    with np.errstate(divide="ignore"):
        return np.where(empty, 0.0, np.log(Z) + np.einsum("...j,...j->...", p, gap))


def mask_scores(scaled: np.ndarray, mask: str, future: np.ndarray) -> np.ndarray:
    """The scores softmax sees: −∞ (causal, sliding-window) or 0 (causal-zero) on the
    hidden keys."""
    if mask in MINUS_INF_MASKS:
        return np.where(future, -np.inf, scaled)
    if mask == "causal-zero":
        return np.where(future, 0.0, scaled)
    return scaled  # none, and drop-after-softmax (which acts on the weights)


def _frozen(*arrays: np.ndarray) -> None:
    for a in arrays:
        a.flags.writeable = False


def _input(s: Scenario) -> np.ndarray:
    """X plus the position encoding, if any."""
    if s.settings.positional == "sinusoidal":
        return s.X + sinusoidal(s.n, s.d_model)
    return s.X


def _project(X: np.ndarray, W: np.ndarray) -> np.ndarray:
    """X @ W[h] for every head as one GEMM: (n, d) @ (h, d, d_k) -> (h, n, d_k).

    numpy's broadcast matmul over a stack does not reach BLAS; one wide product does.
    """
    h, d, d_k = W.shape
    flat = X @ W.transpose(1, 0, 2).reshape(d, h * d_k)
    return np.ascontiguousarray(flat.reshape(X.shape[0], h, d_k).transpose(1, 0, 2))


def _attend(
    Q: np.ndarray,
    K: np.ndarray,
    V: np.ndarray,
    st: Settings,
    future: np.ndarray,
    keep: np.ndarray | None,
) -> list[Head]:
    """Scores, masks, softmax, outputs and row statistics for a stack of heads."""
    d_k = Q.shape[2]
    scores = Q @ np.ascontiguousarray(K.transpose(0, 2, 1))
    scaled = scores / np.sqrt(d_k) if st.scale else scores
    masked = mask_scores(scaled, st.mask, future)

    p, m, Z, empty = softmax_rows(masked)
    entropy = row_entropy(masked, p, m, Z, empty)

    weights = p
    if st.mask == "drop-after-softmax":
        weights[:, future] = 0.0
    if keep is not None:
        weights *= keep
        weights /= 1.0 - st.dropout
    stacks = {
        "Q": Q,
        "K": K,
        "V": V,
        "scores": scores,
        "scaled": scaled,
        "masked": masked,
        "weights": weights,
        "output": weights @ V,
        "leak": np.einsum("hij,ij->hi", weights, future.astype(np.float64)),
        "row_sum": weights.sum(axis=-1),
        "entropy": entropy,
        "empty_rows": empty,
    }
    return split_heads(stacks, keep)


def split_heads(stacks: dict[str, np.ndarray], keep: np.ndarray | None) -> list[Head]:
    """Per-head views of arrays stacked on axis 0, frozen."""
    _frozen(*stacks.values(), *(() if keep is None else (keep,)))
    count = stacks["Q"].shape[0]
    return [
        Head(**{name: a[h] for name, a in stacks.items()}, keep=None if keep is None else keep[h])
        for h in range(count)
    ]


def _mix(s: Scenario, outputs: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """concat of the head outputs in head order, and the final output concat · W_O.

    Ablated heads keep their outputs in concat but contribute nothing to the final mix.
    """
    concat = np.concatenate(outputs, axis=1)
    if not s.settings.projections:
        final = concat
    elif s.settings.ablated:
        kept = kept_columns(s.settings, len(outputs), outputs[0].shape[1])
        final = concat[:, kept] @ s.W_O[kept]
    else:
        final = concat @ s.W_O
    _frozen(concat, final)
    return concat, final


def _outputs(heads: Iterable[Head]) -> list[np.ndarray]:
    return [h.output for h in heads]


def kept_columns(settings: Settings, n_heads: int, d_k: int) -> np.ndarray:
    """Which columns of concat (rows of W_O) belong to heads that are not ablated."""
    return np.repeat([h not in settings.ablated for h in range(n_heads)], d_k)


def compute(s: Scenario) -> Result:
    """Every intermediate of attention over the scenario, in float64."""
    X = _input(s)
    if s.settings.projections:
        Q, K, V = _project(X, s.W_Q), _project(X, s.W_K), _project(X, s.W_V)
    else:
        Q = K = V = X[None]
    future = hidden_keys(s.n, s.settings)
    keep = dropout_keep(s.settings, (Q.shape[0], s.n, s.n))
    heads = _attend(Q, K, V, s.settings, future, keep)
    _frozen(X, future)
    return Result(s.tokens, s.settings, X, tuple(heads), *_mix(s, _outputs(heads)), future)


def compute_head(s: Scenario, h: int) -> Head:
    """Head h (0-based) of compute(s), computing that head only: the same numbers."""
    return one_head(s, h).heads[0]


def one_head(s: Scenario, h: int) -> Result:
    """X and head h (0-based) of compute(s), bit for bit, without computing the other heads.

    The Result holds that head alone, as its head 0; ``concat`` and ``final`` need every
    head and are left empty (0 × 0). For figures of one head at long sequences.
    """
    count = s.n_heads if s.settings.projections else 1
    if not 0 <= h < count:
        raise KeyError(f"head {h} does not exist ({count} head(s))")
    X = _input(s)
    if s.settings.projections:
        Q, K, V = (_project(X, W[h : h + 1]) for W in (s.W_Q, s.W_K, s.W_V))
    else:
        Q = K = V = X[None]
    future = hidden_keys(s.n, s.settings)
    keep = dropout_keep(s.settings, (1, s.n, s.n), skip=h)
    heads = _attend(Q, K, V, s.settings, future, keep)
    empty = np.empty((0, 0))
    _frozen(X, future, empty)
    return Result(s.tokens, s.settings, X, tuple(heads), empty, empty, future)


def _head_output(
    Q: np.ndarray,
    K: np.ndarray,
    V: np.ndarray,
    st: Settings,
    future: np.ndarray,
    keep: np.ndarray | None,
    block: int = 256,
) -> np.ndarray:
    """One head's output weights · V as _attend computes it (the same steps; BLAS may round
    a block's products differently in the last bit), a block of query rows at a time: no
    n × n intermediate is stored."""
    n, d_k = Q.shape
    Kt = np.ascontiguousarray(K.T)
    out = np.empty((n, V.shape[1]))
    for a in range(0, n, block):
        rows = slice(a, min(n, a + block))
        scores = Q[rows] @ Kt
        scaled = scores / np.sqrt(d_k) if st.scale else scores
        weights, *_ = softmax_rows(mask_scores(scaled, st.mask, future[rows]))
        if st.mask == "drop-after-softmax":
            weights[future[rows]] = 0.0
        if keep is not None:
            weights *= keep[rows]
            weights /= 1.0 - st.dropout
        out[rows] = weights @ V
    return out


def layer(s: Scenario, block: int = 256) -> Result:
    """X, concat and final of compute(s) (to the last bit or two), one head and one block
    of query rows at a time: no n × n matrix is stored, for the layer-wide views at long
    sequences.

    The Result has no heads (``heads`` is empty).
    """
    X, future = _input(s), hidden_keys(s.n, s.settings)
    count = s.n_heads if s.settings.projections else 1
    outputs = []
    for h in range(count):
        if s.settings.projections:
            Q, K, V = (_project(X, W[h : h + 1])[0] for W in (s.W_Q, s.W_K, s.W_V))
        else:
            Q = K = V = X
        keep = dropout_keep(s.settings, (1, s.n, s.n), skip=h)
        keep = None if keep is None else keep[0]
        outputs.append(_head_output(Q, K, V, s.settings, future, keep, block))
    _frozen(X, future)
    return Result(s.tokens, s.settings, X, (), *_mix(s, outputs), future)


def update(
    prev: Result,
    s: Scenario,
    x_rows: Iterable[int] = (),
    heads: Iterable[int] = (),
    w_o: bool = False,
    *,
    preview_head: int | None = None,
    current_heads: Iterable[int] = (),
) -> Result:
    """compute(s), reusing prev where only the named parts of the scenario changed.

    prev must come from a scenario that differs from s only in the given rows of X,
    the given heads' W_Q/W_K/W_V, and (w_o) W_O. An X row changes that row of every
    head's Q, K and V; a head's weights change that head only; W_O changes the final
    output only. Anything else (settings, sizes, no projections) is a full compute.

    ``preview_head``: recompute just that head and return a preview (``complete`` False).
    ``current_heads``: heads of prev that are already current (from such a preview).
    """
    st = s.settings
    rows = sorted(set(x_rows))
    same_shape = prev.X.shape == s.X.shape and prev.heads[0].Q.shape == (s.n, s.d_k)
    if prev.settings != st or not same_shape or prev.n_heads != s.n_heads or not st.projections:
        return compute(s)
    X = _input(s) if rows else prev.X
    affected = set(range(s.n_heads)) if rows else set(heads)
    affected -= set(current_heads)
    if preview_head is not None:
        affected &= {preview_head}
    todo = sorted(affected)
    new = list(prev.heads)
    if todo:
        QKV = []
        for name in ("W_Q", "W_K", "W_V"):
            W = getattr(s, name)[todo]
            stack = np.stack([getattr(prev.heads[h], name[-1]) for h in todo])
            edited = [k for k, h in enumerate(todo) if h in set(heads)]
            if edited:
                stack[edited] = _project(X, W[edited])
            if rows:
                stack[:, rows] = _project(X[rows], W)
            QKV.append(stack)
        keeps = [prev.heads[h].keep for h in todo]
        keep = None if keeps[0] is None else np.stack(keeps)  # type: ignore[arg-type]
        Q, K, V = QKV
        for h, head in zip(todo, _attend(Q, K, V, st, prev.future, keep), strict=True):
            new[h] = head
    _frozen(X)
    if preview_head is not None:
        return Result(
            s.tokens,
            st,
            X,
            tuple(new),
            prev.concat,
            prev.final,
            prev.future,
            complete=False,
            fresh=preview_head,
        )
    concat, final = (
        _mix(s, _outputs(new))
        if todo or current_heads or w_o or not prev.complete
        else (prev.concat, prev.final)
    )
    return Result(s.tokens, st, X, tuple(new), concat, final, prev.future)
