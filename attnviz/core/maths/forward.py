"""The reference forward pass: every intermediate of multi-head attention in float64.

The layer, in the brief's symbols (``compute``)::

    X   = X + positions                      (sinusoidal, when chosen)
    Q   = X W_Q + b_Q,  K = X_kv W_K + b_K,  V = X_kv W_V + b_V
    Q', K' = rope(norm(Q)), rope(norm(K))    (QK-norm and RoPE, when chosen: "turned";
                                             the norm per head, or per token over all
                                             heads' features together: "rms-whole")
    S   = Q' K'ᵀ                             the raw scores
    S   = softcap(S · scale) − slope·|i − j|  scaled (soft-cap and ALiBi when chosen)
    S   = mask(S)                            −∞ (or 0: the leak) on the hidden keys
    P   = softmax(S)                         along the keys, a sink in the denominator
    P   = reweight(P)                        drop-after-softmax, dropout
    out = P V;  concat = [out_1 … out_h];  final = concat W_O + b_O

Each step is a small function: the projections here, positions in ``positions.py``, the
scale, mask and softmax in ``scoring.py``; heads are computed together (one GEMM for the
projections, batched products for the scores). ``compute`` gives a ``Result`` of every
head (``results.py``), ``one_head`` a ``HeadResult`` of one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from attnviz.core.maths.positions import (
    dropout_keep,
    positions,
    rope_width,
    sinusoidal,
)
from attnviz.core.maths.results import Head, HeadResult, Result, Stages
from attnviz.core.maths.scenario import Scenario, Settings
from attnviz.core.maths.scoring import Rule, softmax_in_place, weighted
from attnviz.core.maths.variants import rms_norm, rope, whole_rms

FEW_ROWS = 8  # an edited row or two: projected without reshaping every head's W


# Inputs -------------------------------------------------------------------------------


def inputs(s: Scenario) -> tuple[np.ndarray, np.ndarray]:
    """X plus the sinusoidal encoding, if any, and the keys' input: that same X, or X_kv
    as given under cross-attention (an encoder's output already carries its positions)."""
    X = s.X + sinusoidal(s.n, s.d_model) if s.settings.positional == "sinusoidal" else s.X
    _frozen(X)
    return X, X if s.X_kv is None else s.X_kv


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
    return st.qk_norm != "none" or st.positional == "rope"


def turn(
    st: Settings,
    A: np.ndarray,
    norm: np.ndarray | None,
    pos: np.ndarray,
    rms: np.ndarray | None = None,
) -> np.ndarray:
    """Q or K as the scores see them: RMS-normalised (times the norm weights) with
    QK-norm, then rotated by position with RoPE; A itself when neither is on.

    Under "rms-whole" the divisor is per token over every head's features: ``rms``
    (1, rows, 1) as ``whole_rms`` makes it from all heads, or, when not given, made from
    A itself (then A must hold every head)."""
    if st.qk_norm == "rms":
        A = rms_norm(A, norm, st.qk_norm_eps)
    elif st.qk_norm == "rms-whole":
        A = A / (whole_rms(A, st.qk_norm_eps) if rms is None else rms)
        A = A if norm is None else A * norm
    if st.positional == "rope":
        dims = min(rope_width(st, A.shape[-1]), A.shape[-1] - A.shape[-1] % 2)
        if dims:
            A = rope(A, pos, st.rope_base, st.rope_style, dims, st.rope_frequencies, st.rope_factor)
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
    rms = _whole(s, X, rows, "W_Q", "b_Q", Q, len(heads) == s.n_heads)
    return Q, turn(s.settings, Q, s.q_norm.take(heads), qpos, rms)


def keys(
    s: Scenario, X_kv: np.ndarray, kv: Sequence[int], rows: Any = slice(None)
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """K, V and K turned (G', r, d_k) of the given key/value heads, for rows of X_kv."""
    kpos = positions(s)[1][rows]
    if not s.settings.projections:
        K = X_kv[None, rows]
        return K, K, turn(s.settings, K, None, kpos)
    K = project(X_kv[rows], s.W_K.take(kv)) + s.b_K.take(kv)
    rms = _whole(s, X_kv, rows, "W_K", "b_K", K, len(kv) == s.kv_heads)
    return K, values(s, X_kv, kv, rows), turn(s.settings, K, s.k_norm.take(kv), kpos, rms)


def _whole(
    s: Scenario, X: np.ndarray, rows: Any, weight: str, bias: str, A: np.ndarray, every: bool
) -> np.ndarray | None:
    """Under "rms-whole", the per-token divisor over every head of the projection (A
    itself when it holds every head; else all heads are projected for it); else None."""
    if s.settings.qk_norm != "rms-whole":
        return None
    if not every:
        A = project(X[rows], getattr(s, weight).array()) + getattr(s, bias).array()
    return whole_rms(A, s.settings.qk_norm_eps)


def values(s: Scenario, X_kv: np.ndarray, kv: Sequence[int], rows: Any = slice(None)) -> np.ndarray:
    """V (G', r, d_k) of the given key/value heads."""
    return project(X_kv[rows], s.W_V.take(kv)) + s.b_V.take(kv)  # type: ignore[no-any-return]


def head_count(s: Scenario) -> int:
    """Heads in a result: one (Q = K = V = X) with projections off."""
    return s.n_heads if s.settings.projections else 1


def kv_of(s: Scenario, heads: Sequence[int]) -> list[int]:
    """The key/value head each of the given query heads reads."""
    return [s.kv_head_of(h) if s.settings.projections else 0 for h in heads]


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
