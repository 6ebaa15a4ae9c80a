"""The worked arithmetic behind one cell of any intermediate, with the real numbers.

``explain(scenario, result, name, head, row, col)`` recomputes the cell from its inputs
(the products and their sum, the division by √d_k, the exponentials and their quotient,
...) and returns the pieces as data; ``format_text`` renders them for a terminal.
Indices here are 0-based; labels shown to people are 1-based or token names.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from attnviz.core.maths.engine import HEAD_MATRICES, LAYER_MATRICES, Result, sinusoidal
from attnviz.core.maths.scenario import Scenario

EXPLAINABLE = HEAD_MATRICES + LAYER_MATRICES


@dataclass(frozen=True)
class Term:
    """One summand: what it is, its inputs, the arithmetic written out, and its value."""

    label: str
    factors: tuple[float, ...]
    value: float
    expression: str = ""


@dataclass(frozen=True)
class Step:
    """A named intermediate quantity on the way to the cell's value."""

    label: str
    value: float


@dataclass(frozen=True)
class Explanation:
    title: str
    formula: str
    terms: tuple[Term, ...]
    steps: tuple[Step, ...]
    value: float
    note: str = ""


def _num(x: float) -> str:
    return "−∞" if x == -math.inf else f"{x:.6g}"


def _products(left: str, a: np.ndarray, right: str, b: np.ndarray) -> tuple[Term, ...]:
    return tuple(
        Term(
            f"{left}[{k + 1}]·{right}[{k + 1}]",
            (float(x), float(y)),
            float(x * y),
            f"{_num(x)} × {_num(y)}",
        )
        for k, (x, y) in enumerate(zip(a, b, strict=True))
    )


def _total(terms: tuple[Term, ...]) -> float:
    return math.fsum(t.value for t in terms)


