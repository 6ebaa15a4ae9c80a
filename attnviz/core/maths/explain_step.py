"""One optimiser step of one trained entry, written out with its numbers for the
Inspector: the gradient (clipped, with weight decay), the optimiser's buffers and the
update, in the formulas of ``optimizers.py``; the step itself is ``optimizers.update`` on
the one entry, so the value it ends with is the entry the run holds after the step."""

from __future__ import annotations

import math

import numpy as np

from attnviz.core.maths.explain import Explanation, Step
from attnviz.core.maths.optimizers import update
from attnviz.core.maths.training import LastStep

FORMULAS = {
    "sgd": "p ← p − η·g",
    "momentum": "b ← μ·b + g (b = g at step 1); p ← p − η·b",
    "adam": "m ← m + (1 − β₁)·(g − m); v ← β₂·v + (1 − β₂)·g²; "
    "p ← p − η/(1 − β₁ᵗ) · m / (√v / √(1 − β₂ᵗ) + ε)",
    "adamw": "p ← p·(1 − η·λ); m ← m + (1 − β₁)·(g − m); v ← β₂·v + (1 − β₂)·g²; "
    "p ← p − η/(1 − β₁ᵗ) · m / (√v / √(1 − β₂ᵗ) + ε)",
}


def _num(x: float) -> str:
    return f"{x:.6g}".replace("-", "−")


def explain_step(last: LastStep, name: str, cell: tuple[int, ...], where: str) -> Explanation:
    """Entry ``cell`` of trained parameter ``name`` over the run's latest step (``where``
    names it for the title). KeyError when the parameter did not train, IndexError when
    the entry is not in it."""
    opt, t = last.opt, last.step
    p = float(last.params[name][cell])
    g = float(last.grads[name][cell])
    steps = [Step(f"p before step {t:,}", p), Step(f"g = ∂L/∂{where}", g)]
    notes = [f"{opt.kind}, η = {_num(opt.lr)}"]
    if opt.clip is not None:
        norm = math.sqrt(sum(float(np.sum(a * a)) for a in last.grads.values()))
        factor = min(1.0, opt.clip / (norm + 1e-6))
        g *= factor
        steps.append(Step(f"g × min(1, {_num(opt.clip)} / ‖g‖ = {_num(norm)}): clipped", g))
    lr, wd = opt.lr, opt.weight_decay
    if opt.kind == "adamw" and wd:
        steps.append(Step(f"p × (1 − η·λ), λ = {_num(wd)}", p * (1.0 - lr * wd)))
    elif wd:
        steps.append(Step(f"g + λ·p, λ = {_num(wd)}", g + wd * p))
    before = tuple(np.array(b[cell]) for b in last.buffers.get(name, ()))
    after, buffers = update(opt, np.array(p), np.array(g), before, t)  # the step itself
    if opt.kind == "momentum":
        label = f"b = μ·b + g, μ = {_num(opt.momentum)}" if before else "b = g"
        steps.append(Step(label, float(buffers[0])))
    elif opt.kind in ("adam", "adamw"):
        beta1, beta2 = opt.betas
        m, v = (float(b) for b in buffers)
        denom = math.sqrt(v) / math.sqrt(1.0 - beta2**t) + opt.eps
        steps += [
            Step(f"m = m + (1 − β₁)·(g − m), β₁ = {_num(beta1)}", m),
            Step(f"v = β₂·v + (1 − β₂)·g², β₂ = {_num(beta2)}", v),
            Step("√v / √(1 − β₂ᵗ) + ε", denom),
            Step("η/(1 − β₁ᵗ) · m / (…)", (lr / (1.0 - beta1**t)) * (m / denom)),
        ]
    p = float(after)
    notes.append(f"step {t:,}")
    return Explanation(
        f"{where}: the last training step",
        FORMULAS[opt.kind],
        (),
        (*steps, Step(f"p after step {t:,}", p)),
        p,
        note=", ".join(notes),
    )
