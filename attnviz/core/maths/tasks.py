"""Training tasks: a vocabulary, examples split into training and held-out ones, and the
loss of one example through a token embedding table.

A task owns the table E (one row per vocabulary token, d_model wide): an example's X is
E's rows for its tokens, and its logits are the layer's output times Eᵀ (the tied
unembedding, as GPT-2 ties its embeddings). At each position the example names the token
to predict there, or nothing; the loss is the mean cross-entropy over the named ones.
The shipped tasks live in resources/tasks/ (made by packaging/make_tasks.py).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

import numpy as np

from attnviz.assets import resource
from attnviz.core.maths.backward import Gradients, backward
from attnviz.core.maths.forward import compute
from attnviz.core.maths.scenario import Scenario, ScenarioError

TASKS = ("toy-corpus", "copy", "previous-token", "previous-and-first", "induction")
UNSCORED = "_"


@dataclass(frozen=True)
class Example:
    """Token indices into the vocabulary, and at each position the indices to predict
    there: none (not scored), one, or several (each as likely: the target is the
    uniform distribution over them)."""

    tokens: tuple[int, ...]
    targets: tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class Task:
    name: str
    title: str
    description: str
    vocabulary: tuple[str, ...]
    train: tuple[Example, ...]
    held_out: tuple[Example, ...]

    def words(self, example: Example) -> tuple[str, ...]:
        return tuple(self.vocabulary[i] for i in example.tokens)


def load_task(name: str) -> Task:
    """One of the shipped tasks (TASKS)."""
    if name not in TASKS:
        raise ScenarioError(f"task {name!r}: expected one of {', '.join(TASKS)}")
    doc = json.loads(resource("tasks", f"{name}.task.json").read_text(encoding="utf-8"))
    vocabulary = tuple(doc["vocabulary"])
    index = {w: i for i, w in enumerate(vocabulary)}

    def example(row: list[str]) -> Example:
        tokens, targets = (line.split(" ") for line in row)
        answers = (() if t == UNSCORED else tuple(index[w] for w in t.split("+")) for t in targets)
        return Example(tuple(index[t] for t in tokens), tuple(answers))

    return Task(
        name,
        doc["title"],
        doc["description"],
        vocabulary,
        tuple(example(row) for row in doc["train"]),
        tuple(example(row) for row in doc["held_out"]),
    )


def embedding_table(task: Task, d_model: int, seed: int) -> np.ndarray:
    """A seeded start for E: unit-variance entries (a row's norm near √d_model)."""
    rng = np.random.default_rng([seed, d_model, len(task.vocabulary)])
    return rng.standard_normal((len(task.vocabulary), d_model))


def on_example(s: Scenario, task: Task, E: np.ndarray, example: Example) -> Scenario:
    """The scenario's layer over one example: X is E's rows for its tokens."""
    return dataclasses.replace(s, X=E[list(example.tokens)], tokens=task.words(example))


def example_loss(s: Scenario, E: np.ndarray, example: Example) -> float:
    """The example's mean cross-entropy with s's layer (X already E's rows: on_example)."""
    value, _, _ = _cross_entropy(compute(s).final, E, example.targets)
    return value


def example_gradients(s: Scenario, E: np.ndarray, example: Example) -> tuple[Gradients, np.ndarray]:
    """The example's loss and every gradient of s's layer, and dL/dE: through X's rows
    (its tokens) and through the tied unembedding."""
    r = compute(s)
    value, d_final, d_logits = _cross_entropy(r.final, E, example.targets)
    g = backward(s, r, d_final, value)
    d_E = d_logits.T @ r.final
    np.add.at(d_E, list(example.tokens), g.inputs["X"])
    return g, d_E


def _cross_entropy(
    final: np.ndarray, E: np.ndarray, targets: tuple[tuple[int, ...], ...]
) -> tuple[float, np.ndarray, np.ndarray]:
    """The mean cross-entropy over the scored positions (against the uniform distribution
    over each one's answers), dL/dfinal and dL/dlogits."""
    rows = [i for i, answers in enumerate(targets) if answers]
    if not rows:
        raise ScenarioError("task: an example scores no position")
    want = np.zeros((len(rows), E.shape[0]))
    for k, i in enumerate(rows):
        np.add.at(want[k], list(targets[i]), 1.0 / len(targets[i]))
    logits = final[rows] @ E.T
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_p = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    value = -float(np.sum(want * log_p)) / len(rows)
    d_logits = np.zeros((len(targets), E.shape[0]))
    d_logits[rows] = (np.exp(log_p) - want) / len(rows)
    return value, d_logits @ E, d_logits