class _Explainer:
    """Holds one scenario and result; one method per kind of cell."""

    def __init__(self, s: Scenario, r: Result, head: int | None, row: int, col: int):
        # head is given for the per-head matrices, the only ones that read self.h
        self.s, self.r, self.h, self.i, self.j = s, r, head or 0, row, col
        self.tok = r.tokens

    def X(self) -> Explanation:
        i, j = self.i, self.j
        raw = float(self.s.X[i, j])
        if self.r.settings.positional == "none":
            return Explanation("input X", "X[i,j] is typed in", (), (), raw, "an input value")
        pe = float(sinusoidal(self.s.n, self.s.d_model)[i, j])
        fn = "sin" if j % 2 == 0 else "cos"
        terms = (Term("typed X[i,j]", (raw,), raw), Term(f"PE[{i + 1},{j + 1}]", (pe,), pe))
        formula = f"X[i,j] + PE[i,j], PE = {fn}({i} / 10000^({2 * (j // 2)}/{self.s.d_model}))"
        return Explanation("input X with position", formula, terms, (), _total(terms))

    def _projection(self, name: str) -> Explanation:
        i, j = self.i, self.j
        if not self.r.settings.projections:
            value = float(self.r.X[i, j])
            return Explanation(
                name, f"{name} = X", (), (), value, f"projections off: {name} is X itself"
            )
        W = getattr(self.s, f"W_{name}")[self.h]
        terms = _products(f"X[{self.tok[i]}]", self.r.X[i], f"W_{name}[:,{j + 1}]", W[:, j])
        formula = f"{name}[i,j] = Σ_k X[i,k] · W_{name}[k,j]"
        total = _total(terms)
        return Explanation(name, formula, terms, (Step("sum", total),), total)

    def Q(self) -> Explanation:
        return self._projection("Q")

    def K(self) -> Explanation:
        return self._projection("K")

    def V(self) -> Explanation:
        return self._projection("V")

    def _dot(self) -> tuple[Term, ...]:
        h, i, j = self.h, self.i, self.j
        return _products(
            f"Q[{self.tok[i]}]", self.r.heads[h].Q[i], f"K[{self.tok[j]}]", self.r.heads[h].K[j]
        )

    def scores(self) -> Explanation:
        terms = self._dot()
        total = _total(terms)
        return Explanation(
            "raw score", "S[i,j] = Σ_k Q[i,k] · K[j,k]", terms, (Step("sum", total),), total
        )

    def scaled(self) -> Explanation:
        terms = self._dot()
        total = _total(terms)
        if not self.r.settings.scale:
            return Explanation(
                "scaled score",
                "S[i,j] (scaling off)",
                terms,
                (Step("sum", total),),
                total,
                "scaling is off: the raw score is used as it is",
            )
        root = math.sqrt(self.r.d_k)
        steps = (
            Step("sum", total),
            Step(f"√d_k = √{self.r.d_k}", root),
            Step("sum ÷ √d_k", total / root),
        )
        formula = "S[i,j] / √d_k = (Σ_k Q[i,k] · K[j,k]) / √d_k"
        return Explanation("scaled score", formula, terms, steps, total / root)

    def masked(self) -> Explanation:
        mask, future = self.r.settings.mask, bool(self.r.future[self.i, self.j])
        if future and mask == "causal":
            return Explanation(
                "masked score",
                "−∞ where key j comes after query i",
                (),
                (),
                -math.inf,
                f"{self.tok[self.j]} comes after {self.tok[self.i]}: set to −∞, so its weight is 0",
            )
        if future and mask == "sliding-window":
            w = self.r.settings.window
            where = "comes after" if self.j > self.i else f"is more than {w - 1} before"
            return Explanation(
                "masked score",
                f"−∞ unless i − {w} < j ≤ i (a window of {w} keys)",
                (),
                (),
                -math.inf,
                f"{self.tok[self.j]} {where} {self.tok[self.i]}: outside the window, set to −∞, "
                "so its weight is 0",
            )
        if future and mask == "causal-zero":
            return Explanation(
                "masked score",
                "0 where key j comes after query i",
                (),
                (),
                0.0,
                "set to 0, not −∞: e⁰ = 1, so this future key still gets weight (the leak)",
            )
        e = self.scaled()
        return Explanation("masked score", e.formula, e.terms, e.steps, e.value, "not masked")

    def weights(self) -> Explanation:
        h, i, j, r = self.h, self.i, self.j, self.r
        row = r.heads[h].masked[i]
        title = "attention weight"
        if r.heads[h].empty_rows[i]:
            return Explanation(
                title, "no key is visible", (), (), 0.0, "every score is −∞: weight 0"
            )
        m = float(row.max())
        terms = tuple(
            Term(
                f"exp(s[{self.tok[k]}] − m)",
                (float(s),),
                math.exp(s - m),
                f"exp({_num(s)} − {_num(m)})",
            )
            for k, s in enumerate(row)
        )
        Z = _total(terms)
        quotient = terms[j].value / Z
        steps = [Step("row max m", m), Step("Σ exp", Z), Step("exp(s[i,j] − m) ÷ Σ", quotient)]
        value, note = quotient, ""
        if r.settings.mask == "drop-after-softmax" and r.future[i, j]:
            value, note = 0.0, "future key: zeroed after softmax, and the row is not renormalised"
            steps.append(Step("dropped after softmax", value))
        keep = r.heads[h].keep
        if keep is not None:
            p = r.settings.dropout
            value = value / (1 - p) if keep[i, j] else 0.0
            steps.append(
                Step("dropout: kept, × 1/(1−p)" if keep[i, j] else "dropout: dropped", value)
            )
        formula = "w[i,j] = exp(s[i,j] − m) / Σ_k exp(s[i,k] − m), m = max_k s[i,k]"
        return Explanation(title, formula, terms, tuple(steps), value, note)

    def output(self) -> Explanation:
        h, i, j = self.h, self.i, self.j
        terms = tuple(
            Term(
                f"w[{self.tok[i]},{self.tok[k]}]·V[{self.tok[k]},{j + 1}]",
                (float(w), float(v)),
                float(w * v),
                f"{_num(w)} × {_num(v)}",
            )
            for k, (w, v) in enumerate(
                zip(self.r.heads[h].weights[i], self.r.heads[h].V[:, j], strict=True)
            )
        )
        total = _total(terms)
        return Explanation(
            "head output", "out[i,j] = Σ_k w[i,k] · V[k,j]", terms, (Step("sum", total),), total
        )

    def concat(self) -> Explanation:
        d_k = self.r.d_k
        head, col = divmod(self.j, d_k)
        value = float(self.r.heads[head].output[self.i, col])
        return Explanation(
            "concatenated heads",
            f"concat[i, h·d_k + c] = head h output[i, c]; d_k = {d_k}",
            (),
            (Step(f"head {head + 1} output[{self.tok[self.i]}, {col + 1}]", value),),
            value,
            f"columns {head * d_k + 1}–{(head + 1) * d_k} hold head {head + 1}",
        )

    def final(self) -> Explanation:
        i, j, r = self.i, self.j, self.r
        if not r.settings.projections:
            value = float(r.final[i, j])
            return Explanation(
                "final output", "output = head output (projections off: no W_O)", (), (), value
            )
        d_k, W_O = r.d_k, self.s.W_O
        terms = []
        for head in range(r.n_heads):
            block = slice(head * d_k, (head + 1) * d_k)
            a, b = r.concat[i, block], W_O[block, j]
            label = (
                f"head {head + 1}: concat[{self.tok[i]}, {block.start + 1}–{block.stop}]"
                f" · W_O[{block.start + 1}–{block.stop}, {j + 1}]"
            )
            if head in r.settings.ablated:
                terms.append(Term(f"{label} (ablated)", (), 0.0, "switched off"))
                continue
            products = " + ".join(f"{_num(x)}×{_num(y)}" for x, y in zip(a, b, strict=True))
            terms.append(Term(label, tuple(float(x) for x in a * b), math.fsum(a * b), products))
        terms_t = tuple(terms)
        total = _total(terms_t)
        formula = "out[i,j] = Σ_h Σ_c concat[i, h·d_k + c] · W_O[h·d_k + c, j]"
        return Explanation(
            "final output", formula, terms_t, (Step("sum over heads", total),), total
        )


def explain(s: Scenario, r: Result, name: str, head: int | None, row: int, col: int) -> Explanation:
    """The worked arithmetic of cell (row, col) of intermediate name (head is 0-based)."""
    if name not in EXPLAINABLE:
        raise KeyError(f"matrix {name!r}: expected one of {', '.join(EXPLAINABLE)}")
    matrix = r.matrix(name, head)
    if not (0 <= row < matrix.shape[0] and 0 <= col < matrix.shape[1]):
        raise KeyError(
            f"{name}: cell ({row + 1}, {col + 1}) is outside its "
            f"{matrix.shape[0]}×{matrix.shape[1]}"
        )
    explanation: Explanation = getattr(_Explainer(s, r, head, row, col), name)()
    return explanation


def format_text(e: Explanation) -> str:
    """The explanation as lines of text: formula, terms, steps, value."""
    lines = [e.title, f"  {e.formula}"]
    for t in e.terms:
        middle = f" = {t.expression}" if t.expression else ""
        lines.append(f"    {t.label}{middle} = {_num(t.value)}")
    lines += [f"  {s.label} = {_num(s.value)}" for s in e.steps]
    if e.note:
        lines.append(f"  ({e.note})")
    lines.append(f"  value = {_num(e.value)}")
    return "\n".join(lines)
