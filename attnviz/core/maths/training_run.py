"""A training run as the window plays it: the Trainer (``training.py``) stepped in
chunks that stop between steps, the losses evaluated every few steps, snapshots of the
layer to scrub through, the steps per second, and an optional comparison run: a second
Trainer over the same start and seed with one setting changed, stepped in lock-step.

No Qt here: the window's adapter (attnviz.ui.training) runs ``advance`` on a worker
thread and hands each ``Progress`` (an immutable picture of the run) to the views.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from attnviz.core.maths.optimizers import Optimizer
from attnviz.core.maths.scenario import Scenario, ScenarioError
from attnviz.core.maths.tasks import TASKS, load_task
from attnviz.core.maths.training import (
    DEFAULT_TASK_TRAINS,
    DEFAULT_TRAINS,
    LastStep,
    Losses,
    Trainer,
)

MAX_POINTS = 200  # loss points and snapshots kept; a longer run keeps every other one
COMPARISONS = ("mask", "scale", "dropout")
COMPARISON_TITLES = {
    "mask": "mask: causal −∞ ↔ causal-zero",
    "scale": "scale: ÷√d_k on ↔ off",
    "dropout": "dropout: on ↔ off",
}


def compared(s: Scenario, compare: str) -> Scenario:
    """The comparison run's start: ``s`` with one setting changed."""
    st = s.settings
    if compare == "mask":
        return s.with_settings(mask="causal" if st.mask == "causal-zero" else "causal-zero")
    if compare == "scale":
        return s.with_settings(scale=not st.scale)
    if compare == "dropout":
        return s.with_settings(dropout=0.0 if st.dropout else 0.1)
    raise ScenarioError(f"compare {compare!r}: expected one of {', '.join(COMPARISONS)}")


def setting_label(s: Scenario, compare: str) -> str:
    """The compared setting's value in ``s``, as a legend names a run by it."""
    st = s.settings
    if compare == "mask":
        return "causal −∞" if st.mask == "causal" else st.mask
    if compare == "scale":
        return "÷√d_k" if st.scale else "no ÷√d_k"
    return f"dropout {st.dropout:g}" if st.dropout else "no dropout"


@dataclass(frozen=True)
class RunConfig:
    """How to train: a task (None: the scenario's own loss), the optimiser and its
    options, the seed, the batch (tasks), which matrices train (empty: the Trainer's
    default), the comparison (None, or one of COMPARISONS) and how often the losses are
    evaluated (every ``eval_every`` steps; the evaluation is not free)."""

    task: str | None = None
    optimizer: str = "adam"
    lr: float = 0.02
    clip: float | None = None
    seed: int = 0
    batch: int = 8
    trains: tuple[str, ...] = ()
    compare: str | None = None
    eval_every: int = 10

    def same_run(self, other: RunConfig) -> bool:
        """Whether a run of ``other`` trains as this one does (how often each evaluates
        aside; no choice of matrices is the default one)."""
        return self._plain() == other._plain()

    def _plain(self) -> RunConfig:
        default = DEFAULT_TRAINS if self.task is None else DEFAULT_TASK_TRAINS
        return dataclasses.replace(self, trains=tuple(sorted(self.trains or default)), eval_every=1)

    def optimiser(self) -> Optimizer:
        return Optimizer(self.optimizer, lr=self.lr, clip=self.clip)

    def trainer(self, s: Scenario) -> Trainer:
        if self.task is not None and self.task not in TASKS:
            raise ScenarioError(f"task {self.task!r}: expected one of {', '.join(TASKS)}")
        task = None if self.task is None else load_task(self.task)
        trains = self.trains or None
        return Trainer(s, self.optimiser(), task, seed=self.seed, trains=trains, batch=self.batch)


@dataclass(frozen=True)
class Point:
    """The losses of the run (and of the comparison run) after ``step`` steps, and the
    mean loss its steps saw since the previous point (their batches, with dropout; None
    at the start)."""

    step: int
    main: Losses
    other: Losses | None
    seen: tuple[float | None, float | None] = (None, None)


@dataclass(frozen=True, eq=False)
class Progress:
    """The run as it stands, for the views: the layer now, the evaluated losses, the
    snapshots (step, layer), the steps per second, and the legend's names of the two
    runs ("" for the main run without a comparison)."""

    step: int
    scenario: Scenario
    points: tuple[Point, ...]
    snapshots: tuple[tuple[int, Scenario], ...]
    steps_per_second: float
    names: tuple[str, str | None]
    config: RunConfig = field(default_factory=RunConfig)
    last: LastStep | None = None  # the main run's latest step (the Inspector writes it out)


class TrainingRun:
    """One run from a start scenario (and, with a comparison, its twin)."""

    def __init__(self, start: Scenario, config: RunConfig) -> None:
        if isinstance(config.eval_every, bool) or not 1 <= config.eval_every <= 10_000:
            raise ScenarioError("eval_every: expected a whole number from 1 to 10,000")
        self.start, self.config = start, config
        self.main = config.trainer(start)
        self.other = (
            None if config.compare is None else config.trainer(compared(start, config.compare))
        )
        self.every = config.eval_every
        self.points: list[Point] = []
        self.snapshots: list[tuple[int, Scenario]] = []
        self.steps_per_second = 0.0
        self.scenario = self.main.scenario
        self._seen: tuple[list[float], list[float]] = ([], [])
        self.record()

    @property
    def steps(self) -> int:
        return self.main.steps

    def names(self) -> tuple[str, str | None]:
        compare = self.config.compare
        if compare is None or self.other is None:
            return "", None
        return setting_label(self.main.layer, compare), setting_label(self.other.layer, compare)

    def step(self) -> None:
        """One step of the run (and of its twin); the losses every ``every`` steps."""
        self._seen[0].append(self.main.step())
        if self.other is not None:
            self._seen[1].append(self.other.step())
        self.scenario = self.main.scenario
        if self.steps % self.every == 0:
            self.record()

    def record(self) -> None:
        """Evaluate the losses now, and keep the layer as a snapshot."""
        if self.points and self.points[-1].step == self.steps:
            return
        other = None if self.other is None else self.other.losses()
        seen = tuple(sum(values) / len(values) if values else None for values in self._seen)
        self._seen = ([], [])
        self.points.append(Point(self.steps, self.main.losses(), other, (seen[0], seen[1])))
        self.snapshots.append((self.steps, self.scenario))
        if len(self.points) > MAX_POINTS:  # thin: every other one, the first and the latest kept
            last = len(self.points) - 1
            keep = [k for k in range(len(self.points)) if k % 2 == 0 or k == last]
            self.points = [self.points[k] for k in keep]
            self.snapshots = [self.snapshots[k] for k in keep]
            self.every *= 2

    def advance(self, budget_s: float, stop: Callable[[], bool], limit: int | None = None) -> int:
        """Step until ``budget_s`` seconds have passed (at least one step), ``stop()``
        says so or ``limit`` steps are done; the steps done."""
        began = time.perf_counter()
        done = 0
        while not stop() and (limit is None or done < limit):
            self.step()
            done += 1
            if time.perf_counter() - began >= budget_s:
                break
        took = time.perf_counter() - began
        if done and took > 0:
            rate = done / took
            old = self.steps_per_second
            self.steps_per_second = rate if old == 0 else 0.7 * old + 0.3 * rate
        return done

    def progress(self) -> Progress:
        return Progress(
            self.steps,
            self.scenario,
            tuple(self.points),
            tuple(self.snapshots),
            self.steps_per_second,
            self.names(),
            self.config,
            self.main.last,
        )
