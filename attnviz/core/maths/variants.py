"""What current models add to attention, as small NumPy functions in float64.

Rotary position embeddings (RoPE), ALiBi slopes and biases, which keys a query may see
(causal with either alignment, sliding windows, custom masks), RMS normalisation of Q
and K, soft-capped scores, and a softmax with a sink logit. Each works on arrays whose
last two axes are (queries, keys) or (tokens, features), so it applies to one head or a
stack of heads alike. The engine composes them in the order the brief gives.
"""

from __future__ import annotations

import functools
import math

import numpy as np

ROPE_STYLES = ("half", "interleaved")
ALIGNMENTS = ("top-left", "bottom-right")


def rope_frequencies(dims: int, base: float = 10000.0) -> np.ndarray:
    """The dims/2 rotation frequencies base^(−2i/dims), i = 0 … dims/2 − 1 (radians per
    position)."""
    if dims <= 0 or dims % 2:
        raise ValueError(f"rope dims: {dims} is not a positive even number")
    return base ** (-np.arange(0, dims, 2, dtype=np.float64) / dims)


Frequencies = tuple[float, ...] | None  # a model's own per pair (scaled RoPE), or the base's


def pair_frequencies(dims: int, base: float, freqs: Frequencies = None) -> np.ndarray:
    """Each pair's frequency: ``freqs`` when given (one per pair: a model's scaled RoPE),
    else base^(−2i/dims)."""
    if freqs is None:
        return rope_frequencies(dims, base)
    if len(freqs) != dims // 2:
        raise ValueError(f"rope: {len(freqs)} frequencies for {dims // 2} pairs")
    return np.asarray(freqs, dtype=np.float64)


def rope_angles(
    positions: np.ndarray, dims: int, base: float = 10000.0, freqs: Frequencies = None
) -> np.ndarray:
    """(positions, dims/2): the angle by which each pair turns at each position."""
    angles: np.ndarray = np.asarray(positions, dtype=np.float64)[:, None] * pair_frequencies(
        dims, base, freqs
    )
    return angles


