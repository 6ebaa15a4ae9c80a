"""Gradient descent on a scenario: SGD, SGD with momentum, Adam and AdamW, as torch.optim
computes them (its default options otherwise), step for step in float64.

For a parameter p with gradient g at step t (from 1), learning rate η, weight decay λ:

    sgd        p ← p − η (g + λp)
    momentum   g ← g + λp;  b ← g (t = 1), else μ b + g;   p ← p − η b
    adam       g ← g + λp;  m ← m + (1 − β₁)(g − m);  v ← β₂v + (1 − β₂)g²
               p ← p − η/(1 − β₁ᵗ) · m / (√v / √(1 − β₂ᵗ) + ε)
    adamw      p ← p (1 − ηλ), then adam's step without the λp term

With ``clip``, every gradient is first multiplied by min(1, clip / (‖g‖ + 10⁻⁶)), ‖g‖
over all the trained parameters together (torch's clip_grad_norm_). Which matrices train
is the caller's choice (``train_step``'s ``trains``); the others stay as they are.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from attnviz.core.maths.losses import Loss, gradients
from attnviz.core.maths.scenario import Scenario, ScenarioError

OPTIMIZERS = ("sgd", "momentum", "adam", "adamw")
TRAINABLE = ("X", "X_kv", "W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O", "q_norm",
             "k_norm")  # fmt: skip


@dataclass(frozen=True)
class Optimizer:
    """Which optimiser and its options (torch.optim's names and defaults but the rate)."""

    kind: str = "sgd"
    lr: float = 0.1
    momentum: float = 0.9  # "momentum" only
    betas: tuple[float, float] = (0.9, 0.999)  # "adam" and "adamw"
    eps: float = 1e-8
    weight_decay: float = 0.0
    clip: float | None = None  # the largest gradient norm, or None

    def __post_init__(self) -> None:
        if self.kind not in OPTIMIZERS:
            raise ScenarioError(f"optimizer {self.kind!r}: expected one of {', '.join(OPTIMIZERS)}")
        checks = (
            ("lr", self.lr, 0.0, 1e3),
            ("momentum", self.momentum, 0.0, 1.0),
            ("beta1", self.betas[0], 0.0, 1.0),
            ("beta2", self.betas[1], 0.0, 1.0),
            ("eps", self.eps, 0.0, 1.0),
            ("weight_decay", self.weight_decay, 0.0, 1e3),
        )
        for name, value, low, high in checks:
            if not isinstance(value, (int, float)) or not low <= value < high:
                raise ScenarioError(
                    f"{name}: expected a number in [{low:g}, {high:g}), got {value!r}"
                )
        if self.clip is not None and not (isinstance(self.clip, (int, float)) and self.clip > 0):
            raise ScenarioError(f"clip: expected a positive number, got {self.clip!r}")


@dataclass(frozen=True, eq=False)
class State:
    """What an optimiser carries from step to step: the step count and, per parameter, its
    buffers (momentum's b; Adam's m and v)."""

    step: int = 0
    buffers: dict[str, tuple[np.ndarray, ...]] = field(default_factory=dict)


def train_step(
    s: Scenario,
    opt: Optimizer,
    state: State,
    trains: Sequence[str],
    loss: Loss | None = None,
) -> tuple[Scenario, State, float]:
    """One step: the loss of s (its own unless given) before the step, and s with the
    matrices in ``trains`` moved against their gradients."""
    unknown = [name for name in trains if name not in TRAINABLE]
    if unknown:
        raise ScenarioError(f"train {unknown[0]!r}: expected some of {', '.join(TRAINABLE)}")
    g = gradients(s, loss)
    grads = {name: g.inputs[name] for name in trains if name in g.inputs}
    params = {name: np.asarray(getattr(s, name), dtype=np.float64) for name in grads}
    changed, state = step(opt, state, params, grads)
    return dataclasses.replace(s, **changed), state, g.loss


def step(
    opt: Optimizer, state: State, params: dict[str, np.ndarray], grads: dict[str, np.ndarray]
) -> tuple[dict[str, Any], State]:
    """Each parameter after one step against its gradient (clipped together), and the
    optimiser's new state."""
    if opt.clip is not None:
        grads = _clipped(grads, opt.clip)
    t = state.step + 1
    changed: dict[str, Any] = {}
    buffers = dict(state.buffers)
    for name, grad in grads.items():
        changed[name], buffers[name] = update(opt, params[name], grad, buffers.get(name, ()), t)
    return changed, State(t, buffers)


def _clipped(grads: dict[str, np.ndarray], most: float) -> dict[str, np.ndarray]:
    norm = float(np.sqrt(sum(float(np.sum(a * a)) for a in grads.values())))
    scale = min(1.0, most / (norm + 1e-6))
    return {name: a * scale for name, a in grads.items()}


def update(
    opt: Optimizer, p: np.ndarray, g: np.ndarray, buffers: tuple[np.ndarray, ...], t: int
) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
    """p after one step, and its new buffers."""
    lr, wd = opt.lr, opt.weight_decay
    if opt.kind == "adamw":
        p = p * (1.0 - lr * wd)
    elif wd:
        g = g + wd * p
    if opt.kind == "sgd":
        return p - lr * g, ()
    if opt.kind == "momentum":
        b = g.copy() if not buffers else opt.momentum * buffers[0] + g
        return p - lr * b, (b,)
    beta1, beta2 = opt.betas
    m, v = buffers if buffers else (np.zeros_like(p), np.zeros_like(p))
    m = m + (1.0 - beta1) * (g - m)  # (torch's lerp: the same m, rounded its way)
    v = beta2 * v + (1.0 - beta2) * g * g
    denom = np.sqrt(v) / np.sqrt(1.0 - beta2**t) + opt.eps
    return p - (lr / (1.0 - beta1**t)) * (m / denom), (m, v)
