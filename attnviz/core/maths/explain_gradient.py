"""The chain rule behind one cell of a gradient view (dQ, dK, dV, dQ_rot, dK_rot, dscores,
dscaled, dmasked, dweights, doutput), with the real numbers.

``explain_gradient(scenario, result, gradients, name, head, row, col)`` writes the step
of the backward pass (``backward.py``) that made the cell, from the gradient one step
later and the forward pass's values, as ``explain.py``'s data (terms, steps, a note), so
that ``format_text`` and the Inspector show it as they show a value. The value is the
gradient's own cell, the number its heatmap shows. Indices are 0-based here; what people
read is 1-based, or token names.
"""

from __future__ import annotations

import math

import numpy as np

from attnviz.core.maths.backward import HEAD_GRADIENTS, Gradients, unroped
from attnviz.core.maths.explain import (
    Explanation,
    Step,
    Term,
    _bracketed,
    _notes,
    _num,
    _total,
    frequency_text,
)
from attnviz.core.maths.positions import positions, rope_width
from attnviz.core.maths.results import Result
from attnviz.core.maths.scenario import MINUS_INF_MASKS, Scenario
from attnviz.core.maths.variants import pair_frequencies

EXPLAINABLE_GRADIENTS = tuple(f"d{name}" for name in HEAD_GRADIENTS)


def _sum_of_products(
    labels: list[str], a: np.ndarray, b: np.ndarray
) -> tuple[tuple[Term, ...], float]:
    """One term a[k]·b[k] a label, and their sum."""
    terms = tuple(
        Term(label, (float(x), float(y)), float(x * y), f"{_num(x)} × {_num(y)}")
        for label, x, y in zip(labels, a, b, strict=True)
    )
    return terms, _total(terms)