def _cos_sin(
    positions: np.ndarray, dims: int, base: float, freqs: Frequencies
) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin of rope_angles; remembered for a few runs of many consecutive positions
    (every edit of W_Q or W_K turns the same n positions again: 0.4 ms of cos and sin at
    n = 512)."""
    positions = np.asarray(positions, dtype=np.float64)
    count = len(positions)
    if (
        FEW_POSITIONS < count <= MOST_REMEMBERED // max(1, dims // 2)
        and (np.diff(positions) == 1).all()
    ):
        return _remembered_cos_sin(float(positions[0]), count, dims, base, freqs)
    angle = rope_angles(positions, dims, base, freqs)
    return np.cos(angle), np.sin(angle)


FEW_POSITIONS = 8  # (an edited row or two: quick to turn, and many different ones)
MOST_REMEMBERED = 1 << 18  # angles in one remembered set (4 MiB of cos and sin)


@functools.lru_cache(maxsize=8)
def _remembered_cos_sin(
    first: float, count: int, dims: int, base: float, freqs: Frequencies
) -> tuple[np.ndarray, np.ndarray]:
    angle = rope_angles(first + np.arange(count, dtype=np.float64), dims, base, freqs)
    cos, sin = np.cos(angle), np.sin(angle)
    cos.flags.writeable = sin.flags.writeable = False
    return cos, sin


def _pairs(dims: int, style: str) -> tuple[slice, slice]:
    """Which features make the pairs: i with i + dims/2 ("half": GPT-NeoX, Llama), or 2i
    with 2i + 1 ("interleaved": GPT-J)."""
    if style == "half":
        return slice(0, dims // 2), slice(dims // 2, dims)
    if style == "interleaved":
        return slice(0, dims, 2), slice(1, dims, 2)
    raise ValueError(f"rope style {style!r}: expected one of {', '.join(ROPE_STYLES)}")


def rope(
    x: np.ndarray,
    positions: np.ndarray,
    base: float = 10000.0,
    style: str = "half",
    dims: int | None = None,
    freqs: Frequencies = None,
    factor: float = 1.0,
) -> np.ndarray:
    """x (…, tokens, d) with each pair of its first ``dims`` features (all by default)
    rotated by the angle of the token's position; the other features unchanged.

    A pair (a, b) at angle θ becomes f·(a cos θ − b sin θ, a sin θ + b cos θ), f the
    ``factor`` (1; YaRN's and LongRoPE's attention factor multiplies cos and sin), θ the
    position times the pair's frequency (``freqs``, or the base's).
    """
    x = np.asarray(x, dtype=np.float64)
    dims = x.shape[-1] if dims is None else dims
    if dims > x.shape[-1]:
        raise ValueError(f"rope dims: {dims} is more than the {x.shape[-1]} features")
    if len(positions) != x.shape[-2]:
        raise ValueError(f"rope: {len(positions)} positions for {x.shape[-2]} tokens")
    cos, sin = _cos_sin(positions, dims, base, freqs)
    if factor != 1.0:
        cos, sin = cos * factor, sin * factor
    first, second = _pairs(dims, style)
    a, b = x[..., first], x[..., second]
    out = np.empty_like(x)
    out[..., dims:] = x[..., dims:]
    np.multiply(a, cos, out=out[..., first])
    out[..., first] -= b * sin
    np.multiply(a, sin, out=out[..., second])
    out[..., second] += b * cos
    return out


def alibi_slopes(heads: int) -> np.ndarray:
    """One slope per head, from the ALiBi paper: for a power of two h, the geometric
    sequence 2^(−8/h), 2^(−16/h), …; otherwise (BLOOM's rule) those of the nearest lower
    power of two p, then every other slope of 2p for the remaining h − p heads."""
    if heads < 1:
        raise ValueError(f"alibi: {heads} heads")

    def geometric(count: int) -> np.ndarray:
        start = 2.0 ** (-8.0 / count)
        slopes: np.ndarray = start ** np.arange(1, count + 1, dtype=np.float64)
        return slopes

    p = 1 << (heads.bit_length() - 1)  # the largest power of two ≤ heads
    if p == heads:
        return geometric(heads)
    return np.concatenate([geometric(p), geometric(2 * p)[0::2][: heads - p]])


def alibi_bias(slope: float, query_positions: np.ndarray, key_positions: np.ndarray) -> np.ndarray:
    """(queries, keys): −slope · |i − j| for query position i and key position j."""
    q = np.asarray(query_positions, dtype=np.float64)[:, None]
    k = np.asarray(key_positions, dtype=np.float64)[None, :]
    return -slope * np.abs(q - k)


RELATIVE_BUCKETS_MOST = 1024  # T5 uses 32; a table of more buckets is refused
RELATIVE_DISTANCE_MOST = 1 << 20  # beyond it every distance is the last bucket anyway


def relative_exact(buckets: int, bidirectional: bool) -> int:
    """How many distances of each direction get a bucket of their own (T5's max_exact:
    half the buckets of a direction)."""
    return (buckets // 2 if bidirectional else buckets) // 2


def relative_bucket(
    relative: np.ndarray, bidirectional: bool = True, buckets: int = 32, max_distance: int = 128
) -> np.ndarray:
    """T5's bucket of each relative position j − i (key position minus query position).

    Bidirectional (an encoder): half the buckets for keys after the query (j > i), half
    for the others, by |j − i|; otherwise (a decoder) only keys at or before the query
    count, by max(i − j, 0). Of a direction's B buckets, distances below E = B/2 get one
    each; a distance r ≥ E gets E + ⌊log(r/E) / log(max_distance/E) · (B − E)⌋, at most
    B − 1. The logarithm is computed in float32, as T5 computes it (``.float()`` in
    ``_relative_position_bucket``), so that the boundaries are T5's exactly.
    """
    rel = np.asarray(relative, dtype=np.int64)
    out = np.zeros_like(rel)
    if bidirectional:
        buckets //= 2
        out += (rel > 0) * buckets
        rel = np.abs(rel)
    else:
        rel = -np.minimum(rel, 0)
    exact = buckets // 2
    if exact < 1 or max_distance <= exact:
        raise ValueError(f"relative buckets: {buckets} buckets and distance {max_distance}")
    small = rel < exact
    with np.errstate(divide="ignore"):  # log 0 where the distance is small (not used)
        ratio = np.log(rel.astype(np.float32) / np.float32(exact))
    ratio = ratio / np.float32(math.log(max_distance / exact)) * np.float32(buckets - exact)
    large = exact + np.where(small, np.float32(0), ratio).astype(np.int64)
    bucket: np.ndarray = out + np.where(small, rel, np.minimum(large, buckets - 1))
    return bucket


def query_offset(n: int, m: int, alignment: str) -> int:
    """Where query 0 sits among the m keys: 0 (top-left), or m − n (bottom-right: the
    last query is the last key, as in a decode step over a cache)."""
    if alignment == "top-left":
        return 0
    if alignment == "bottom-right":
        return m - n
    raise ValueError(f"causal alignment {alignment!r}: expected one of {', '.join(ALIGNMENTS)}")


def visible(
    n: int,
    m: int,
    mask: str,
    window: int | None = None,
    alignment: str = "top-left",
    custom: np.ndarray | None = None,
) -> np.ndarray:
    """(n, m) bool, True where query i may attend key j.

    "none": every key. "causal" (and its variants that differ only in what they do
    with the others): j ≤ i + offset. "sliding-window": i + offset − window < j ≤
    i + offset. "custom": the given 0/1 matrix. offset is ``query_offset``.
    """
    if mask == "custom":
        if custom is None or np.shape(custom) != (n, m):
            raise ValueError(f"custom mask: expected an {n}×{m} matrix of 0 and 1")
        seen: np.ndarray = np.asarray(custom) != 0
        return seen
    if mask == "none":
        return np.ones((n, m), dtype=bool)
    i = np.arange(n)[:, None] + query_offset(n, m, alignment)
    j = np.arange(m)[None, :]
    if mask in ("causal", "causal-zero", "drop-after-softmax"):
        return j <= i
    if mask == "sliding-window":
        if window is None or window < 1:
            raise ValueError(f"sliding window: {window} is not a positive number of keys")
        return (j <= i) & (j > i - window)
    raise ValueError(f"mask {mask!r} is not known")


def rms_norm(x: np.ndarray, weight: np.ndarray | None = None, eps: float = 1e-6) -> np.ndarray:
    """x / √(mean of x² over the last axis + eps), times weight (per feature) if given."""
    x = np.asarray(x, dtype=np.float64)
    out = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    weighted: np.ndarray = out if weight is None else out * weight
    return weighted


def whole_rms(A: np.ndarray, eps: float) -> np.ndarray:
    """Per token, √(mean of A² over every head's features together + eps) of a stack
    (heads, rows, d): the divisor of the whole-projection QK-norm ("rms-whole", OLMo 2),
    shape (1, rows, 1)."""
    A = np.asarray(A, dtype=np.float64)
    r: np.ndarray = np.sqrt(np.mean(A * A, axis=(0, 2), keepdims=True) + eps)
    return r


def softcap(scores: np.ndarray, cap: float) -> np.ndarray:
    """cap · tanh(scores / cap): scores squashed smoothly into (−cap, cap)."""
    if not cap > 0:
        raise ValueError(f"soft-cap: {cap} is not a positive number")
    return cap * tanh(np.asarray(scores, dtype=np.float64) / cap)


TANH_STEP = 256  # the table's points per unit
TANH_END = 20  # beyond ±20, tanh is ±1 in float64
TANH_CHUNK = 1 << 14  # elements at a time: the scratch stays in cache, off the page-faulting heap


def tanh(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """tanh of each element of x (into out, which may be x), within 2 units in the last
    place (1.7 seen; NumPy's is within 1.2; tanh(−0) is +0 here). Twice as quick where
    NumPy calls the C library once per float64 (without AVX-512: 20 ns each, 5 ms for a
    512 × 512 head of soft-capped scores): x = a + b with a on a grid of 1/256 and
    |b| ≤ 1/512, tanh(a) from a table, tanh(b) = b − b³/3 + 2b⁵/15 (the next term is
    below 1e-19 of b), and tanh(x) = tanh a + tanh b · (1 − tanh²a) / (1 + tanh a · tanh b)."""
    table = _tanh_table()
    x = np.asarray(x, dtype=np.float64)
    if out is None:
        out = x.copy()
    elif out is not x:
        np.copyto(out, x)
    work = out if out.flags.c_contiguous else np.ascontiguousarray(out)
    flat = work.reshape(-1)
    size = min(TANH_CHUNK, flat.size)
    scratch = np.empty((3, size))
    index = np.empty(size, dtype=np.intp)
    with np.errstate(invalid="ignore"):  # NaN (which stays NaN) has no table index
        for start in range(0, flat.size, TANH_CHUNK):
            b = flat[start : start + TANH_CHUNK]
            t, u, ta = scratch[:, : len(b)]
            i = index[: len(b)]
            np.clip(b, -TANH_END, TANH_END, out=b)
            np.multiply(b, TANH_STEP, out=t)
            np.rint(t, out=t)
            np.copyto(i, t, casting="unsafe")
            t /= TANH_STEP
            b -= t  # x − a
            i += TANH_END * TANH_STEP
            table.take(i, out=ta, mode="clip")
            np.multiply(b, b, out=t)
            np.multiply(t, 2.0 / 15.0, out=u)
            u -= 1.0 / 3.0
            u *= t
            u *= b
            b += u  # tanh b
            np.multiply(ta, b, out=t)
            t += 1.0
            np.multiply(ta, ta, out=u)
            np.subtract(1.0, u, out=u)
            b *= u
            b /= t
            b += ta
    if work is not out:
        np.copyto(out, work)
    return out


@functools.cache
def _tanh_table() -> np.ndarray:
    """tanh at every step of 1/TANH_STEP from −TANH_END to TANH_END (made on first use)."""
    grid = np.arange(-TANH_END * TANH_STEP, TANH_END * TANH_STEP + 1, dtype=np.longdouble)
    table: np.ndarray = np.tanh(grid / TANH_STEP).astype(np.float64)
    return table


def softmax_with_sink(
    scores: np.ndarray, sink: float | np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Softmax along keys with exp(sink) added to each row's denominator only (sink: one
    logit, or one per row broadcast against the rows).

    Returns (weights, sink share): each row's weights sum to 1 − its sink share. Scores
    may hold −∞ (masked keys); a row with every key masked gives all its weight to the
    sink. Shifted by the larger of the row maximum and the sink, so nothing overflows.
    """
    s = np.asarray(scores, dtype=np.float64)
    m = np.maximum(s.max(axis=-1), sink)
    e = np.exp(s - m[..., None])
    sink_e = np.exp(sink - m)
    z = e.sum(axis=-1) + sink_e
    return e / z[..., None], sink_e / z


def kv_head_of(head: int, heads: int, kv_heads: int) -> int:
    """The key/value head query head ``head`` (from 0) reads: ⌊head · G / H⌋ for H query
    heads over G key/value heads (G divides H; G = 1 is multi-query attention)."""
    if kv_heads < 1 or heads % kv_heads:
        raise ValueError(f"{kv_heads} key/value heads do not divide {heads} query heads")
    return head * kv_heads // heads
