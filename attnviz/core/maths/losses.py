"""Losses over the layer's output, each with its gradient dL/dfinal: what the backward
pass (``backward.py``) starts from.

- ``target``: ½‖final − T‖² for a target T of final's shape. The default asks for a
  previous-token head: row i of T is row i − 1 of X (row 0 its own); "copy self" (T = X)
  and "first token" (every row is X's first) are the other presets, and "custom" the
  scenario's own grid T (``Scenario.target``), edited like any matrix.
- ``next-token``: final times a tied unembedding (each distinct token's first row of X,
  as GPT-2 ties its embeddings) gives logits over the scenario's own tokens; the mean
  cross-entropy against the next token at each position but the last. The unembedding
  is X, so X also gets gradient through it.
- ``cell``: final[i, j] itself: "what moves this number?".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from attnviz.core.maths.backward import Gradients, backward
from attnviz.core.maths.forward import compute
from attnviz.core.maths.results import Result
from attnviz.core.maths.scenario import (
    LOSS_TARGETS,
    LOSSES,
    Scenario,
    ScenarioError,
    Settings,
    previous_rows,
)

KINDS = LOSSES
TARGETS = LOSS_TARGETS


@dataclass(frozen=True)
class Loss:
    """Which loss: ``kind`` one of KINDS; for "target", ``target`` the name of a preset
    target (TARGETS) or T itself (n × d_model); for "cell", ``cell`` (row, column),
    0-based. A scenario's own loss is in its settings (``Loss.of``)."""

    kind: str = "target"
    target: str | np.ndarray = field(default="previous-token", compare=False)
    cell: tuple[int, int] = (0, 0)

    @staticmethod
    def of(st: Settings) -> Loss:
        """The loss the settings choose (loss, loss_target, loss_cell)."""
        return Loss(st.loss, st.loss_target, st.loss_cell)


def preset_target(X: np.ndarray, name: str = "previous-token") -> np.ndarray:
    """A target output made from X: previous-token, copy-self or first-token."""
    if name == "previous-token":
        return previous_rows(X)
    if name == "copy-self":
        return np.array(X, dtype=np.float64)
    if name == "first-token":
        return np.repeat(X[:1], len(X), axis=0)
    presets = [t for t in TARGETS if t != "custom"]
    raise ScenarioError(f"target {name!r}: expected one of {', '.join(presets)}")


def _target(s: Scenario, target: str | np.ndarray) -> np.ndarray:
    """T itself, the scenario's own grid ("custom"), or a preset made from its X."""
    if isinstance(target, np.ndarray):
        return target
    if target == "custom":
        if s.target is None:
            raise ScenarioError("target: the custom target needs its grid T")
        return np.asarray(s.target)
    return preset_target(np.asarray(s.X), str(target))


def vocabulary(tokens: Sequence[str]) -> tuple[list[str], list[int]]:
    """The distinct tokens in order of first appearance, and the row of X of each."""
    words: list[str] = []
    rows: list[int] = []
    for i, t in enumerate(tokens):
        if t not in words:
            words.append(t)
            rows.append(i)
    return words, rows


def loss_and_gradient(
    s: Scenario, r: Result, loss: Loss
) -> tuple[float, np.ndarray, np.ndarray | None]:
    """The loss, dL/dfinal, and the gradient it gives X directly (next-token's tied
    unembedding; None for the others)."""
    final = r.final
    if loss.kind == "target":
        T = _target(s, loss.target)
        if T.shape != final.shape:
            raise ScenarioError(f"target: {T.shape[0]}×{T.shape[1]}; expected the output's "
                                f"{final.shape[0]}×{final.shape[1]}")  # fmt: skip
        diff = final - T
        return 0.5 * float(np.sum(diff * diff)), diff, None
    if loss.kind == "cell":
        i, j = loss.cell
        if not (0 <= i < final.shape[0] and 0 <= j < final.shape[1]):
            raise ScenarioError(f"cell {i + 1},{j + 1}: the output is "
                                f"{final.shape[0]}×{final.shape[1]}")  # fmt: skip
        d = np.zeros_like(final)
        d[i, j] = 1.0
        return float(final[i, j]), d, None
    if loss.kind == "next-token":
        return _next_token(s, final)
    raise ScenarioError(f"loss {loss.kind!r}: expected one of {', '.join(KINDS)}")


def _next_token(s: Scenario, final: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
    if s.n < 2:
        raise ScenarioError("next-token: the scenario needs at least 2 tokens")
    words, rows = vocabulary(s.tokens)
    E = np.asarray(s.X)[rows]  # (v, d_model): the tied unembedding
    logits = final[:-1] @ E.T
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_p = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    answer = np.array([words.index(t) for t in s.tokens[1:]])
    count = s.n - 1
    value = -float(log_p[np.arange(count), answer].sum()) / count
    d_logits = np.exp(log_p)
    d_logits[np.arange(count), answer] -= 1.0
    d_logits /= count
    d_final = np.zeros_like(final)
    d_final[:-1] = d_logits @ E
    d_X = np.zeros_like(final)
    d_X[rows] = d_logits.T @ final[:-1]
    return value, d_final, d_X


def gradients(s: Scenario, loss: Loss | None = None, r: Result | None = None) -> Gradients:
    """The loss over s (its own, from its settings, unless given) and every gradient (r:
    s's forward pass, if already computed)."""
    loss = Loss.of(s.settings) if loss is None else loss
    r = compute(s) if r is None else r
    value, d_final, d_X = loss_and_gradient(s, r, loss)
    g = backward(s, r, d_final, value)
    if d_X is not None:
        X = np.array(g.inputs["X"])
        X += d_X
        X.flags.writeable = False
        g.inputs["X"] = X
    return g