class _GradientExplainer:
    """Holds one scenario, its result and its gradients; one method per gradient view."""

    def __init__(self, s: Scenario, r: Result, g: Gradients, head: int, row: int, col: int):
        self.s, self.r, self.g, self.h, self.i, self.j = s, r, g, head, row, col
        self.st = r.settings
        self.head, self.grad = r.heads[head], g.heads[head]
        self.tok, self.keys = r.tokens, r.keys
        self.kv = s.kv_head_of(head) if self.st.projections else 0

    def _value(self, name: str) -> float:
        return float(self.g.matrix(name, self.h)[self.i, self.j])

    def _turned_on(self) -> bool:
        return self.st.qk_norm != "none" or self.st.positional == "rope"

    # The mix: doutput, dweights, dV ----------------------------------------------------

    def output(self) -> Explanation:
        st, i, j, h, d_k = self.st, self.i, self.j, self.h, self.r.d_k
        column = h * d_k + j
        title = "doutput: dL/d head output"
        value = self._value("output")
        if not st.projections:
            formula = f"dout[i,j] = dfinal[i, {column + 1}] (projections off: no W_O)"
            steps = (Step(f"dfinal[{self.tok[i]},{column + 1}]", float(self.g.final[i, column])),)
            return Explanation(title, formula, (), steps, value, "concat is the final output")
        if h in st.ablated:
            note = f"head {h + 1} is ablated: its output reaches nothing, so its gradient is 0"
            return Explanation(title, "dout[i,j] = 0", (), (), value, note)
        d_final, W_O = self.g.final[i], self.s.W_O[column]
        labels = [f"dfinal[{self.tok[i]},{c + 1}]·W_O[{column + 1},{c + 1}]"
                  for c in range(len(d_final))]  # fmt: skip
        terms, total = _sum_of_products(labels, d_final, W_O)
        formula = "dconcat = dfinal W_Oᵀ: dout[i,j] = Σ_c dfinal[i,c] · W_O[h·d_k + j, c]"
        note = (
            f"head {h + 1}'s output is columns {h * d_k + 1}–{(h + 1) * d_k} of concat: "
            f"its column {j + 1} is concat's {column + 1}, which meets row {column + 1} of W_O"
        )
        return Explanation(title, formula, terms, (Step("sum", total),), value, note)

    def weights(self) -> Explanation:
        i, j = self.i, self.j
        tok, key = self.tok[i], self.keys[j]
        d_out, V = self.grad.output[i], self.head.V[j]
        labels = [f"dout[{tok},{c + 1}]·V[{key},{c + 1}]" for c in range(len(d_out))]
        terms, total = _sum_of_products(labels, d_out, V)
        return Explanation(
            "dweights: dL/d attention weight",
            "dweights = dout Vᵀ: dw[i,j] = Σ_c dout[i,c] · V[j,c]",
            terms,
            (Step("sum", total),),
            self._value("weights"),
            f"weight w[{tok},{key}] multiplies V's row {key} into {tok}'s output",
        )

    def V(self) -> Explanation:
        i, j = self.i, self.j
        key = self.keys[i]
        w, d_out = self.head.weights[:, i], self.grad.output[:, j]
        labels = [f"w[{t},{key}]·dout[{t},{j + 1}]" for t in self.tok]
        terms, total = _sum_of_products(labels, w, d_out)
        note = _notes(
            f"every query that gave {key} weight passes back its output's gradient",
            self._share_note(),
        )
        return Explanation(
            "dV: dL/d value",
            "dV = wᵀ dout: dV[j,c] = Σ_i w[i,j] · dout[i,c]",
            terms,
            (Step("sum", total),),
            self._value("V"),
            note,
        )

    # The softmax and the mask: dmasked, dscaled ----------------------------------------

    def _softmax(self) -> np.ndarray:
        """Row i of P, the softmax before drop-after-softmax and dropout."""
        head, i = self.head, self.i
        if self.st.mask != "drop-after-softmax" and self.st.dropout == 0:
            return np.asarray(head.weights[i])
        if head.empty_rows[i]:
            return np.zeros(head.weights.shape[1])
        masked = head.made_stages().masked[i]
        return np.asarray(np.exp(masked - head.m[i]) / head.Z[i])

    def _dP(self) -> tuple[np.ndarray, str]:
        """Row i of dP (dweights, through drop-after-softmax and dropout), and a note."""
        st, head, i = self.st, self.head, self.i
        dP = np.array(self.grad.weights[i])
        notes = []
        if st.mask == "drop-after-softmax":
            dP[self.r.future[i]] = 0.0
            notes.append("drop-after-softmax: dP is 0 on the dropped future keys")
        if head.keep is not None:
            dP *= head.keep[i] / (1.0 - st.dropout)
            notes.append(f"dropout: dP = dweights × keep / (1 − {_num(st.dropout)})")
        if not notes:
            notes.append("dP = dweights: the weights are the softmax P")
        return dP, _notes(*notes)

    def masked(self) -> Explanation:
        j, tok, keys = self.j, self.tok[self.i], self.keys
        P, (dP, note) = self._softmax(), self._dP()
        labels = [f"P[{tok},{k}]·dP[{tok},{k}]" for k in keys]
        terms, total = _sum_of_products(labels, P, dP)
        diff = float(dP[j]) - total
        steps = (
            Step(f"Σₖ P[{tok},k]·dP[{tok},k]", total),
            Step(f"dP[{tok},{keys[j]}]", float(dP[j])),
            Step(f"dP[{tok},{keys[j]}] − Σ", diff),
            Step(f"P[{tok},{keys[j]}]", float(P[j])),
            Step(f"P[{tok},{keys[j]}] · (dP[{tok},{keys[j]}] − Σ)", float(P[j]) * diff),
        )
        if self.st.sinks is not None:
            note = _notes(note, "the sink has no value row: its dP is 0, it adds no term")
        return Explanation(
            "dmasked: dL/d masked score (the softmax)",
            "dS[i,j] = P[i,j] · (dP[i,j] − Σₖ P[i,k] · dP[i,k])",
            terms,
            steps,
            self._value("masked"),
            note,
        )

    def _hidden(self) -> str:
        """Why no gradient reaches this scaled score, or "" when it does."""
        st = self.st
        if not self.r.future[self.i, self.j]:
            return ""
        key, tok = self.keys[self.j], self.tok[self.i]
        if st.mask in MINUS_INF_MASKS:
            return (
                f"{key} is hidden from {tok}: the mask wrote −∞ here, a constant, so no "
                "gradient reaches the scaled score (and its weight, and so dmasked, is 0)"
            )
        if st.mask == "causal-zero":
            return (
                f"{key} is hidden from {tok}: the mask wrote 0 here, a constant, so no "
                "gradient reaches the scaled score, though dmasked is not 0 (the future "
                "key still has weight: the leak)"
            )
        return ""

    def scaled(self) -> Explanation:
        title = "dscaled: dL/d scaled score"
        why = self._hidden()
        dmasked = float(self.grad.masked[self.i, self.j])
        if why:
            steps = (Step("dmasked[i,j], which stops at the mask", dmasked),)
            formula = "dscaled[i,j] = 0 on a hidden key"
            return Explanation(title, formula, (), steps, self._value("scaled"), why)
        e = self.masked()
        formula = f"dscaled[i,j] = dmasked[i,j] (not masked); {e.formula}"
        return Explanation(title, formula, e.terms, e.steps, self._value("scaled"), e.note)

    # The scores: dscores ------------------------------------------------------------

    def _scale(self) -> tuple[float, str]:
        st = self.st
        if not st.scale:
            return 1.0, "σ = 1 (scaling off)"
        if st.scale_value is not None:
            return st.scale_value, "σ = scale_value"
        return 1.0 / math.sqrt(self.r.d_k), f"σ = 1/√d_k = 1/√{self.r.d_k}"

    def scores(self) -> Explanation:
        st, i, j = self.st, self.i, self.j
        d_scaled = float(self.grad.scaled[i, j])
        sigma, which = self._scale()
        steps = [Step("dscaled[i,j]", d_scaled), Step(which, sigma)]
        formula = "dscores[i,j] = dscaled[i,j] · σ"
        product = d_scaled * sigma
        notes = []
        if st.softcap is not None:
            c = st.softcap
            x = float(self.head.made_stages().scores[i, j]) * sigma
            t = math.tanh(x / c)
            slope = 1.0 - t * t
            product *= slope
            formula += " · (1 − tanh²(σ·S[i,j] / c))"
            steps += [
                Step("σ·S[i,j]", x),
                Step(f"tanh(σ·S ÷ {_num(c)})", t),
                Step("1 − tanh² (the soft-cap's slope)", slope),
            ]
            notes.append(f"the soft-cap c·tanh(x/c), c = {_num(c)}, passes 1 − tanh² of it")
        if st.positional == "alibi":
            notes.append("ALiBi adds a constant: it passes the gradient unchanged")
        if st.positional == "relative-bias":
            notes.append(
                "T5's relative bias adds a term that is not a function of the score: it "
                "passes the gradient unchanged, and dscaled[i,j] joins drelative_bias of "
                "this cell's bucket (the sum over the cells of that bucket)"
            )
        steps.append(Step("dscores[i,j]", product))
        return Explanation(
            "dscores: dL/d raw score", formula, (), tuple(steps), self._value("scores"),
            _notes(*notes),
        )  # fmt: skip

    # Q and K as the scores see them: dQ_rot, dK_rot ------------------------------------

    def _plain_note(self) -> str:
        return "" if self._turned_on() else "no QK-norm and no RoPE: Q_rot is Q, K_rot is K"

    def _share_note(self) -> str:
        """A key/value head shared by query heads (GQA): whose share this is."""
        if self.s.kv_heads == self.s.n_heads or not self.st.projections:
            return ""
        return f"query head {self.h + 1}'s share: key/value head {self.kv + 1} sums its group's"

    def _turned_names(self) -> tuple[str, str]:
        return ("Q_rot", "K_rot") if self._turned_on() else ("Q", "K")

    def Q_rot(self) -> Explanation:
        i, j, tok = self.i, self.j, self.tok[self.i]
        d_scores, K = self.grad.scores[i], self.head.K_rot[:, j]
        q, k = self._turned_names()
        labels = [f"dscores[{tok},{key}]·{k}[{key},{j + 1}]" for key in self.keys]
        terms, total = _sum_of_products(labels, d_scores, K)
        note = self._plain_note()
        return Explanation(
            "dQ_rot: dL/d Q as the scores see it",
            f"d{q} = dscores {k}: d{q}[i,j] = Σ_k dscores[i,k] · {k}[k,j] (k: the keys)",
            terms,
            (Step("sum", total),),
            self._value("Q_rot"),
            note,
        )

    def K_rot(self) -> Explanation:
        i, j, key = self.i, self.j, self.keys[self.i]
        d_scores, Q = self.grad.scores[:, i], self.head.Q_rot[:, j]
        q, k = self._turned_names()
        labels = [f"dscores[{t},{key}]·{q}[{t},{j + 1}]" for t in self.tok]
        terms, total = _sum_of_products(labels, d_scores, Q)
        note = _notes(self._plain_note(), self._share_note())
        return Explanation(
            "dK_rot: dL/d K as the scores see it",
            f"d{k} = dscoresᵀ {q}: d{k}[j,c] = Σ_i dscores[i,j] · {q}[i,c] (i: the queries)",
            terms,
            (Step("sum", total),),
            self._value("K_rot"),
            note,
        )

    # Q and K: dQ, dK, back through RoPE and the RMS norm -------------------------------

    def Q(self) -> Explanation:
        return self._unturned("Q")

    def K(self) -> Explanation:
        return self._unturned("K")

    def _unturned(self, name: str) -> Explanation:
        title = f"d{name}: dL/d {name}"
        rot = f"{name}_rot"
        if not self._turned_on():
            e = self.Q_rot() if name == "Q" else self.K_rot()
            share = self._share_note() if name == "K" else ""
            note = _notes(f"no QK-norm and no RoPE: d{name} is d{rot} (Q_rot is Q, K_rot is K)",
                          share)  # fmt: skip
            return Explanation(title, e.formula, e.terms, e.steps, self._value(name), note)
        d_turned = np.asarray(getattr(self.grad, rot)[self.i])
        back, terms, steps, formulas, notes = self._turn_back(name, d_turned)
        if self.st.qk_norm != "none":
            norm_back = self._whole_back if self.st.qk_norm == "rms-whole" else self._norm_back
            more, norm_steps, formula, note = norm_back(name, back)
            terms, steps = terms + more, steps + norm_steps
            formulas.append(formula)
            notes.append(note)
        else:
            notes.append(f"no QK-norm: d{name} is back, d{rot} turned back")
        return Explanation(
            title, "; ".join(formulas), terms, tuple(steps), self._value(name), _notes(*notes)
        )

    def _pairs(self, dims: int) -> list[tuple[int, int]]:
        """RoPE's pairs (first, second) of features."""
        if self.st.rope_style == "half":
            return [(k, k + dims // 2) for k in range(dims // 2)]
        return [(2 * k, 2 * k + 1) for k in range(dims // 2)]

    def _turn_back(
        self, name: str, d: np.ndarray
    ) -> tuple[np.ndarray, tuple[Term, ...], list[Step], list[str], list[str]]:
        """d (a row of dQ_rot or dK_rot) turned back by RoPE's angle: the whole row, and
        the terms, steps, formulas and notes of feature j."""
        st, i, j = self.st, self.i, self.j
        label = (self.keys if name == "K" else self.tok)[i]
        width = d.shape[0]
        dims = min(rope_width(st, width), width - width % 2) if st.positional == "rope" else 0
        if not dims:
            return d, (), [], [], ["no RoPE: nothing to turn back"]
        qpos, kpos = positions(self.s)
        pos = int((kpos if name == "K" else qpos)[i])
        back = np.array(d)
        freqs = pair_frequencies(dims, st.rope_base, st.rope_frequencies)
        f = st.rope_factor
        for k, (a, b) in enumerate(self._pairs(dims)):  # the transposed rotation
            c, s = math.cos(pos * freqs[k]) * f, math.sin(pos * freqs[k]) * f
            back[a], back[b] = d[a] * c + d[b] * s, -d[a] * s + d[b] * c
        notes = [f"RoPE turned back by −θ at position {pos + 1} of {label} (the turn's "
                 "transpose)"]  # fmt: skip
        formulas: list[str] = []
        pair = next(((k, a, b) for k, (a, b) in enumerate(self._pairs(dims)) if j in (a, b)), None)
        if pair is None:
            notes[0] = f"RoPE turns the first {dims} features only: feature {j + 1} is not turned"
            return back, (), [], formulas, notes
        k, a, b = pair
        theta = pos * float(freqs[k])
        c, s = math.cos(theta) * f, math.sin(theta) * f
        A, B = f"d{name}_rot[{label},{a + 1}]", f"d{name}_rot[{label},{b + 1}]"
        da, db = float(d[a]), float(d[b])
        if j == a:
            terms = (Term(f"{A}·cos θ", (da, c), da * c, f"{_num(da)} × {_num(c)}"),
                     Term(f"{B}·sin θ", (db, s), db * s, f"{_num(db)} × {_num(s)}"))  # fmt: skip
            formulas.append(f"back[i,a] = d{name}_rot[i,a]·cos θ + d{name}_rot[i,b]·sin θ")
        else:
            terms = (Term(f"−{A}·sin θ", (-da, s), -da * s, f"−{_bracketed(da)} × {_num(s)}"),
                     Term(f"{B}·cos θ", (db, c), db * c, f"{_num(db)} × {_num(c)}"))  # fmt: skip
            formulas.append(f"back[i,b] = −d{name}_rot[i,a]·sin θ + d{name}_rot[i,b]·cos θ")
        formulas.append(f"a = {a + 1}, b = {b + 1}, θ = (position − 1) · "
                        f"{frequency_text(st, k, dims)}")  # fmt: skip
        if f != 1.0:
            formulas.append(f"cos θ and sin θ times RoPE's factor {_num(f)}")
        steps = [Step("θ", theta), Step(f"back[{label},{j + 1}]", _total(terms))]
        return back, terms, steps, formulas, notes

    def _norm_back(
        self, name: str, back: np.ndarray
    ) -> tuple[tuple[Term, ...], list[Step], str, str]:
        """Through the RMS norm: A/r·w back to A, for feature j."""
        st, i, j = self.st, self.i, self.j
        A = np.asarray(getattr(self.head, name)[i])
        label = (self.keys if name == "K" else self.tok)[i]
        wname = "k_norm" if name == "K" else "q_norm"
        u, steps = back, []
        if st.projections:
            weight = getattr(self.s, wname)[self.kv if name == "K" else self.h, 0]
            u = back * weight
            steps.append(
                Step(f"u[{j + 1}] = back[{label},{j + 1}] × {wname}[{j + 1}]", float(u[j]))
            )
        d = A.shape[0]
        labels = [f"u[{k + 1}]·{name}[{label},{k + 1}]" for k in range(d)]
        terms, total = _sum_of_products(labels, u, A)
        rms = math.sqrt(float(np.mean(A * A)) + st.qk_norm_eps)
        mean = total / d
        first, second = float(u[j]) / rms, float(A[j]) * mean / rms**3
        steps += [
            Step(f"r = √(mean_k {name}[{label},k]² + ε)", rms),
            Step(f"u[{j + 1}] ÷ r", first),
            Step(f"m = Σ_k u[k]·{name}[{label},k] ÷ {d}", mean),
            Step(f"{name}[{label},{j + 1}] · m ÷ r³", second),
            Step(f"u[{j + 1}] ÷ r − {name}[{label},{j + 1}] · m ÷ r³", first - second),
        ]
        times = f"{wname} ⊙ " if st.projections else ""
        formula = (
            f"d{name}[i,j] = u[j] / r − {name}[i,j] · m / r³; m = Σ_k u[k] · {name}[i,k] / d; "
            f"u = {times}back[i]; r = √(mean_k {name}[i,k]² + ε)"
        )
        return terms, steps, formula, "through the RMS norm: its Jacobian, row by row"

    def _whole_back(
        self, name: str, back: np.ndarray
    ) -> tuple[tuple[Term, ...], list[Step], str, str]:
        """Through the whole-projection RMS norm ("rms-whole"): r and the coupling m are
        over every head's features of the token (backward._whole_back), for feature j."""
        st, s, i, j = self.st, self.s, self.i, self.j
        kv = name == "K"
        count = len(self.r.heads)
        of = (
            [s.kv_head_of(h) if st.projections else 0 for h in range(count)]
            if kv
            else list(range(count))
        )
        rows = {of[h]: np.asarray(getattr(self.r.heads[h], name)[i]) for h in range(count)}
        A_all = np.concatenate([rows[g] for g in sorted(rows)])
        wname = "k_norm" if kv else "q_norm"
        weights = np.asarray(getattr(s, wname)) if st.projections else None
        pos = positions(s)[1 if kv else 0][i : i + 1]
        label = (self.keys if kv else self.tok)[i]
        us, As, labels = [], [], []
        for h in range(count):
            turned = np.asarray(getattr(self.g.heads[h], f"{name}_rot"))[i : i + 1]
            b = unroped(st, turned, pos)[0]
            us.append(b if weights is None else b * weights[of[h], 0])
            As.append(rows[of[h]])
            labels += [
                f"u{h + 1}[{k + 1}]·{name}{of[h] + 1}[{label},{k + 1}]" for k in range(len(b))
            ]
        terms, total = _sum_of_products(labels, np.concatenate(us), np.concatenate(As))
        width = len(A_all)
        rms = math.sqrt(float(np.mean(A_all * A_all)) + st.qk_norm_eps)
        share = of.count(of[self.h])
        mean = total / width / share
        u, A = us[self.h], rows[of[self.h]]
        first, second = float(u[j]) / rms, float(A[j]) * mean / rms**3
        steps = [
            Step(f"u[{j + 1}] = back[{label},{j + 1}]" + (f" × {wname}[{j + 1}]" * st.projections),
                 float(u[j])),
            Step(f"r = √(mean over all {width} features of {name}[{label}]² + ε)", rms),
            Step(f"u[{j + 1}] ÷ r", first),
            Step(f"m = Σ_heads Σ_k u·{name} ÷ {width}" + (f" ÷ {share}" if share > 1 else ""),
                 mean),
            Step(f"{name}[{label},{j + 1}] · m ÷ r³", second),
            Step(f"u[{j + 1}] ÷ r − {name}[{label},{j + 1}] · m ÷ r³", first - second),
        ]  # fmt: skip
        formula = (
            f"d{name}[i,j] = u[j] / r − {name}[i,j] · m / r³; m = Σ over every head's u ⊙ "
            f"{name} of row i / (heads·d_k); r = √(mean of row i's {name}² over all heads + ε)"
        )
        note = "through the whole-projection RMS norm: every head's features of the row meet"
        if share > 1:
            note += f"; m split evenly among the {share} query heads sharing this head"
        return terms, steps, formula, note


def explain_gradient(
    s: Scenario, r: Result, g: Gradients, name: str, head: int, row: int, col: int
) -> Explanation:
    """The chain rule of cell (row, col) of gradient view name ("dmasked", …) of head
    (0-based)."""
    if name not in EXPLAINABLE_GRADIENTS:
        raise KeyError(f"gradient {name!r}: expected one of {', '.join(EXPLAINABLE_GRADIENTS)}")
    matrix = g.matrix(name[1:], head)
    if not (0 <= row < matrix.shape[0] and 0 <= col < matrix.shape[1]):
        raise KeyError(
            f"{name}: cell ({row + 1}, {col + 1}) is outside its "
            f"{matrix.shape[0]}×{matrix.shape[1]}"
        )
    explanation: Explanation = getattr(_GradientExplainer(s, r, g, head, row, col), name[1:])()
    return explanation
