"""The same maths on torch (CPU or CUDA, float32 or float64), and cross-checks.

torch is imported inside the functions, so importing this module stays cheap.
``cross_check`` compares the torch engine and ``F.scaled_dot_product_attention``
with the NumPy float64 reference, every quantity against its own rounding tolerance.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from attnviz.core.maths.forward import compute, context
from attnviz.core.maths.head_stack import HeadStack
from attnviz.core.maths.positions import (
    dropout_keep,
    hidden_keys,
    positions,
    relative_terms,
    rope_width,
    scale_of,
    sinusoidal,
)
from attnviz.core.maths.results import Head, Result, RowStats, Stages
from attnviz.core.maths.scenario import MINUS_INF_MASKS, Scenario, Settings
from attnviz.core.maths.scoring import softmax_rows
from attnviz.core.maths.variants import alibi_slopes, pair_frequencies

DTYPES = ("float32", "float64")


def resolve_device(device: str = "auto") -> str:
    """'auto' means CUDA when torch sees a GPU, else the CPU."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device: {device!r}; expected auto, cpu or cuda")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device: cuda was asked for, but torch sees no CUDA GPU")
    return device


def _torch_dtype(dtype: str) -> Any:
    import torch

    if dtype not in DTYPES:
        raise ValueError(f"dtype: {dtype!r}; expected one of {', '.join(DTYPES)}")
    return getattr(torch, dtype)


def _frozen_numpy(t: Any) -> np.ndarray:
    a: np.ndarray = t.detach().to("cpu").double().numpy().copy()
    a.flags.writeable = False
    return a


