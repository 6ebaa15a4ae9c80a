"""The layer written again in torch primitives (float64), for autograd to differentiate:
the reference for attnviz's hand-written backward pass. It shares no code with attnviz
(not even its torch engine): the spec's order of operations, one query head at a time,
as in variant_reference.py. The sinusoidal encoding and the dropout mask are constants
the gradient passes by, taken as given.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import reference as plain
import torch
from variant_reference import hidden_by_hand, paper_slopes, relative_settings, t5_bucket

from attnviz.core.maths.scenario import Scenario

PARAMETERS = ("X", "X_kv", "W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O",
              "q_norm", "k_norm", "relative_bias")  # fmt: skip
HEAD_FIELDS = ("Q", "K", "V", "Q_rot", "K_rot", "scores", "scaled", "masked", "weights", "output")


def t(a: Any) -> torch.Tensor:
    return torch.tensor(np.asarray(a, dtype=np.float64), dtype=torch.float64)


def rms(A: torch.Tensor, w: torch.Tensor | None, eps: float) -> torch.Tensor:
    out = A / torch.sqrt((A * A).mean(dim=-1, keepdim=True) + eps)
    return out if w is None else out * w


def rotate(
    A: torch.Tensor, pos: list[int], base: float, style: str, r: int, freqs=None, factor=1.0
) -> torch.Tensor:
    half = r // 2
    i = torch.arange(half, dtype=torch.float64)
    freq = base ** (-2.0 * i / r) if freqs is None else torch.tensor(freqs, dtype=torch.float64)
    theta = torch.tensor(pos, dtype=torch.float64)[:, None] * freq
    first = list(range(half)) if style == "half" else list(range(0, r, 2))
    second = list(range(half, r)) if style == "half" else list(range(1, r, 2))
    x, y = A[:, first], A[:, second]
    out = A.clone()
    out[:, first] = factor * (x * torch.cos(theta) - y * torch.sin(theta))
    out[:, second] = factor * (x * torch.sin(theta) + y * torch.cos(theta))
    return out


def forward(s: Scenario, keep: np.ndarray | None) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """(the leaf tensors, every intermediate: per-head lists, concat, final)."""
    st = s.settings
    n, m = s.n, s.m
    proj = st.projections
    names = [p for p in PARAMETERS if getattr(s, p) is not None]
    leaves = {p: t(getattr(s, p)).requires_grad_() for p in names}
    X = leaves["X"]
    if st.positional == "sinusoidal":
        X = X + t(plain.sinusoidal(n, s.d_model))
    X_kv = leaves["X_kv"] if s.cross else X
    offset = m - n if st.causal_alignment == "bottom-right" else 0
    qpos, kpos = [i + offset for i in range(n)], list(range(m))
    H, G = (s.n_heads, s.kv_heads) if proj else (1, 1)
    d = s.d_k if proj else s.d_model
    slopes = list(st.alibi_slopes) if st.alibi_slopes is not None else paper_slopes(s.n_heads)
    hidden = torch.tensor(hidden_by_hand(s))
    heads: dict[str, list[torch.Tensor]] = {name: [] for name in HEAD_FIELDS}
    projected = []
    for h in range(H):
        g = h * G // H
        if proj:
            Q = X @ leaves["W_Q"][h] + leaves["b_Q"][h, 0]
            K = X_kv @ leaves["W_K"][g] + leaves["b_K"][g, 0]
            V = X_kv @ leaves["W_V"][g] + leaves["b_V"][g, 0]
        else:
            Q, K, V = X * 1.0, X_kv * 1.0, X_kv * 1.0  # (own nodes, for their gradients)
        projected.append((Q, K, V))
    if st.qk_norm == "rms-whole":  # one RMS per token over every head (K: each copy)
        r_Q = torch.sqrt(sum((Q * Q).sum(-1) for Q, _, _ in projected) / (H * d) + st.qk_norm_eps)
        r_K = torch.sqrt(sum((K * K).sum(-1) for _, K, _ in projected) / (H * d) + st.qk_norm_eps)
    for h, (Q, K, V) in enumerate(projected):
        g = h * G // H
        Qr, Kr = Q, K
        if st.qk_norm == "rms":
            Qr = rms(Qr, leaves["q_norm"][h, 0] if proj else None, st.qk_norm_eps)
            Kr = rms(Kr, leaves["k_norm"][g, 0] if proj else None, st.qk_norm_eps)
        elif st.qk_norm == "rms-whole":
            Qr, Kr = Q / r_Q[:, None], K / r_K[:, None]
            if proj:
                Qr, Kr = Qr * leaves["q_norm"][h, 0], Kr * leaves["k_norm"][g, 0]
        if st.positional == "rope":
            r = st.rope_dims if st.rope_dims is not None else d - d % 2
            if r:
                turn = (st.rope_base, st.rope_style, r, st.rope_frequencies, st.rope_factor)
                Qr = rotate(Qr, qpos, *turn)
                Kr = rotate(Kr, kpos, *turn)
        scores = Qr @ Kr.T
        scale = 1.0
        if st.scale:
            scale = st.scale_value if st.scale_value is not None else 1.0 / d**0.5
        scaled = scores * scale
        if st.softcap is not None:
            scaled = st.softcap * torch.tanh(scaled / st.softcap)
        if st.positional == "alibi":
            distance = (t(qpos)[:, None] - t(kpos)[None, :]).abs()
            scaled = scaled - slopes[h] * distance
        if st.positional == "relative-bias":
            rel = [[t5_bucket(j - i, *relative_settings(st)) for j in kpos] for i in qpos]
            scaled = scaled + leaves["relative_bias"][torch.tensor(rel), h]
        masked = scaled
        if st.mask in ("causal", "sliding-window", "custom"):
            masked = scaled.masked_fill(hidden, -torch.inf)
        elif st.mask == "causal-zero":
            masked = scaled.masked_fill(hidden, 0.0)
        weights = softmax(masked, None if st.sinks is None else st.sinks[h])
        if st.mask == "drop-after-softmax":
            weights = weights.masked_fill(hidden, 0.0)
        if keep is not None:
            weights = weights * t(keep[h]) / (1.0 - st.dropout)
        output = weights @ V
        for name, value in zip(HEAD_FIELDS, (Q, K, V, Qr, Kr, scores, scaled, masked, weights,
                                             output), strict=True):  # fmt: skip
            if value.requires_grad:
                value.retain_grad()
            heads[name].append(value)
    concat = torch.cat(heads["output"], dim=1)
    final = concat
    if proj:
        final = leaves["b_O"][0].expand(n, s.d_model)
        for h in range(H):
            if h not in st.ablated:
                final = final + concat[:, h * d : (h + 1) * d] @ leaves["W_O"][h * d : (h + 1) * d]
    concat.retain_grad()
    final.retain_grad()
    return leaves, {**heads, "concat": concat, "final": final}


def softmax(masked: torch.Tensor, sink: float | None) -> torch.Tensor:
    """Row softmax, a sink logit in the denominator; a row of −∞ alone gives 0s."""
    logits = masked
    if sink is not None:
        logits = torch.cat([masked, torch.full((masked.shape[0], 1), sink, dtype=torch.float64)], 1)
    empty = torch.isinf(logits).all(dim=1, keepdim=True) & (logits < 0).all(dim=1, keepdim=True)
    safe = torch.where(empty, torch.zeros_like(logits), logits)
    p = torch.where(empty, torch.zeros_like(logits), torch.softmax(safe, dim=1))
    return p[:, : masked.shape[1]]


def loss_of(s: Scenario, final: torch.Tensor, X: torch.Tensor, kind: str, target=None, cell=(0, 0)):
    """The losses of losses.py, written again."""
    if kind == "target":
        T = t(target)
        return 0.5 * ((final - T) ** 2).sum()
    if kind == "cell":
        return final[cell]
    words, rows = [], []
    for i, tok in enumerate(s.tokens):
        if tok not in words:
            words.append(tok)
            rows.append(i)
    E = X[rows]
    logits = final[:-1] @ E.T
    answer = torch.tensor([words.index(tok) for tok in s.tokens[1:]])
    return torch.nn.functional.cross_entropy(logits, answer)
