"""Training the layer: on the open scenario's own loss (``losses.py``) or on a task
(``tasks.py``), with an optimiser (``optimizers.py``), step by step.

Training scores every position in one pass with the scenario's mask (and its attention
dropout, a fresh mask each step); inference generates token by token with a KV cache, so
position i sees only the tokens up to i whatever the mask claims: the inference loss is
the same loss under the causal −∞ mask, without dropout. Under −∞ the two agree; under
the zero mask the training pass can read the answer (the next token) through the leak,
and inference cannot.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from attnviz.core.maths.losses import gradients
from attnviz.core.maths.optimizers import TRAINABLE, Optimizer, State, step
from attnviz.core.maths.scenario import LIMITS, Scenario, ScenarioError
from attnviz.core.maths.tasks import (
    Example,
    Task,
    embedding_table,
    example_gradients,
    example_loss,
    on_example,
)

MAX_STEPS = 1_000_000
MAX_BATCH = 256
LARGEST = LIMITS.abs_value  # the largest entry a scenario's matrices may hold
DEFAULT_TRAINS = ("W_Q", "W_K", "W_V", "W_O")
TASK_TRAINABLE = ("E", *(name for name in TRAINABLE if name not in ("X", "X_kv")))
DEFAULT_TASK_TRAINS = ("E", *DEFAULT_TRAINS)


@dataclass(frozen=True, eq=False)
class LastStep:
    """The run's latest step, as the Inspector writes it out: its number, the optimiser,
    and before it each trained parameter, its gradient and the optimiser's buffers."""

    step: int
    opt: Optimizer
    params: dict[str, np.ndarray]
    grads: dict[str, np.ndarray]
    buffers: dict[str, tuple[np.ndarray, ...]]


@dataclass(frozen=True)
class Losses:
    """The losses after ``step`` steps, without dropout. Scenario: its own loss (train)
    and that loss as generation sees it (inference). Task: the mean loss over the
    training and the held-out examples, and over the held-out ones generated token by
    token (inference)."""

    step: int
    train: float
    held_out: float | None
    inference: float


def inference_view(s: Scenario) -> Scenario:
    """The scenario as generation with a KV cache computes it: each position only its
    past (the causal −∞ mask; masks that already hide the future stay), no dropout."""
    mask = s.settings.mask if s.settings.mask in ("causal", "sliding-window") else "causal"
    return s.with_settings(mask=mask, dropout=0.0)


def inference_loss(s: Scenario) -> float:
    """The scenario's own loss as generation sees it."""
    return gradients(inference_view(s)).loss


