"""The same maths on torch (CPU or CUDA, float32 or float64), and cross-checks.

torch is imported inside the functions, so importing this module stays cheap.
``cross_check`` compares the torch engine and ``F.scaled_dot_product_attention``
with the NumPy float64 reference.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from attnviz.core.engine import (
    Result,
    compute,
    dropout_keep,
    future_mask,
    sinusoidal,
    split_heads,
)
from attnviz.core.scenario import Scenario

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
    future = torch.as_tensor(future_mask(s.n), device=dev)
    if st.mask == "causal":
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
    log_p = torch.where(p > 0, torch.log(p), torch.zeros_like(p))
    entropy = -(p * log_p).sum(dim=-1)

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
    future_np = future_mask(s.n)
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


def max_difference(a: Result, b: Result) -> float:
    """The largest absolute difference over every intermediate (−∞ must match −∞)."""
    worst = 0.0
    for name in ("X", "Q", "K", "V", "scores", "scaled", "masked", "weights", "output"):
        x, y = getattr(a, name), getattr(b, name)
        if not np.array_equal(np.isneginf(x), np.isneginf(y)):
            return math.inf
        finite = np.isfinite(x)
        if finite.any():
            worst = max(worst, float(np.abs(x[finite] - y[finite]).max()))
    for name in ("concat", "final", "leak", "row_sum", "entropy"):
        worst = max(worst, float(np.abs(getattr(a, name) - getattr(b, name)).max()))
    return worst


def sdpa_output(s: Scenario, device: str = "cpu", dtype: str = "float64") -> np.ndarray | None:
    """Head outputs (h, n, d_k) from ``F.scaled_dot_product_attention`` on the reference Q, K, V.

    None when SDPA cannot express the settings (zero mask, drop after softmax, dropout).
    """
    import torch
    import torch.nn.functional as F

    st = s.settings
    if st.mask not in ("none", "causal") or st.dropout > 0:
        return None
    ref = compute(s)
    dev, dt = resolve_device(device), _torch_dtype(dtype)
    q, k, v = (
        torch.tensor(np.asarray(a), dtype=dt, device=dev)[None] for a in (ref.Q, ref.K, ref.V)
    )
    out = F.scaled_dot_product_attention(
        q, k, v, is_causal=st.mask == "causal", scale=1.0 / ref.scale_factor
    )
    return out[0].detach().cpu().double().numpy()


@dataclass(frozen=True)
class CrossCheck:
    """Max absolute differences from the NumPy float64 reference."""

    device: str
    dtype: str
    torch_diff: float
    sdpa_diff: float | None
    sdpa_note: str  # why SDPA was not compared, when it was not
    scale: float = 1.0  # the largest |value| compared, at least 1

    @property
    def worst(self) -> float:
        return max(self.torch_diff, self.sdpa_diff or 0.0)

    @property
    def relative(self) -> float:
        """worst over the size of the numbers: what float64 rounding is measured against."""
        return self.worst / self.scale


def cross_check(s: Scenario, device: str = "cpu", dtype: str = "float64") -> CrossCheck:
    """Compare the torch engine and SDPA with the NumPy reference on one scenario."""
    dev = resolve_device(device)
    ref = compute(s)
    torch_diff = max_difference(ref, compute_torch(s, dev, dtype))
    finite = ref.scaled[np.isfinite(ref.scaled)]
    scale = max(
        1.0, *(float(np.abs(a).max()) for a in (ref.Q, ref.K, ref.V, ref.final, finite) if a.size)
    )
    sdpa = sdpa_output(s, dev, dtype)
    if sdpa is None:
        why = "dropout is on" if s.settings.dropout > 0 else f"mask {s.settings.mask!r}"
        return CrossCheck(dev, dtype, torch_diff, None, f"SDPA cannot express {why}", scale)
    sdpa_diff = float(np.abs(sdpa - ref.output).max())
    return CrossCheck(dev, dtype, torch_diff, sdpa_diff, "", scale)
