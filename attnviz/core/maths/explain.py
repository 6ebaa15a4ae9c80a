"""The worked arithmetic behind one cell of any intermediate, with the real numbers.

``explain(scenario, result, name, head, row, col)`` recomputes the cell from its inputs
(the products and their sum, the division by √d_k, the exponentials and their quotient,
...) and returns the pieces as data; ``format_text`` renders them for a terminal. What
current models add shows its own arithmetic: the biases, the key/value head a query head
reads, K and V from X_kv, QK-norm and RoPE (``Q_rot``, ``K_rot``), scale_value, the
soft-cap, ALiBi, the sliding-window and custom masks and the causal alignment, the sink.
Indices here are 0-based; what people read is 1-based (rows, columns, features, heads and
positions) or token names.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from attnviz.core.maths.positions import positions, rope_width, sinusoidal
from attnviz.core.maths.results import HEAD_MATRICES, LAYER_MATRICES, TURNED_MATRICES, Result
from attnviz.core.maths.scenario import Scenario, Settings
from attnviz.core.maths.variants import (
    alibi_slopes,
    pair_frequencies,
    relative_bucket,
    relative_exact,
    tanh,
)

EXPLAINABLE = HEAD_MATRICES + TURNED_MATRICES + LAYER_MATRICES


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


def frequency_text(st: Settings, k: int, dims: int) -> str:
    """RoPE pair k's frequency as a formula: the base's power, or the model's number."""
    if st.rope_frequencies is None:
        return f"{_num(st.rope_base)}^(−{2 * k}/{dims})"
    return f"{_num(st.rope_frequencies[k])} (the model's, pair {k + 1})"


def _bracketed(x: float) -> str:
    """A number to follow a minus sign or precede a power: in brackets when negative."""
    return f"({_num(x)})" if x < 0 else _num(x)


def _total(terms: tuple[Term, ...]) -> float:
    return math.fsum(t.value for t in terms)


def _notes(*notes: str) -> str:
    return "; ".join(n for n in notes if n)