class Trainer:
    """A training run, one step at a time: the layer (and the task's embedding table E),
    the optimiser's state and the batches' order all follow from the start and the seed,
    so the same seed gives the same run, bit for bit."""

    def __init__(
        self,
        s: Scenario,
        opt: Optimizer,
        task: Task | None = None,
        *,
        seed: int = 0,
        trains: Sequence[str] | None = None,
        batch: int = 8,
    ) -> None:
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32:
            raise ScenarioError(f"seed: expected an integer in [0, 2^32), got {seed!r}")
        if isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= MAX_BATCH:
            raise ScenarioError(f"batch: expected a whole number from 1 to {MAX_BATCH}")
        allowed = TRAINABLE if task is None else TASK_TRAINABLE
        trains = tuple(trains or (DEFAULT_TRAINS if task is None else DEFAULT_TASK_TRAINS))
        unknown = [name for name in trains if name not in allowed]
        if unknown:
            raise ScenarioError(f"train {unknown[0]!r}: expected some of {', '.join(allowed)}")
        if task is not None and s.X_kv is not None:
            raise ScenarioError("task: a task trains self-attention, not cross-attention")
        self.opt, self.task, self.seed, self.trains, self.batch = opt, task, seed, trains, batch
        self.state = State()
        self.layer = s
        self.E = None if task is None else embedding_table(task, s.d_model, seed)
        self._order = np.random.default_rng(seed)
        self._queue: list[int] = []
        self.last: LastStep | None = None

    @property
    def steps(self) -> int:
        return self.state.step

    @property
    def scenario(self) -> Scenario:
        """The layer as it stands; under a task, over its first held-out example."""
        if self.task is None or self.E is None:
            return self.layer
        return on_example(self.layer, self.task, self.E, self.task.held_out[0])

    def step(self) -> float:
        """One optimiser step; the loss of its batch before it (with dropout, if set)."""
        s = self._with_fresh_dropout(self.layer)
        if self.task is None:
            g = gradients(s)
            grads = {name: g.inputs[name] for name in self.trains if name in g.inputs}
            value = g.loss
        else:
            value, grads = self._batch_gradients(s)
        params = {name: self._param(name) for name in grads}
        changed, state = step(self.opt, self.state, params, grads)
        E = changed.pop("E", self.E)
        try:
            if E is not None and not np.all(np.abs(E) <= LARGEST):
                raise ScenarioError(f"E: an entry beyond ±{LARGEST:g}")
            layer = dataclasses.replace(self.layer, **changed)
        except ScenarioError as e:  # the run stays at the last good step
            raise ScenarioError(
                f"step {state.step:,} diverged ({e}); try a smaller learning rate or clipping"
            ) from None
        self.last = LastStep(state.step, self.opt, params, grads, self.state.buffers)
        self.layer, self.E, self.state = layer, E, state
        return value

    def losses(self) -> Losses:
        """Train, held-out and inference losses as the run stands, without dropout."""
        s = self.layer.with_settings(dropout=0.0)
        if self.task is None:
            return Losses(self.steps, gradients(s).loss, None, inference_loss(s))
        return Losses(
            self.steps,
            self._mean_loss(s, self.task.train),
            self._mean_loss(s, self.task.held_out),
            self._mean_loss(inference_view(s), self.task.held_out),
        )

    def _param(self, name: str) -> np.ndarray:
        if name == "E":
            assert self.E is not None
            return self.E
        return np.asarray(getattr(self.layer, name), dtype=np.float64)

    def _with_fresh_dropout(self, s: Scenario) -> Scenario:
        if not s.settings.dropout:
            return s
        return s.with_settings(dropout_seed=(s.settings.dropout_seed + self.steps) % 2**32)

    def _next_batch(self) -> list[int]:
        assert self.task is not None
        while len(self._queue) < self.batch:
            self._queue.extend(int(i) for i in self._order.permutation(len(self.task.train)))
        batch, self._queue = self._queue[: self.batch], self._queue[self.batch :]
        return batch

    def _batch_gradients(self, s: Scenario) -> tuple[float, dict[str, np.ndarray]]:
        """The batch's mean loss and the mean of its examples' gradients."""
        assert self.task is not None and self.E is not None
        total, grads = 0.0, dict[str, np.ndarray]()
        for b, i in enumerate(self._next_batch()):
            one = s
            if s.settings.dropout:  # each example of the batch its own dropout mask
                one = s.with_settings(dropout_seed=(s.settings.dropout_seed * 7919 + b) % 2**32)
            example = self.task.train[i]
            g, d_E = example_gradients(on_example(one, self.task, self.E, example), self.E, example)
            total += g.loss
            for name in self.trains:
                a = d_E if name == "E" else g.inputs.get(name)
                if a is not None:
                    grads[name] = a + grads[name] if name in grads else a
        return total / self.batch, {name: a / self.batch for name, a in grads.items()}

    def _mean_loss(self, s: Scenario, examples: Sequence[Example]) -> float:
        assert self.task is not None and self.E is not None
        E, task = self.E, self.task
        return float(np.mean([example_loss(on_example(s, task, E, ex), E, ex) for ex in examples]))


@dataclass(frozen=True, eq=False)
class Run:
    """A finished run: the scenario after it, each step's loss (before the step), and
    the losses at the end."""

    scenario: Scenario
    step_losses: tuple[float, ...]
    final: Losses


def train(trainer: Trainer, steps: int, report: Callable[[int, float], None] | None = None) -> Run:
    """``steps`` more steps of the trainer; ``report(step, loss)`` after each (it may
    raise to stop: nothing is returned then)."""
    check_steps(steps)
    losses = []
    for k in range(1, steps + 1):
        losses.append(trainer.step())
        if report is not None:
            report(k, losses[-1])
    return Run(trainer.scenario, tuple(losses), trainer.losses())


def check_steps(steps: object) -> int:
    if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= MAX_STEPS:
        raise ScenarioError(
            f"steps: expected a whole number from 1 to {MAX_STEPS:,}, got {steps!r}"
        )
    return steps