def _turn(st: Settings, A: Any, norm: Any, pos: np.ndarray, t: Callable[[Any], Any]) -> Any:
    """Q or K (a tensor) as the scores see them: QK-norm, then RoPE (forward.turn)."""
    import torch

    if st.qk_norm != "none":  # per head, or per token over every head ("rms-whole")
        over = (0, 2) if st.qk_norm == "rms-whole" else (-1,)
        A = A * torch.rsqrt((A * A).mean(dim=over, keepdim=True) + st.qk_norm_eps)
        A = A if norm is None else A * norm
    dims = min(rope_width(st, A.shape[-1]), A.shape[-1] - A.shape[-1] % 2)
    if st.positional == "rope" and dims:
        angle = pos[:, None] * pair_frequencies(dims, st.rope_base, st.rope_frequencies)
        cos, sin = t(np.cos(angle) * st.rope_factor), t(np.sin(angle) * st.rope_factor)
        idx = np.arange(dims)
        half = st.rope_style == "half"
        first, second = (idx[: dims // 2], idx[dims // 2 :]) if half else (idx[0::2], idx[1::2])
        a, b = A[..., first], A[..., second]
        A = A.clone()
        A[..., first] = a * cos - b * sin
        A[..., second] = a * sin + b * cos
    return A


def _softmax(masked: Any, sink: Any, dt: Any) -> tuple[Any, Any, Any, Any, Any, Any]:
    """(p, m, Z, empty, sink share, entropy) of masked scores (a tensor), as
    forward.softmax_in_place and row_entropy make them."""
    import torch

    m = masked.amax(dim=-1, keepdim=True)
    if sink is not None:
        m = torch.maximum(m, sink)
    empty = torch.isneginf(m[..., 0])
    m = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
    e = torch.exp(masked - m)
    Z = e.sum(dim=-1, keepdim=True)
    share = torch.zeros_like(Z[..., 0])
    if sink is not None:
        Z = Z + torch.exp(sink - m)
        share = (torch.exp(sink - m) / Z)[..., 0]
    p = e / torch.where(Z == 0, torch.ones_like(Z), Z)
    # log Z + Σ p·(m − s): no cancellation at any score size (see forward.row_entropy).
    gap = (m - masked).clamp(max=torch.finfo(dt).max)
    entropy = torch.where(empty, 0.0, torch.log(Z[..., 0]) + (p * gap).sum(dim=-1))
    if sink is not None:
        entropy = entropy + share * (m - sink)[..., 0]
    return p, m, Z, empty, share, entropy


def compute_torch(s: Scenario, device: str = "cpu", dtype: str = "float64") -> Result:
    """Every intermediate, computed with torch; returned as float64 NumPy arrays."""
    import torch

    dev, dt = resolve_device(device), _torch_dtype(dtype)
    st = s.settings

    def t(a: np.ndarray | HeadStack) -> Any:
        return torch.tensor(np.asarray(a), dtype=dt, device=dev)

    X = t(s.X)
    if st.positional == "sinusoidal":
        X = X + t(sinusoidal(s.n, s.d_model))
    X_kv = X if s.X_kv is None else t(s.X_kv)
    qpos, kpos = positions(s)
    if st.projections:
        Q = X @ t(s.W_Q) + t(s.b_Q)
        K = X_kv @ t(s.W_K) + t(s.b_K)
        V = X_kv @ t(s.W_V) + t(s.b_V)
        q_norm, k_norm = t(s.q_norm), t(s.k_norm)
    else:
        Q, K, V, q_norm, k_norm = X[None], X_kv[None], X_kv[None], None, None

    Q_rot, K_rot = _turn(st, Q, q_norm, qpos, t), _turn(st, K, k_norm, kpos, t)
    H = Q.shape[0]
    group = [h * K.shape[0] // H for h in range(H)]
    K, V, K_rot = K[group], V[group], K_rot[group]  # one per query head
    d_k = Q.shape[2]
    scores = Q_rot @ K_rot.transpose(1, 2)
    scale = scale_of(st, d_k)
    scaled = scores / math.sqrt(d_k) if scale is None else scores * scale
    if st.softcap is not None:
        scaled = st.softcap * torch.tanh(scaled / st.softcap)
    if st.positional == "alibi":
        slopes = np.asarray(st.alibi_slopes or alibi_slopes(s.n_heads))[:H]
        scaled = scaled - t(slopes[:, None, None] * np.abs(qpos[:, None] - kpos[None, :]))
    if st.positional == "relative-bias":  # T5's table, looked up by each score's bucket
        scaled = scaled + t(relative_terms(s, list(range(H))))
    future = torch.as_tensor(hidden_keys(s), device=dev)
    if st.mask in MINUS_INF_MASKS:
        masked = scaled.masked_fill(future, -math.inf)
    elif st.mask == "causal-zero":
        masked = scaled.masked_fill(future, 0.0)
    else:
        masked = scaled

    sink = None if st.sinks is None else t(np.asarray(st.sinks)[:H, None, None])
    p, m, Z, empty, share, entropy = _softmax(masked, sink, dt)

    weights = p.masked_fill(future, 0.0) if st.mask == "drop-after-softmax" else p
    keep = dropout_keep(st, tuple(weights.shape))
    if keep is not None:
        weights = weights * t(keep) / (1.0 - st.dropout)
    output = weights @ V
    h, n = output.shape[:2]
    concat = output.transpose(0, 1).reshape(n, h * d_k)
    if st.projections:
        mixed = concat.clone()
        for head in st.ablated:  # switched off: no part in the W_O mix
            mixed[:, head * d_k : (head + 1) * d_k] = 0.0
        final = mixed @ t(s.W_O) + t(s.b_O)
    else:
        final = concat

    f = _frozen_numpy
    leak, row_sum = f((weights * future).sum(dim=-1)), f(weights.sum(dim=-1))
    parts = {
        name: f(a)
        for name, a in zip(
            ("Q", "K", "V", "Q_rot", "K_rot", "weights", "output", "m", "Z", "sink"),
            (Q, K, V, Q_rot, K_rot, weights, output, m[..., 0], Z[..., 0], share),
            strict=True,
        )
    }
    empty_rows, entropies = empty.cpu().numpy().copy(), f(entropy)
    empty_rows.flags.writeable = False
    stages = [f(a) for a in (scores, scaled, masked)]
    heads = tuple(
        Head(
            **{name: a[k] for name, a in parts.items()},
            empty_rows=empty_rows[k],
            keep=None if keep is None else keep[k],
            index=k,
            rule=None,
            stages=Stages(*(a[k] for a in stages)),
            rows=RowStats(leak[k], row_sum[k], entropies[k]),
        )
        for k in range(h)
    )
    future_np = hidden_keys(s)
    future_np.flags.writeable = False
    return Result(**context(s, f(X), future_np), heads=heads, concat=f(concat), final=f(final))


COMPARED = (
    *("X", "Q", "K", "V", "Q_rot", "K_rot", "scores", "scaled", "masked", "weights"),
    *("output", "concat", "final", "leak", "row_sum", "sink", "entropy"),
)
UNIT_ROUNDOFF = {"float32": 2.0**-24, "float64": 2.0**-53}
SAFETY = 8  # times the worst-case rounding bound: past that, an engine really differs
UNDERFLOW_GAP = 350.0  # e^-745 (float64's smallest weight) · e^(2·350) is still below 2^-60


def _turned_bounds(
    st: Settings, pre: np.ndarray, err: np.ndarray, norm: np.ndarray | None, u: float
) -> tuple[np.ndarray, np.ndarray]:
    """Sizes and rounding errors of Q (or K) as the scores see them, from the reference
    values before QK-norm and RoPE (pre) and their error bound (err)."""
    size = np.abs(pre)
    d = pre.shape[-1]
    if st.qk_norm != "none":
        # per head over d, or ("rms-whole") per token over every head's features; K's
        # heads repeated evenly for GQA leave the mean square as it is
        over = (0, 2) if st.qk_norm == "rms-whole" else (-1,)
        width = d * (pre.shape[0] if st.qk_norm == "rms-whole" else 1)
        r = np.sqrt(np.mean(pre * pre, axis=over, keepdims=True) + st.qk_norm_eps)
        w = 1.0 if norm is None else np.abs(norm)
        size = w * size / r
        # first order: δ/r plus Q's own share of the change of r, and the norm's rounding
        worst = err.max(axis=over, keepdims=True)
        err = w * 2 * math.sqrt(width) * worst / r + u * (width + 8) * size
    dims = min(rope_width(st, d), d - d % 2)
    if st.positional == "rope" and dims:
        idx = np.arange(d)
        partner = idx.copy()
        if st.rope_style == "half":
            partner[: dims // 2], partner[dims // 2 : dims] = (
                idx[dims // 2 : dims],
                idx[: dims // 2],
            )
        else:
            partner[0:dims:2], partner[1:dims:2] = idx[1:dims:2], idx[0:dims:2]
        turned = idx < dims
        size = np.where(turned, size + size[..., partner], size)
        err = np.where(turned, err + err[..., partner] + 4 * u * size, err)
    return size, err


def tolerances(s: Scenario, ref: Result, dtype: str = "float64") -> dict[str, np.ndarray]:
    """Per compared quantity, the largest difference that rounding in dtype can explain.

    Each bound is scaled to its own quantity. Sums of products (Q, scores, output,
    final) use the standard bound for k rounded terms, k·u·Σ|a||b|, so cancellation
    hides nothing; QK-norm, RoPE, the soft-cap and ALiBi carry those errors forward to
    first order and add their own rounding. Rounding moves a row's scores by at most D,
    so each weight by a factor e^(±2D): weights, leak and row sum get that share of their
    own size, and entropy what D can change it by (first order D·E|log p + H|: almost 0
    on a flat row). Where D is so large that any weight is possible, so is the tolerance.
    ``ref`` is compute(s); the arrays broadcast against its stacked fields.
    """
    st = s.settings
    u = SAFETY * UNIT_ROUNDOFF[dtype]
    Xa = np.abs(s.X) + (1.0 if st.positional == "sinusoidal" else 0.0)
    Xka = Xa if s.X_kv is None else np.abs(s.X_kv)
    H = ref.n_heads
    q_norm: np.ndarray | None = None
    k_norm: np.ndarray | None = None
    if st.projections:
        group = [s.kv_head_of(h) for h in range(H)]
        Qa = Xa @ np.abs(s.W_Q) + np.abs(s.b_Q)
        Ka, Va = (
            Xka @ np.abs(W[group]) + np.abs(b[group]) for W, b in ((s.W_K, s.b_K), (s.W_V, s.b_V))
        )
        q_norm, k_norm = s.q_norm.array(), s.k_norm[group]
    else:
        Qa, Ka, Va = Xa[None], Xka[None], Xka[None]
    d_k = Qa.shape[2]
    m = Ka.shape[1]
    k_qkv = s.d_model + 3
    EQ, EK, EV = (u * k_qkv * a for a in (Qa, Ka, Va))
    q_size, q_err = _turned_bounds(st, np.asarray(ref.Q), EQ, q_norm, u)
    k_size, k_err = _turned_bounds(st, np.asarray(ref.K), EK, k_norm, u)

    def Kt(a: np.ndarray) -> np.ndarray:
        return a.transpose(0, 2, 1)

    E_scores = u * (d_k + 2) * (q_size @ Kt(k_size)) + q_err @ Kt(k_size) + q_size @ Kt(k_err)
    factor = ref.scale_factor
    E_scaled = E_scores / factor + u * np.abs(np.asarray(ref.scores)) / factor
    # the soft-cap (slope ≤ 1) and ALiBi carry the error on and round once more each
    roundings = 4 * (st.softcap is not None) + 2 * (st.positional in ("alibi", "relative-bias"))
    E_scaled = E_scaled + roundings * u * np.abs(np.asarray(ref.scaled))
    seen = ~np.asarray(ref.future) if st.mask in MINUS_INF_MASKS else True
    D = np.where(seen, E_scaled, 0.0).max(axis=-1)  # how far rounding can move a row
    lost = D > UNDERFLOW_GAP  # a weight that underflowed to 0 could be anything
    D = np.minimum(D, UNDERFLOW_GAP)
    grow = np.expm1(2 * D)  # a weight moves by at most this share of itself
    gain = 1.0 / (1.0 - st.dropout)  # dropout rescales the weights it keeps
    own = gain * u * (m + 8)  # a weight's own rounding
    v_max = gain * Va.max(axis=1)[:, None, :]  # (h, 1, d_k): the largest |output|
    apart = 2 * (1 + u * k_qkv) * v_max  # two outputs can be no further apart than this
    with np.errstate(over="ignore"):
        moved = (grow[..., None] * (1 + u * k_qkv) + u * (m + k_qkv + 2)) * (ref.weights @ Va)
    moved += m * 2.0**-60 * v_max  # what underflowed weights, e^-745 · e^(2D) at most, add
    output = np.where(lost[..., None], apart, np.minimum(moved, apart))
    concat, largest = (a.transpose(1, 0, 2).reshape(-1, H * d_k) for a in (output, v_max))
    final = concat
    if st.projections:
        final = (concat + u * (H * d_k + 2) * largest) @ np.abs(s.W_O) + 2 * u * np.abs(s.b_O)
    L = math.log(m + (st.sinks is not None))
    with np.errstate(over="ignore"):
        entropy = np.expm1(D) * (np.exp(2 * D) * _spread(ref) + 2 * D)
    return {
        "X": u * 2 * Xa,
        "Q": EQ,
        "K": EK,
        "V": EV,
        "Q_rot": q_err,
        "K_rot": k_err,
        "scores": E_scores,
        "scaled": E_scaled,
        "masked": E_scaled,
        "weights": np.where(lost[..., None], 2 * gain, grow[..., None] * ref.weights + own),
        "output": output,
        "concat": concat,
        "final": final,
        "leak": np.where(lost, 2 * gain, grow * ref.leak + own),
        "row_sum": np.where(lost, 2 * gain, grow * ref.row_sum + own),
        "sink": np.where(lost, 2.0, grow * ref.sink + own),
        "entropy": 2 * max(1.0, L) * u * (m + 8) + np.minimum(entropy, L),
    }


def _spread(ref: Result) -> np.ndarray:
    """Per row, E|log p + H|: how fast the entropy moves as the scores move (0 when flat)."""
    p, *_ = softmax_rows(np.asarray(ref.masked))
    dev = np.zeros_like(p)
    np.log(p, out=dev, where=p > 0)
    dev += ref.entropy[..., None]
    np.abs(dev, out=dev)
    return np.einsum("...j,...j->...", p, dev)  # type: ignore[no-any-return]


@dataclass(frozen=True)
class Difference:
    """One quantity of an engine against the reference."""

    name: str
    diff: float  # the largest |engine − reference|
    excess: float  # the largest |engine − reference| / tolerance: above 1, they disagree


def difference(name: str, ref: np.ndarray, got: np.ndarray, tolerance: np.ndarray) -> Difference:
    """Compare one quantity cell by cell (−∞ must match −∞; NaN never matches)."""
    if ref.shape != got.shape or not np.array_equal(np.isneginf(ref), np.isneginf(got)):
        return Difference(name, math.inf, math.inf)
    with np.errstate(invalid="ignore"):
        gap = np.abs(np.where(np.isneginf(ref), 0.0, got - ref))
    gap = np.where(np.isnan(gap), math.inf, gap)
    if not gap.size:
        return Difference(name, 0.0, 0.0)
    with np.errstate(over="ignore"):
        excess = gap / np.maximum(tolerance, np.finfo(np.float64).tiny)
    return Difference(name, float(gap.max()), float(excess.max()))


def differences(ref: Result, got: Result, tol: dict[str, np.ndarray]) -> tuple[Difference, ...]:
    """Every compared quantity of got against ref."""
    return tuple(difference(n, getattr(ref, n), getattr(got, n), tol[n]) for n in COMPARED)


def _score_bias(s: Scenario, ref: Result) -> np.ndarray:
    """(H, n, m + 1 with sinks): what the scenario adds to the scaled (and capped) scores
    before softmax, as one float mask: ALiBi or T5's relative bias, −∞ on hidden keys,
    and a last column for the sinks (a key of zeros whose score is the sink logit)."""
    st = s.settings
    H = ref.n_heads
    qpos, kpos = positions(s)
    bias = np.zeros((H, s.n, s.m))
    if st.positional == "alibi":
        slopes = np.asarray(st.alibi_slopes or alibi_slopes(s.n_heads))[:H]
        bias -= slopes[:, None, None] * np.abs(qpos[:, None] - kpos[None, :])
    if st.positional == "relative-bias":
        bias += relative_terms(s, list(range(H)))
    if st.mask in MINUS_INF_MASKS:
        bias[:, np.asarray(ref.future)] = -math.inf
    if st.sinks is not None:
        sinks = np.broadcast_to(np.asarray(st.sinks)[:H, None, None], (H, s.n, 1))
        bias = np.concatenate([bias, sinks], axis=2)
    return bias


def library_output(
    s: Scenario, device: str = "cpu", dtype: str = "float64"
) -> tuple[np.ndarray | None, str]:
    """Head outputs (H, n, d_k) from PyTorch's own attention on the reference's Q and K
    (after QK-norm and RoPE) and V, and which function gave them: SDPA with
    ``enable_gqa``, ``scale=`` and a float mask (ALiBi, windows, custom masks, sinks as an
    extra key of zeros), or flex_attention with a ``score_mod`` for a soft-cap.

    (None, why) when neither can express the settings (zero mask, drop after softmax,
    dropout), or flex_attention does not run on the device.
    """
    import torch
    import torch.nn.functional as F

    st = s.settings
    if not (st.mask == "none" or st.mask in MINUS_INF_MASKS) or st.dropout > 0:
        why = "dropout is on" if st.dropout > 0 else f"mask {st.mask!r}"
        return None, f"SDPA cannot express {why}"
    ref = compute(s)
    dev, dt = resolve_device(device), _torch_dtype(dtype)
    H = ref.n_heads
    kv = s.kv_heads if st.projections else 1
    first = [h * H // kv for h in range(kv)]  # a query head of each key/value head
    q, k, v = (np.asarray(a) for a in (ref.Q_rot, ref.K_rot[first], ref.V[first]))
    if st.sinks is not None:  # one more key, of zeros: its logit is the bias, the sink
        k, v = (np.concatenate([a, np.zeros((kv, 1, a.shape[2]))], axis=1) for a in (k, v))
    bias = _score_bias(s, ref)
    q_t, k_t, v_t, bias_t = (torch.tensor(a, dtype=dt, device=dev)[None] for a in (q, k, v, bias))
    scale = 1.0 / ref.scale_factor
    if st.softcap is None:
        out = F.scaled_dot_product_attention(
            q_t, k_t, v_t, attn_mask=bias_t, scale=scale, enable_gqa=kv != H
        )
        name = "SDPA"
    else:
        cap = st.softcap

        def score_mod(score: Any, b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
            capped = torch.where(kv_idx < s.m, cap * torch.tanh(score / cap), 0.0)
            return capped + bias_t[0, h, q_idx, kv_idx]

        try:
            import warnings

            from torch.nn.attention.flex_attention import flex_attention

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # eager flex_attention warns it is slow
                out = flex_attention(
                    q_t, k_t, v_t, score_mod=score_mod, scale=scale, enable_gqa=kv != H
                )
        except Exception as e:  # flex_attention does not run everywhere
            return None, f"flex_attention did not run on {dev}: {type(e).__name__}"
        name = "flex_attention"
    got = out[0].detach().cpu().double().numpy()
    got[np.asarray(ref.empty_rows)] = 0.0  # a row with no visible key: 0, as defined
    return got, name


@dataclass(frozen=True)
class CrossCheck:
    """The torch engine and PyTorch's own attention (SDPA or flex_attention) against the
    NumPy float64 reference, quantity by quantity."""

    device: str
    dtype: str
    torch_diff: float  # the largest absolute difference over every quantity
    sdpa_diff: float | None  # PyTorch's attention function against the reference
    sdpa_note: str  # why that was not compared, when it was not
    quantities: tuple[Difference, ...] = ()  # torch's quantities, then the function's output
    reference: str = "SDPA"  # which function gave sdpa_diff: SDPA or flex_attention

    @property
    def worst(self) -> float:
        return max(self.torch_diff, self.sdpa_diff or 0.0)

    @property
    def culprit(self) -> Difference | None:
        """The quantity furthest past its tolerance, or None when all are within."""
        worst = max(self.quantities, key=lambda q: q.excess, default=None)
        return worst if worst is not None and not worst.excess <= 1.0 else None

    @property
    def ok(self) -> bool:
        """True when every quantity agrees within what rounding can explain."""
        return self.culprit is None


def cross_check(s: Scenario, device: str = "cpu", dtype: str = "float64") -> CrossCheck:
    """Compare the torch engine and PyTorch's attention with the NumPy reference."""
    dev = resolve_device(device)
    ref = compute(s)
    tol = tolerances(s, ref, dtype)
    found = differences(ref, compute_torch(s, dev, dtype), tol)
    torch_diff = max(q.diff for q in found)
    out, name = library_output(s, dev, dtype)
    if out is None:
        return CrossCheck(dev, dtype, torch_diff, None, name, found, reference="")
    by_lib = difference(f"{name} output", ref.output, out, tol["output"])
    return CrossCheck(dev, dtype, torch_diff, by_lib.diff, "", (*found, by_lib), reference=name)