class _Explainer:
    """Holds one scenario and result; one method per kind of cell."""

    def __init__(self, s: Scenario, r: Result, head: int | None, row: int, col: int):
        # head is given for the per-head matrices, the only ones that read self.h
        self.s, self.r, self.h, self.i, self.j = s, r, head or 0, row, col
        self.st = r.settings
        self.tok, self.keys = r.tokens, r.keys
        self.g = s.kv_head_of(self.h) if self.st.projections else 0  # its key/value head

    def X(self) -> Explanation:
        i, j = self.i, self.j
        raw = float(self.s.X[i, j])
        if self.st.positional != "sinusoidal":
            return Explanation("input X", "X[i,j] is typed in", (), (), raw, "an input value")
        pe = float(sinusoidal(self.s.n, self.s.d_model, [i])[0, j])
        fn = "sin" if j % 2 == 0 else "cos"
        terms = (Term("typed X[i,j]", (raw,), raw), Term(f"PE[{i + 1},{j + 1}]", (pe,), pe))
        angle = f"({i + 1} − 1) / 10000^({2 * (j // 2)}/{self.s.d_model})"  # position 1: angle 0
        formula = f"X[i,j] + PE[i,j], PE = {fn}({angle})"
        return Explanation("input X with position", formula, terms, (), _total(terms))

    # Projections: Q, K, V ------------------------------------------------------------

    def _kv_note(self) -> str:
        """Which key/value head this query head reads, when heads share them (GQA, MQA)."""
        s = self.s
        if not self.st.projections or s.kv_heads == s.n_heads:
            return ""
        group = [h + 1 for h in range(s.n_heads) if s.kv_head_of(h) == self.g]
        return (
            f"query head {self.h + 1} reads key/value head {self.g + 1} (of {s.kv_heads}), "
            f"which query heads {group[0]}–{group[-1]} share"
        )

    def _source(self, kv: bool) -> tuple[str, np.ndarray, tuple[str, ...], str]:
        """The input rows of Q (kv False) or of K and V: name, rows, labels, and a note
        naming X_kv's row under cross-attention."""
        if kv and self.r.X_kv is not None:
            where = f"row {self.i + 1} of X_kv ({self.keys[self.i]})"
            return (
                "X_kv",
                self.r.X_kv,
                self.keys,
                f"cross-attention: keys and values come from {where}",
            )
        return "X", self.r.X, self.tok, ""

    def _projection(self, name: str) -> Explanation:
        i, j, s = self.i, self.j, self.s
        kv = name != "Q"
        src, rows, labels, cross = self._source(kv)
        if not self.st.projections:
            value = float(rows[i, j])
            note = _notes(f"projections off: {name} is {src} itself", cross)
            return Explanation(name, f"{name} = {src}", (), (), value, note)
        head = self.g if kv else self.h
        W = s.matrix(f"W_{name}", head)
        terms = _products(f"{src}[{labels[i]}]", rows[i], f"W_{name}[:,{j + 1}]", W[:, j])
        formula = f"{name}[i,j] = Σ_k {src}[i,k] · W_{name}[k,j]"
        biases = getattr(s, f"b_{name}")
        if biases.any():
            b = float(biases[head, 0, j])
            terms += (Term(f"b_{name}[{j + 1}] (bias)", (b,), b),)
            formula += f" + b_{name}[j]"
        total = _total(terms)
        note = _notes(self._kv_note() if kv else "", cross)
        return Explanation(name, formula, terms, (Step("sum", total),), total, note)

    def Q(self) -> Explanation:
        return self._projection("Q")

    def K(self) -> Explanation:
        return self._projection("K")

    def V(self) -> Explanation:
        return self._projection("V")

    # Q and K as the scores see them: QK-norm, then RoPE --------------------------------

    def _turned_on(self) -> bool:
        return self.st.qk_norm != "none" or self.st.positional == "rope"

    def _norm(
        self, name: str, A: np.ndarray, label: str, features: list[int], i: int
    ) -> tuple[tuple[Term, ...], list[Step], dict[int, float], str]:
        """RMS-normalise row A (Q or K of token i) at the given features: the squares,
        the steps, the normalised values by feature, and the formula. Under "rms-whole"
        the mean square is over every head's features of the token."""
        st = self.st
        whole = st.qk_norm == "rms-whole"
        rows = self._whole_row(name, i) if whole else [("", A)]
        squares = tuple(
            Term(
                f"{name}{tag}[{label},{k + 1}]²",
                (float(a), float(a)),
                float(a * a),
                f"{_bracketed(a)}²",
            )
            for tag, row in rows
            for k, a in enumerate(row)
        )
        d = len(squares)
        total = _total(squares)
        mean = total / d
        rms = math.sqrt(mean + st.qk_norm_eps)
        over = f"Σ over every head's {name}[{label}]²" if whole else f"Σ_k {name}[{label},k]²"
        steps = [
            Step(over, total),
            Step(f"mean = Σ ÷ {d}", mean),
            Step(f"RMS = √(mean + ε), ε = {_num(st.qk_norm_eps)}", rms),
        ]
        wname = "k_norm" if name == "K" else "q_norm"
        weight = None
        if st.projections:
            weight = getattr(self.s, wname)[self.g if name == "K" else self.h, 0]
        normed = {}
        for f in features:
            value = float(A[f] / rms)
            steps.append(Step(f"{name}[{label},{f + 1}] ÷ RMS", value))
            if weight is not None:
                value = value * float(weight[f])
                steps.append(Step(f"× {wname}[{f + 1}] = {_num(weight[f])}", value))
            normed[f] = value
        times = f" · {wname}[j]" if weight is not None else ""
        formula = f"{name}n[i,j] = {name}[i,j] / √(mean_k {name}[i,k]² + ε){times}"
        if whole:
            formula = (
                f"{name}n[i,j] = {name}[i,j] / √(mean of {name}[i]² over all heads' features"
                f" + ε){times}"
            )
        return squares, steps, normed, formula

    def _whole_row(self, name: str, i: int) -> list[tuple[str, np.ndarray]]:
        """Token i's Q (or K) of every query (key/value) head, each with its head's tag."""
        heads = self.r.heads
        if name == "Q" or not self.st.projections:
            return [(str(h + 1), np.asarray(heads[h].Q if name == "Q" else heads[h].K)[i])
                    for h in range(len(heads))]  # fmt: skip
        first = {self.s.kv_head_of(h): h for h in reversed(range(len(heads)))}
        return [(str(g + 1), np.asarray(heads[first[g]].K)[i]) for g in sorted(first)]

    def _pair(self, dims: int) -> tuple[int, int, bool]:
        """RoPE's pair for feature j: (its pair index k, its partner, j is the first)."""
        j = self.j
        if self.st.rope_style == "half":
            half = dims // 2
            return (j, j + half, True) if j < half else (j - half, j - half, False)
        return (j // 2, j + 1, True) if j % 2 == 0 else (j // 2, j - 1, False)

    def _turned(self, name: str) -> Explanation:
        st, i, j = self.st, self.i, self.j
        kv = name == "K"
        rot = f"{name}_rot"
        if not self._turned_on():
            e = self._projection(name)
            note = _notes(f"no QK-norm and no RoPE: {rot} is {name}", e.note)
            return Explanation(rot, e.formula, e.terms, e.steps, e.value, note)
        A = getattr(self.r.heads[self.h], name)[i]
        label = (self.keys if kv else self.tok)[i]
        d = A.shape[0]
        dims = min(rope_width(st, d), d - d % 2) if st.positional == "rope" else 0
        k, partner, first = self._pair(dims) if j < dims else (0, j, True)
        features = sorted({j, partner})
        terms: tuple[Term, ...] = ()
        steps: list[Step] = []
        formulas, notes = [], [self._kv_note() if kv else ""]
        src = name
        if st.qk_norm != "none":
            terms, steps, normed, norm_formula = self._norm(name, A, label, features, i)
            formulas.append(norm_formula)
            src = f"{name}n"
        else:
            normed = {f: float(A[f]) for f in features}
        value = normed[j]
        if dims and j < dims:
            a_f, b_f = (j, partner) if first else (partner, j)
            a, b = normed[a_f], normed[b_f]
            qpos, kpos = positions(self.s)
            pos = int((kpos if kv else qpos)[i])
            freq = float(pair_frequencies(dims, st.rope_base, st.rope_frequencies)[k])
            theta = float(pos) * freq
            f = st.rope_factor  # (cos and sin times the factor, as the forward pass has them)
            c, sn = float(np.cos(theta) * f), float(np.sin(theta) * f)
            trig = ("cos θ", "sin θ") if f == 1.0 else (f"{_num(f)}·cos θ", f"{_num(f)}·sin θ")
            A_, B_ = f"{src}[{label},{a_f + 1}]", f"{src}[{label},{b_f + 1}]"
            if first:
                rotation = (
                    Term(f"{A_}·{trig[0]}", (a, c), a * c, f"{_num(a)} × {_num(c)}"),
                    Term(f"−{B_}·{trig[1]}", (-b, sn), -b * sn, f"−{_bracketed(b)} × {_num(sn)}"),
                )
                formulas.append(f"{rot}[i,j] = a·{trig[0]} − b·{trig[1]}")
            else:
                rotation = (
                    Term(f"{A_}·{trig[1]}", (a, sn), a * sn, f"{_num(a)} × {_num(sn)}"),
                    Term(f"{B_}·{trig[0]}", (b, c), b * c, f"{_num(b)} × {_num(c)}"),
                )
                formulas.append(f"{rot}[i,j] = a·{trig[1]} + b·{trig[0]}")
            formulas.append(f"a = {src}[i,{a_f + 1}], b = {src}[i,{b_f + 1}]")
            formulas.append(f"θ = (position − 1) · {frequency_text(st, k, dims)}")
            terms += rotation
            offset = pos - i
            where = f"position of {label}"
            if offset:
                where += f" = {i + 1} + {offset} (bottom-right: the last query at the last key)"
            value = _total(rotation)
            steps += [
                Step(where, pos + 1),
                Step(f"θ = ({pos + 1} − 1) × {frequency_text(st, k, dims)}", theta),
                Step(trig[0], c),
                Step(trig[1], sn),
                Step(f"{rot}[{label},{j + 1}]", value),
            ]
            notes.insert(
                0,
                f"RoPE ({st.rope_style}): feature {j + 1} turns with feature {partner + 1} "
                f"(pair {k + 1} of {dims // 2}) by the angle of position {pos + 1} "
                "(positions count from 1, as rows do; position 1 is not turned)",
            )
        elif st.positional == "rope":
            formulas.append(f"{rot}[i,j] = {src}[i,j]")
            notes.insert(
                0, f"RoPE turns the first {dims} features only: feature {j + 1} is not turned"
            )
        title = f"{rot}: {name} as the scores see it"
        return Explanation(title, "; ".join(formulas), terms, tuple(steps), value, _notes(*notes))

    def Q_rot(self) -> Explanation:
        return self._turned("Q")

    def K_rot(self) -> Explanation:
        return self._turned("K")

    # Scores, scaling, masks ----------------------------------------------------------

    def _qk(self) -> tuple[str, str]:
        return ("Q_rot", "K_rot") if self._turned_on() else ("Q", "K")

    def _dot(self) -> tuple[Term, ...]:
        head, i, j = self.r.heads[self.h], self.i, self.j
        q, k = self._qk()
        return _products(
            f"{q}[{self.tok[i]}]", getattr(head, q)[i], f"{k}[{self.keys[j]}]", getattr(head, k)[j]
        )

    def _score_note(self) -> str:
        st, turned = self.st, ""
        if self._turned_on():
            done = [
                w
                for w, on in (("QK-norm", st.qk_norm != "none"), ("RoPE", st.positional == "rope"))
                if on
            ]
            turned = f"Q_rot and K_rot: Q and K after {' and '.join(done)}"
        return _notes(turned, self._kv_note())

    def scores(self) -> Explanation:
        terms = self._dot()
        total = _total(terms)
        q, k = self._qk()
        return Explanation(
            "raw score",
            f"S[i,j] = Σ_k {q}[i,k] · {k}[j,k]",
            terms,
            (Step("sum", total),),
            total,
            self._score_note(),
        )

    def scaled(self) -> Explanation:
        st, terms = self.st, self._dot()
        total = _total(terms)
        q, k = self._qk()
        steps = [Step("sum", total)]
        if not st.scale:
            value, formula = total, "S[i,j] (scaling off)"
            note = "scaling is off: the raw score is used as it is"
        elif st.scale_value is not None:
            value = total * st.scale_value
            steps.append(Step(f"sum × scale_value {_num(st.scale_value)}", value))
            formula, note = f"S[i,j] · {_num(st.scale_value)} (scale_value)", ""
        else:
            root = math.sqrt(self.r.d_k)
            value = total / root
            steps += [Step(f"√d_k = √{self.r.d_k}", root), Step("sum ÷ √d_k", value)]
            formula = f"S[i,j] / √d_k = (Σ_k {q}[i,k] · {k}[j,k]) / √d_k"
            note = ""
        outer = "s"
        if st.softcap is not None:
            c = st.softcap
            t = float(tanh(np.array(value / c)))
            value = c * t
            steps += [
                Step(f"tanh(s ÷ {_num(c)})", t),
                Step(f"soft-cap {_num(c)}·tanh(s/{_num(c)})", value),
            ]
            outer = f"{_num(c)}·tanh(s / {_num(c)})"
            note = _notes(note, f"soft-capped: scores stay within ±{_num(c)}")
        if st.positional == "alibi":
            value, alibi_steps, alibi_note = self._alibi(value)
            steps += alibi_steps
            outer += " − slope·|i − j|"
            note = _notes(note, alibi_note)
        if st.positional == "relative-bias":
            value, relative_steps, relative_note = self._relative(value)
            steps += relative_steps
            outer += " + relative_bias[bucket(j − i), h]"
            note = _notes(note, relative_note)
        if outer != "s":
            formula = f"{outer}, s = {formula}"
        note = _notes(note, self._score_note())
        return Explanation("scaled score", formula, terms, tuple(steps), value, note)

    def _alibi_bias(self) -> tuple[float, str, float]:
        """ALiBi for this cell: the head's slope, −slope × |p − q| written out with the
        1-based positions, and its value (the same from any origin both positions share)."""
        s, st = self.s, self.st
        slopes = st.alibi_slopes or tuple(alibi_slopes(s.n_heads))
        slope = float(slopes[self.h])
        qpos, kpos = (int(p[x]) + 1 for p, x in zip(positions(s), (self.i, self.j), strict=True))
        return slope, f"−{_num(slope)} × |{qpos} − {kpos}|", -(slope * abs(qpos - kpos))

    def _alibi_where(self) -> str:
        """Where the query and the key sit, 1-based, as a note."""
        i, j = self.i, self.j
        qpos, kpos = (int(p[x]) + 1 for p, x in zip(positions(self.s), (i, j), strict=True))
        note = f"query {self.tok[i]} at position {qpos}, key {self.keys[j]} at {kpos}"
        if qpos != i + 1:
            note += f" (bottom-right alignment: {i + 1} + {qpos - i - 1})"
        return note + "; positions count from 1, like rows, and only their distance matters"

    def _alibi(self, value: float) -> tuple[float, list[Step], str]:
        """value plus ALiBi's −slope·|i − j|: the new value, its steps and a note."""
        slope, written, bias = self._alibi_bias()
        s = self.s
        whose = "set" if self.st.alibi_slopes else f"the paper's, for {s.n_heads} heads"
        steps = [
            Step(f"ALiBi slope of head {self.h + 1} ({whose})", slope),
            Step(f"ALiBi {written}", bias),
            Step("score + ALiBi", value + bias),
        ]
        return value + bias, steps, f"ALiBi: {self._alibi_where()}"

    def _relative_bias(self) -> tuple[int, int, float]:
        """T5's relative bias for this cell: the relative position j − i, its bucket
        (0-based, as the table's rows) and the table's entry there for this head."""
        s, st = self.s, self.st
        qpos, kpos = (int(p[x]) for p, x in zip(positions(s), (self.i, self.j), strict=True))
        rel = kpos - qpos
        bucket = int(
            relative_bucket(
                np.array(rel), st.relative_bidirectional, st.relative_buckets,
                st.relative_max_distance,
            )
        )  # fmt: skip
        table = np.asarray(s.relative_bias)
        return rel, bucket, float(table[bucket, self.h])

    def _relative_where(self, rel: int, bucket: int) -> str:
        """Which bucket the cell's relative position falls in, and why, as a note."""
        st = self.st
        exact = relative_exact(st.relative_buckets, st.relative_bidirectional)
        side = ""
        if st.relative_bidirectional:
            side = "a key after the query, " if rel > 0 else "a key at or before the query, "
        distance = abs(rel) if st.relative_bidirectional else max(-rel, 0)
        how = (
            f"distance {distance} < {exact}: a bucket of its own"
            if distance < exact
            else f"distance {distance} ≥ {exact}: buckets grow logarithmically up to "
            f"{st.relative_max_distance}"
        )
        return (
            f"T5's relative bias: key {self.keys[self.j]} is at j − i = {rel} from query "
            f"{self.tok[self.i]}; {side}{how}; bucket {bucket + 1} of {st.relative_buckets} "
            f"(row {bucket + 1} of relative_bias)"
        )

    def _relative(self, value: float) -> tuple[float, list[Step], str]:
        """value plus T5's relative_bias[bucket(j − i), h]: the new value, its steps, a note."""
        rel, bucket, bias = self._relative_bias()
        steps = [
            Step(f"relative position j − i = {rel}: bucket {bucket + 1}", float(bucket + 1)),
            Step(f"relative_bias[bucket {bucket + 1}, head {self.h + 1}]", bias),
            Step("score + relative bias", value + bias),
        ]
        return value + bias, steps, self._relative_where(rel, bucket)

    def _place(self) -> tuple[int, str]:
        """Query i's position among the keys, and how that reads under bottom-right."""
        pos = int(positions(self.s)[0][self.i])
        offset = pos - self.i
        if not offset:
            return pos, ""
        return pos, (
            f"bottom-right alignment: query {self.tok[self.i]} sits at key position "
            f"{self.i + 1} + {offset} = {pos + 1}, so the last query is the last key"
        )

    def masked(self) -> Explanation:
        st, i, j = self.st, self.i, self.j
        mask, hidden = st.mask, bool(self.r.future[i, j])
        pos, aligned = self._place()
        q, key = self.tok[i], self.keys[j]
        p = "i" if not aligned else f"i + {pos - i}"
        if hidden and mask == "custom":
            return Explanation(
                "masked score",
                "−∞ where mask_matrix[i,j] = 0",
                (),
                (),
                -math.inf,
                f"mask_matrix[{q},{key}] = 0: {key} is hidden from {q}, set to −∞, "
                "so its weight is 0",
            )
        if hidden and mask == "causal":
            return Explanation(
                "masked score",
                "−∞ where key j comes after query i" + (f" (at {p})" if aligned else ""),
                (),
                (),
                -math.inf,
                _notes(f"{key} comes after {q}: set to −∞, so its weight is 0", aligned),
            )
        if hidden and mask == "sliding-window":
            w = st.window
            where = "comes after" if j > pos else f"is more than {w - 1} before"
            window = f"{p} − {w} < j ≤ {p}" if aligned else f"i − {w} < j ≤ i"
            return Explanation(
                "masked score",
                f"−∞ unless {window} (a window of {w} keys)",
                (),
                (),
                -math.inf,
                _notes(
                    f"{key} {where} {q}: outside the window, set to −∞, so its weight is 0",
                    aligned,
                ),
            )
        if hidden and mask == "causal-zero":
            return Explanation(
                "masked score",
                "0 where key j comes after query i" + (f" (at {p})" if aligned else ""),
                (),
                (),
                0.0,
                _notes(
                    "set to 0, not −∞: e⁰ = 1, so this future key still gets weight (the leak)",
                    aligned,
                ),
            )
        e = self.scaled()
        note = f"mask_matrix[{q},{key}] = 1: not masked" if mask == "custom" else "not masked"
        return Explanation("masked score", e.formula, e.terms, e.steps, e.value, note)

    # Softmax, outputs, the mix ------------------------------------------------------

    def weights(self) -> Explanation:
        h, i, j, r = self.h, self.i, self.j, self.r
        row = r.heads[h].masked[i]
        title = "attention weight"
        if r.heads[h].empty_rows[i]:
            return Explanation(
                title, "no key is visible", (), (), 0.0, "every score is −∞: weight 0"
            )
        sink = None if self.st.sinks is None else float(self.st.sinks[h])
        m = float(row.max()) if sink is None else max(float(row.max()), sink)
        terms = tuple(
            Term(
                f"exp(s[{self.keys[k]}] − m)",
                (float(s),),
                math.exp(s - m),
                f"exp({_num(s)} − {_num(m)})",
            )
            for k, s in enumerate(row)
        )
        if sink is not None:
            terms += (
                Term(
                    "exp(sink − m)", (sink,), math.exp(sink - m), f"exp({_num(sink)} − {_num(m)})"
                ),
            )
        Z = _total(terms)
        quotient = terms[j].value / Z
        steps = [Step("row max m", m), Step("Σ exp", Z), Step("exp(s[i,j] − m) ÷ Σ", quotient)]
        formula = "w[i,j] = exp(s[i,j] − m) / Σ_k exp(s[i,k] − m), m = max_k s[i,k]"
        value, note = quotient, ""
        if sink is not None:
            share = terms[-1].value / Z
            steps[0] = Step("m = max(row max, sink)", m)
            steps[1] = Step("Σ exp, the sink's included", Z)
            steps.append(Step("sink share exp(sink − m) ÷ Σ", share))
            formula = (
                "w[i,j] = exp(s[i,j] − m) / (Σ_k exp(s[i,k] − m) + exp(sink − m)), "
                "m = max(max_k s[i,k], sink)"
            )
            note = (
                f"the sink of head {h + 1} (logit {_num(sink)}) joins the denominator only: "
                "it takes its share of the row, so the weights sum to 1 − that share"
            )
        if self.st.positional == "alibi" and math.isfinite(float(row[j])):
            _, written, bias = self._alibi_bias()
            alibi = f"s[i,j] includes ALiBi's {written} = {_num(bias)}: {self._alibi_where()}"
            note = _notes(note, alibi)
        if self.st.positional == "relative-bias" and math.isfinite(float(row[j])):
            rel, bucket, bias = self._relative_bias()
            relative = f"s[i,j] includes relative_bias = {_num(bias)}: " + self._relative_where(
                rel, bucket
            )
            note = _notes(note, relative)
        if r.settings.mask == "drop-after-softmax" and r.future[i, j]:
            value = 0.0
            note = _notes(note, "future key: zeroed after softmax, and the row is not renormalised")
            steps.append(Step("dropped after softmax", value))
        keep = r.heads[h].keep
        if keep is not None:
            p = r.settings.dropout
            value = value / (1 - p) if keep[i, j] else 0.0
            steps.append(
                Step("dropout: kept, × 1/(1−p)" if keep[i, j] else "dropout: dropped", value)
            )
        return Explanation(title, formula, terms, tuple(steps), value, note)

    def output(self) -> Explanation:
        h, i, j = self.h, self.i, self.j
        head = self.r.heads[h]
        terms = tuple(
            Term(
                f"w[{self.tok[i]},{self.keys[k]}]·V[{self.keys[k]},{j + 1}]",
                (float(w), float(v)),
                float(w * v),
                f"{_num(w)} × {_num(v)}",
            )
            for k, (w, v) in enumerate(zip(head.weights[i], head.V[:, j], strict=True))
        )
        total = _total(terms)
        sink = ""
        if self.st.sinks is not None:
            sink = (
                f"the sink took {_num(float(head.sink[i]))} of this row's softmax; it has "
                "no value row, so it adds nothing here"
            )
        return Explanation(
            "head output",
            "out[i,j] = Σ_k w[i,k] · V[k,j]",
            terms,
            (Step("sum", total),),
            total,
            _notes(sink, self._kv_note()),
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
        formula = "out[i,j] = Σ_h Σ_c concat[i, h·d_k + c] · W_O[h·d_k + c, j]"
        summed = "sum over heads"
        if self.s.b_O.any():
            bias = float(self.s.b_O[0, j])
            terms.append(Term(f"b_O[{j + 1}] (bias)", (bias,), bias))
            formula += " + b_O[j]"
            summed += " + b_O"
        terms_t = tuple(terms)
        total = _total(terms_t)
        return Explanation("final output", formula, terms_t, (Step(summed, total),), total)


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
