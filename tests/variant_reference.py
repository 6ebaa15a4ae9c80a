"""The plain reference for attention with what current models add: biases, GQA/MQA,
cross-attention, QK-norm, RoPE, ALiBi, T5's relative position bias, soft-cap, sinks,
scale_value, causal alignment, sliding-window and custom masks, written from the spec's
order of operations.

It shares no code with attnviz: loops over heads, rows and pairs. ``reference(s)``
gives every intermediate; ``assert_matches_reference`` checks compute(s) against it.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import reference as plain

from attnviz.core.maths import forward as engine
from attnviz.core.maths.results import Result
from attnviz.core.maths.scenario import Scenario, Settings

FIELDS = (
    "Q",
    "K",
    "V",
    "Q_rot",
    "K_rot",
    "scores",
    "scaled",
    "masked",
    "weights",
    "output",
    "sink",
    "row_sum",
    "leak",
    "entropy",
)


# The reference: the spec's order of operations, one query head at a time -------------


def paper_slopes(H: int) -> list[float]:
    """ALiBi slopes: 2^(−8k/H) for k = 1 … H when H is a power of two; otherwise those of
    the largest power of two p below H, then every other slope of 2p (BLOOM)."""

    def geometric(count: int) -> list[float]:
        return [2.0 ** (-8.0 * k / count) for k in range(1, count + 1)]

    p = 1
    while 2 * p <= H:
        p *= 2
    if p == H:
        return geometric(H)
    return geometric(p) + geometric(2 * p)[0::2][: H - p]


def t5_bucket(relative: int, bidirectional: bool, buckets: int, max_distance: int) -> int:
    """T5's bucket of one relative position (key − query), from the paper's description
    and transformers' ``_relative_position_bucket``: its logarithm in float32 scalars."""
    bucket = 0
    if bidirectional:
        buckets = buckets // 2
        if relative > 0:
            bucket = buckets
        distance = abs(relative)
    else:
        distance = max(-relative, 0)
    exact = buckets // 2
    if distance < exact:
        return bucket + distance
    f32 = np.float32
    log = f32(np.log(f32(distance) / f32(exact))) / f32(math.log(max_distance / exact))
    return bucket + min(exact + int(log * f32(buckets - exact)), buckets - 1)


