"""The same maths on torch (CPU or CUDA, float32 or float64), and cross-checks.

torch is imported inside the functions, so importing this module stays cheap.
``cross_check`` compares the torch engine and ``F.scaled_dot_product_attention``
with the NumPy float64 reference, every quantity against its own rounding tolerance.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from attnviz.core.maths.engine import (
    Result,
    compute,
    dropout_keep,
    hidden_keys,
    sinusoidal,
    softmax_rows,
    split_heads,
)
from attnviz.core.maths.scenario import MINUS_INF_MASKS, Scenario

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
    a = t.detach().to("cpu").double().numpy().copy()
    a.flags.writeable = False
    return a


def compute_torch(s: Scenario, device: str = "cpu", dtype: str = "float64") -> Result:
    """Every intermediate, computed with torch; returned as float64 NumPy arrays."""
    import torch

    dev, dt = resolve_device(device), _torch_dtype(dtype)
    st = s.settings

    def t(a: np.ndarray) -> Any:
        return torch.tensor(np.asarray(a), dtype=dt, device=dev)

    X = t(s.X)
    if st.positional == "sinusoidal":
        X = X + t(sinusoidal(s.n, s.d_model))
    if st.projections:
        Q, K, V = X @ t(s.W_Q), X @ t(s.W_K), X @ t(s.W_V)
    else:
        Q = K = V = X[None]
    d_k = Q.shape[2]
    scores = Q @ K.transpose(1, 2)
    scaled = scores / math.sqrt(d_k) if st.scale else scores
    future = torch.as_tensor(hidden_keys(s.n, st), device=dev)
    if st.mask in MINUS_INF_MASKS:
        masked = scaled.masked_fill(future, -math.inf)
    elif st.mask == "causal-zero":
        masked = scaled.masked_fill(future, 0.0)
    else:
        masked = scaled

    m = masked.amax(dim=-1, keepdim=True)
    empty = torch.isneginf(m[..., 0])
    m = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
    e = torch.exp(masked - m)
    Z = e.sum(dim=-1, keepdim=True)
    p = e / torch.where(Z == 0, torch.ones_like(Z), Z)
    # log Z + Σ p·(m − s): no cancellation at any score size (see engine.row_entropy).
    gap = (m - masked).clamp(max=torch.finfo(dt).max)
    entropy = torch.where(empty, 0.0, torch.log(Z[..., 0]) + (p * gap).sum(dim=-1))

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
        final = mixed @ t(s.W_O)
    else:
        final = concat

    f = _frozen_numpy
    stacks = {
        "Q": f(Q),
        "K": f(K),
        "V": f(V),
        "scores": f(scores),
        "scaled": f(scaled),
        "masked": f(masked),
        "weights": f(weights),
        "output": f(output),
        "leak": f((weights * future).sum(dim=-1)),
        "row_sum": f(weights.sum(dim=-1)),
        "entropy": f(entropy),
        "empty_rows": empty.cpu().numpy().copy(),
    }
    future_np = hidden_keys(s.n, st)
    future_np.flags.writeable = False
    return Result(
        tokens=s.tokens,
        settings=st,
        X=f(X),
        heads=tuple(split_heads(stacks, keep)),
        concat=f(concat),
        final=f(final),
        future=future_np,
    )


COMPARED = (
    *("X", "Q", "K", "V", "scores", "scaled", "masked", "weights", "output"),
    *("concat", "final", "leak", "row_sum", "entropy"),
)
UNIT_ROUNDOFF = {"float32": 2.0**-24, "float64": 2.0**-53}
SAFETY = 8  # times the worst-case rounding bound: past that, an engine really differs
UNDERFLOW_GAP = 350.0  # e^-745 (float64's smallest weight) · e^(2·350) is still below 2^-60


def tolerances(s: Scenario, ref: Result, dtype: str = "float64") -> dict[str, np.ndarray]:
    """Per compared quantity, the largest difference that rounding in dtype can explain.

    Each bound is scaled to its own quantity. Sums of products (Q, scores, output,
    final) use the standard bound for k rounded terms, k·u·Σ|a||b|, so cancellation
    hides nothing. Rounding moves a row's scores by at most D, so each weight by a
    factor e^(±2D): weights, leak and row sum get that share of their own size, and
    entropy what D can change it by (first order D·E|log p + H|: almost 0 on a flat row).
    Where D is so large that any weight is possible, so is the tolerance.
    ``ref`` is compute(s); the arrays broadcast against its stacked fields.
    """
    st = s.settings
    u = SAFETY * UNIT_ROUNDOFF[dtype]
    Xa = np.abs(s.X) + (1.0 if st.positional == "sinusoidal" else 0.0)
    if st.projections:
        Qa, Ka, Va = (Xa @ np.abs(W) for W in (s.W_Q, s.W_K, s.W_V))
    else:
        Qa = Ka = Va = Xa[None]
    h, n, d_k = Qa.shape
    factor = math.sqrt(d_k) if st.scale else 1.0
    row_scores = np.einsum("hik,hk->hi", Qa, Ka.max(axis=1)) / factor  # ≥ |scaled row|
    k_qkv = s.d_model + 2
    k_scores = 2 * k_qkv + d_k + 2
    D = u * k_scores * row_scores  # how far rounding can move a row's scores
    lost = D > UNDERFLOW_GAP  # a weight that underflowed to 0 could be anything
    D = np.minimum(D, UNDERFLOW_GAP)
    grow = np.expm1(2 * D)  # a weight moves by at most this share of itself
    gain = 1.0 / (1.0 - st.dropout)  # dropout rescales the weights it keeps
    own = gain * u * (n + 8)  # a weight's own rounding
    v_max = gain * Va.max(axis=1)[:, None, :]  # (h, 1, d_k): the largest |output|
    apart = 2 * (1 + u * k_qkv) * v_max  # two outputs can be no further apart than this
    with np.errstate(over="ignore"):
        moved = (grow[..., None] * (1 + u * k_qkv) + u * (n + k_qkv + 2)) * (ref.weights @ Va)
    moved += n * 2.0**-60 * v_max  # what underflowed weights, e^-745 · e^(2D) at most, add
    output = np.where(lost[..., None], apart, np.minimum(moved, apart))
    concat, largest = (a.transpose(1, 0, 2).reshape(-1, h * d_k) for a in (output, v_max))
    final = concat
    if st.projections:
        final = (concat + u * (h * d_k + 2) * largest) @ np.abs(s.W_O)
    L = math.log(n)
    with np.errstate(over="ignore"):
        entropy = np.expm1(D) * (np.exp(2 * D) * _spread(ref) + 2 * D)
    return {
        "X": u * 2 * Xa,
        "Q": u * k_qkv * Qa,
        "K": u * k_qkv * Ka,
        "V": u * k_qkv * Va,
        "scores": u * k_scores * factor * row_scores[..., None],
        "scaled": u * (k_scores + 1) * row_scores[..., None],
        "masked": u * (k_scores + 1) * row_scores[..., None],
        "weights": np.where(lost[..., None], 2 * gain, grow[..., None] * ref.weights + own),
        "output": output,
        "concat": concat,
        "final": final,
        "leak": np.where(lost, 2 * gain, grow * ref.leak + own),
        "row_sum": np.where(lost, 2 * gain, grow * ref.row_sum + own),
        "entropy": 2 * max(1.0, L) * u * (n + 8) + np.minimum(entropy, L),
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


def sdpa_output(s: Scenario, device: str = "cpu", dtype: str = "float64") -> np.ndarray | None:
    """Head outputs (h, n, d_k) from ``F.scaled_dot_product_attention`` on the reference Q, K, V.

    None when SDPA cannot express the settings (zero mask, drop after softmax, dropout).
    """
    import torch
    import torch.nn.functional as F

    st = s.settings
    if not (st.mask == "none" or st.mask in MINUS_INF_MASKS) or st.dropout > 0:
        return None
    ref = compute(s)
    dev, dt = resolve_device(device), _torch_dtype(dtype)
    q, k, v = (
        torch.tensor(np.asarray(a), dtype=dt, device=dev)[None] for a in (ref.Q, ref.K, ref.V)
    )
    # The keys each query may see, as SDPA's boolean mask (None: every key).
    seen = None if st.mask == "none" else torch.as_tensor(~np.asarray(ref.future), device=dev)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=seen, scale=1.0 / ref.scale_factor)
    return out[0].detach().cpu().double().numpy()


@dataclass(frozen=True)
class CrossCheck:
    """The torch engine and SDPA against the NumPy float64 reference, quantity by quantity."""

    device: str
    dtype: str
    torch_diff: float  # the largest absolute difference over every quantity
    sdpa_diff: float | None
    sdpa_note: str  # why SDPA was not compared, when it was not
    quantities: tuple[Difference, ...] = ()  # torch's quantities, then SDPA's output

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
    """Compare the torch engine and SDPA with the NumPy reference on one scenario."""
    dev = resolve_device(device)
    ref = compute(s)
    tol = tolerances(s, ref, dtype)
    found = differences(ref, compute_torch(s, dev, dtype), tol)
    torch_diff = max(q.diff for q in found)
    sdpa = sdpa_output(s, dev, dtype)
    if sdpa is None:
        why = "dropout is on" if s.settings.dropout > 0 else f"mask {s.settings.mask!r}"
        return CrossCheck(dev, dtype, torch_diff, None, f"SDPA cannot express {why}", found)
    by_sdpa = difference("SDPA output", ref.output, sdpa, tol["output"])
    return CrossCheck(dev, dtype, torch_diff, by_sdpa.diff, "", (*found, by_sdpa))
