"""Training the open scenario on its own loss (``losses.py``) with an optimiser
(``optimizers.py``): a run of steps, its loss curve, and the inference loss.

Training scores every position in one pass with the scenario's mask; inference
generates token by token with a KV cache, so position i sees only the tokens up to i
whatever the mask claims: the inference loss is the same loss under the causal −∞ mask.
Under −∞ the two agree; under the zero mask the training pass can read the answer (the
next token) through the leak, and inference cannot.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from attnviz.core.maths.losses import gradients
from attnviz.core.maths.optimizers import Optimizer, State, train_step
from attnviz.core.maths.scenario import Scenario, ScenarioError

MAX_STEPS = 1_000_000
DEFAULT_TRAINS = ("W_Q", "W_K", "W_V", "W_O")


@dataclass(frozen=True, eq=False)
class Run:
    """A training run: the scenario after it, the loss before each step (and after the
    last), and the inference loss at the end."""

    scenario: Scenario
    losses: tuple[float, ...]
    inference: float

    @property
    def final(self) -> float:
        return self.losses[-1]


def inference_loss(s: Scenario) -> float:
    """The scenario's loss as generation sees it: each position only its past (the causal
    −∞ mask; the same as training's under −∞)."""
    causal = s if s.settings.mask == "causal" else s.with_settings(mask="causal", dropout=0.0)
    return gradients(causal).loss


def train(
    s: Scenario,
    opt: Optimizer,
    steps: int,
    trains: Sequence[str] = DEFAULT_TRAINS,
    report: Callable[[int, float], None] | None = None,
) -> Run:
    """``steps`` optimiser steps on the scenario's own loss; ``report(step, loss)`` after
    each (it may raise to stop: nothing is returned then)."""
    if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= MAX_STEPS:
        raise ScenarioError(
            f"steps: expected a whole number from 1 to {MAX_STEPS:,}, got {steps!r}"
        )
    state, losses = State(), []
    for step in range(1, steps + 1):
        s, state, loss = train_step(s, opt, state, trains)
        losses.append(loss)
        if report is not None:
            report(step, loss)
    losses.append(gradients(s).loss)
    return Run(s, tuple(losses), inference_loss(s))