def rotate(
    A: np.ndarray, pos: list[int], base: float, style: str, r: int, freqs=None, factor=1.0
) -> np.ndarray:
    """Each pair of the first r features of row t turned by pos[t] · base^(−2i/r) (or
    pos[t] · freqs[i]), times the factor."""
    out = A.copy()
    for t in range(A.shape[0]):
        for i in range(r // 2):
            a, b = (i, i + r // 2) if style == "half" else (2 * i, 2 * i + 1)
            theta = pos[t] * (base ** (-2.0 * i / r) if freqs is None else freqs[i])
            x, y = A[t, a], A[t, b]
            out[t, a] = factor * (x * math.cos(theta) - y * math.sin(theta))
            out[t, b] = factor * (x * math.sin(theta) + y * math.cos(theta))
    return out


def rms(A: np.ndarray, weight: np.ndarray | None, eps: float) -> np.ndarray:
    out = np.array([row / math.sqrt(sum(v * v for v in row) / len(row) + eps) for row in A])
    return out if weight is None else out * weight


def hidden_by_hand(s: Scenario) -> np.ndarray:
    """(n, m) True where the mask hides key j from query i (the causal future for the
    masks that are not windows or custom)."""
    st_ = s.settings
    n, m = s.n, s.m
    offset = m - n if st_.causal_alignment == "bottom-right" else 0
    hidden = np.zeros((n, m), dtype=bool)
    for i in range(n):
        q = i + offset
        for j in range(m):
            if st_.mask == "sliding-window":
                hidden[i, j] = not (q - st_.window < j <= q)
            elif st_.mask == "custom":
                hidden[i, j] = s.mask_matrix[i, j] == 0
            else:
                hidden[i, j] = j > q
    return hidden


def reference(s: Scenario, keep: np.ndarray | None = None) -> dict[str, Any]:
    """Every intermediate per query head (lists), concat and final, from the spec.

    ``keep``: the dropout keep-mask (H, n, m) to apply (the engine's seeded draw).
    """
    st_ = s.settings
    n, m = s.n, s.m
    X = s.X + plain.sinusoidal(n, s.d_model) if st_.positional == "sinusoidal" else s.X
    X_kv = X if s.X_kv is None else s.X_kv
    offset = m - n if st_.causal_alignment == "bottom-right" else 0
    qpos, kpos = [i + offset for i in range(n)], list(range(m))
    proj = st_.projections
    H, G = (s.n_heads, s.kv_heads) if proj else (1, 1)
    d = s.d_k if proj else s.d_model
    slopes = list(st_.alibi_slopes) if st_.alibi_slopes is not None else paper_slopes(s.n_heads)
    hidden = hidden_by_hand(s)
    heads: dict[str, list[np.ndarray]] = {name: [] for name in (*FIELDS, "empty_rows")}
    whole = {}
    if st_.qk_norm == "rms-whole":  # per token, one RMS over every head's features
        Qs = [X @ s.W_Q[h] + s.b_Q[h, 0] for h in range(H)] if proj else [X]
        Ks = [X_kv @ s.W_K[g] + s.b_K[g, 0] for g in range(G)] if proj else [X_kv]
        for name, stack in (("Q", Qs), ("K", Ks)):
            whole[name] = [
                math.sqrt(sum(float(v * v) for A in stack for v in A[i]) / (len(stack) * d)
                          + st_.qk_norm_eps)
                for i in range(len(stack[0]))
            ]  # fmt: skip
    for h in range(H):
        g = h * G // H
        if proj:
            Q = X @ s.W_Q[h] + s.b_Q[h, 0]
            K = X_kv @ s.W_K[g] + s.b_K[g, 0]
            V = X_kv @ s.W_V[g] + s.b_V[g, 0]
        else:
            Q, K, V = X, X_kv, X_kv
        Qr, Kr = Q, K
        if st_.qk_norm == "rms":
            Qr = rms(Qr, s.q_norm[h, 0] if proj else None, st_.qk_norm_eps)
            Kr = rms(Kr, s.k_norm[g, 0] if proj else None, st_.qk_norm_eps)
        elif whole:
            Qr = Q / np.array(whole["Q"])[:, None] * (s.q_norm[h, 0] if proj else 1.0)
            Kr = K / np.array(whole["K"])[:, None] * (s.k_norm[g, 0] if proj else 1.0)
        if st_.positional == "rope":
            r = st_.rope_dims if st_.rope_dims is not None else d - d % 2
            turn = (st_.rope_base, st_.rope_style, r, st_.rope_frequencies, st_.rope_factor)
            Qr = rotate(Qr, qpos, *turn)
            Kr = rotate(Kr, kpos, *turn)
        scores = np.array([[float(np.dot(Qr[i], Kr[j])) for j in range(m)] for i in range(n)])
        scale = 1.0
        if st_.scale:
            scale = st_.scale_value if st_.scale_value is not None else 1.0 / math.sqrt(d)
        scaled = scores * scale
        if st_.softcap is not None:
            scaled = st_.softcap * np.tanh(scaled / st_.softcap)
        if st_.positional == "alibi":
            for i in range(n):
                for j in range(m):
                    scaled[i, j] -= slopes[h] * abs(qpos[i] - kpos[j])
        if st_.positional == "relative-bias":
            for i in range(n):
                for j in range(m):
                    b = t5_bucket(kpos[j] - qpos[i], *relative_settings(st_))
                    scaled[i, j] += s.relative_bias[b, h]
        masked = scaled.copy()
        if st_.mask in ("causal", "sliding-window", "custom"):
            masked[hidden] = -math.inf
        elif st_.mask == "causal-zero":
            masked[hidden] = 0.0
        weights = np.zeros((n, m))
        share, entropy, empty = np.zeros(n), np.zeros(n), np.zeros(n, dtype=bool)
        for i in range(n):
            logits = list(masked[i])
            sink = st_.sinks[h] if st_.sinks is not None else None
            top = max(logits + ([sink] if sink is not None else []))
            if top == -math.inf:
                empty[i] = True
                continue
            e = [math.exp(v - top) for v in logits]
            z = sum(e) + (math.exp(sink - top) if sink is not None else 0.0)
            weights[i] = [v / z for v in e]
            share[i] = math.exp(sink - top) / z if sink is not None else 0.0
            outcomes = [*weights[i], share[i]]
            entropy[i] = -sum(p * math.log(p) for p in outcomes if p > 0)
        if st_.mask == "drop-after-softmax":
            weights[hidden] = 0.0
        if keep is not None:
            weights = weights * keep[h] / (1.0 - st_.dropout)
        output = weights @ V
        values = {
            "Q": Q,
            "K": K,
            "V": V,
            "Q_rot": Qr,
            "K_rot": Kr,
            "scores": scores,
            "scaled": scaled,
            "masked": masked,
            "weights": weights,
            "output": output,
            "sink": share,
            "row_sum": weights.sum(axis=1),
            "leak": (weights * hidden).sum(axis=1),
            "entropy": entropy,
            "empty_rows": empty,
        }
        for name, value in values.items():
            heads[name].append(value)
    concat = np.concatenate(heads["output"], axis=1)
    final = concat
    if proj:
        final = np.zeros((n, s.d_model))
        for h in range(H):
            if h not in st_.ablated:
                final += concat[:, h * d : (h + 1) * d] @ s.W_O[h * d : (h + 1) * d]
        final = final + s.b_O[0]
    return {**heads, "concat": concat, "final": final, "hidden": hidden}


def relative_settings(st_: Settings) -> tuple[bool, int, int]:
    return st_.relative_bidirectional, st_.relative_buckets, st_.relative_max_distance


def assert_close(got: Any, want: Any, what: str) -> None:
    """To rounding: relative to each entry, and to the matrix's largest (an entry near 0
    may be a difference of large ones)."""
    want = np.asarray(want)
    finite = want[np.isfinite(want)]
    largest = float(np.abs(finite).max()) if finite.size else 0.0
    np.testing.assert_allclose(
        np.asarray(got), want, rtol=1e-9, atol=1e-11 + 1e-14 * largest, err_msg=what
    )


def assert_matches_reference(s: Scenario, result: Result | None = None) -> None:
    """Every head field, empty_rows, concat and final of compute(s) against reference(s)."""
    got = engine.compute(s) if result is None else result
    keep = None if got.heads[0].keep is None else np.asarray(got.keep)
    want = reference(s, keep)
    assert got.n_heads == len(want["Q"])
    for h, head in enumerate(got.heads):
        for name in FIELDS:
            assert_close(getattr(head, name), want[name][h], f"head {h + 1} {name}")
        np.testing.assert_array_equal(head.empty_rows, want["empty_rows"][h])
    assert_close(got.concat, want["concat"], "concat")
    assert_close(got.final, want["final"], "final")
    np.testing.assert_array_equal(got.future, want["hidden"])


def random_scenario(rng, n, m, d_model, heads, kv, d_k, **settings) -> Scenario:
    """A scenario of normal random numbers: n queries over m keys (cross-attention when
    they differ), heads query heads over kv key/value heads of d_k."""
    cross = {}
    if m != n:
        cross = {
            "kv_tokens": tuple(f"k{j}" for j in range(m)),
            "X_kv": rng.normal(size=(m, d_model)),
        }
    return Scenario(
        tokens=tuple(f"t{i}" for i in range(n)),
        X=rng.normal(size=(n, d_model)),
        W_Q=rng.normal(size=(heads, d_model, d_k)),
        W_K=rng.normal(size=(kv, d_model, d_k)),
        W_V=rng.normal(size=(kv, d_model, d_k)),
        W_O=rng.normal(size=(heads * d_k, d_model)),
        settings=Settings(**settings),
        **cross,
    )


def llama3_frequencies(freq, factor, low, high, context):
    """Llama 3.1's RoPE rule applied to the base's frequencies ``freq``, written out: a
    pair whose wavelength is under context/high keeps its frequency, one over context/low
    has it divided by the factor, and one between moves from the one to the other in
    proportion to context/wavelength."""
    out = []
    for f in freq:
        wavelength = 2 * math.pi / f
        if wavelength < context / high:
            out.append(f)
        elif wavelength > context / low:
            out.append(f / factor)
        else:
            t = (context / wavelength - low) / (high - low)
            out.append((1 - t) * f / factor + t * f)
    return np.array(out)
