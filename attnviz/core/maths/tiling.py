"""FlashAttention-2's forward pass over one head of a scenario, step by step.

The queries go in blocks of ``block_q`` rows; for each block the keys go in blocks of
``block_k`` columns. A step scores one tile (Q_i K_jᵀ, scaled, soft-capped, with the
ALiBi bias and the mask: exactly what the engine does, for those rows and columns), then
updates each row's running maximum m, its running denominator l and its unnormalised
output O:

    m_new = max(m_old, rowmax(S))        P = exp(S − m_new)
    l_new = e^(m_old − m_new)·l_old + rowsum(P)
    O_new = e^(m_old − m_new)·O_old + P·V_j

A tile the mask hides entirely is skipped (no scores, no reads of K_j and V_j). After a
block's last tile, O / l is that block's output and m + log l its rows' log-sum-exp
(LSE). The n × m score matrix is never stored; from Q, K and the LSE alone,
P = exp(S − LSE) gives back the dense weights, which is how a fused kernel's backward
pass gets them. A sink (gpt-oss) is one more logit in the denominator: the running state
starts at m = sink, l = 1.

``precision`` other than float64 runs the steps as the GPU kernels do: Q, K, V and P
rounded to float16, bfloat16 or float32, products and m, l, O accumulated in float32.

``traffic`` counts the reads and writes of the slow memory (HBM) for dense attention and
for the tiled pass, after the FlashAttention paper's analysis.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from attnviz.core.maths.forward import head_inputs
from attnviz.core.maths.positions import hidden_keys, positions, relative_buckets, scale_of
from attnviz.core.maths.scenario import Scenario, ScenarioError
from attnviz.core.maths.variants import alibi_slopes, softcap

PRECISIONS = ("float64", "float32", "float16", "bfloat16")
SUPPORTED_MASKS = ("none", "causal", "sliding-window", "custom")  # −∞ masks, as kernels do


@dataclass(frozen=True, eq=False)
class Step:
    """One tile: query rows ``rows`` (start, stop) against key columns ``cols``."""

    q_block: int
    k_block: int
    rows: tuple[int, int]  # 0-based, stop exclusive
    cols: tuple[int, int]
    skipped: bool  # the mask hides the whole tile: nothing computed, nothing read
    scores: np.ndarray  # (rows, cols) as softmax sees them (−∞ where masked); empty if skipped
    m_old: np.ndarray  # (rows,) running maximum before the step
    m_new: np.ndarray
    l_old: np.ndarray  # (rows,) running denominator before the step
    l_new: np.ndarray
    rescale: np.ndarray  # (rows,) e^(m_old − m_new), what the old l and O are multiplied by
    P: np.ndarray  # (rows, cols) exp(S − m_new); empty if skipped
    O: np.ndarray  # (rows, d) unnormalised output after the step
    last: bool  # the block's last tile: O / l and the LSE are final after it


@dataclass(frozen=True, eq=False)
class Tiling:
    """The whole pass over one head."""

    head: int
    block_q: int
    block_k: int
    precision: str
    steps: tuple[Step, ...]
    output: np.ndarray  # (n, d) O / l (NaN in an overflowed row)
    lse: np.ndarray  # (n,) m + log l (−∞ for a row that sees no key, NaN if overflowed)
    weights_from_lse: np.ndarray  # (n, m) exp(S − LSE), rebuilt after the pass
    overflowed: np.ndarray  # (n,) bool: a score, m or l of the row left the precision's range

    @property
    def skipped(self) -> int:
        return sum(step.skipped for step in self.steps)

    @property
    def computed(self) -> int:
        return len(self.steps) - self.skipped

    @property
    def kv_columns(self) -> int:
        """Key columns read (of K and of V) over the computed tiles."""
        return sum(step.cols[1] - step.cols[0] for step in self.steps if not step.skipped)

    def traffic(self) -> Traffic:
        n, d = self.output.shape
        m = self.weights_from_lse.shape[1]
        return traffic(n, m, d, self.block_q, self.kv_columns)


def check_supported(s: Scenario) -> None:
    """Refuse what a tiled kernel does not do, naming it."""
    st = s.settings
    if st.mask not in SUPPORTED_MASKS:
        raise ScenarioError(
            f"mask {st.mask!r}: the tiled pass masks with −∞ as the kernels do "
            f"(masks {', '.join(SUPPORTED_MASKS)}); {st.mask} is a teaching strategy only"
        )
    if st.dropout:
        raise ScenarioError("dropout: switch it off to step through the tiles")


def tiles(
    s: Scenario,
    head: int = 0,
    block_q: int = 4,
    block_k: int = 4,
    precision: str = "float64",
) -> Tiling:
    """FlashAttention-2's forward pass over query head ``head`` (0-based) of ``s``."""
    check_supported(s)
    if precision not in PRECISIONS:
        raise ScenarioError(f"precision {precision!r}: expected one of {', '.join(PRECISIONS)}")
    for name, value in (("block_q", block_q), ("block_k", block_k)):
        if not isinstance(value, int) or value < 1:
            raise ScenarioError(f"{name}: {value!r}; expected a whole number from 1")
    check_size(s, block_q, block_k, MAX_STEPS, MAX_KEPT)
    Q, K, V = head_inputs(s, head)  # Q and K as the scores see them (QK-norm, RoPE)
    hidden = hidden_keys(s) if s.settings.mask != "none" else np.zeros((s.n, s.m), bool)
    steps: list[Step] = []
    output = np.zeros((s.n, V.shape[1]))
    lse = np.full(s.n, -np.inf)
    overflowed = np.zeros(s.n, bool)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):  # reported, not warned
        if precision != "float64":
            Q, K, V = (_rounded(a, precision) for a in (Q, K, V))
        for i, r0 in enumerate(range(0, s.n, block_q)):
            r1 = min(s.n, r0 + block_q)
            block = _Block(s, head, precision, (Q, K, V), hidden, (r0, r1))
            steps += block.run(i, block_k)
            output[r0:r1], lse[r0:r1], overflowed[r0:r1] = block.finish()
        rebuilt = _weights_from_lse(s, head, lse, hidden)
    for step in steps:
        _freeze(step)
    return Tiling(head, block_q, block_k, precision, tuple(steps), output, lse, rebuilt, overflowed)


class _Block:
    """One block of query rows: the running m, l and O over its key tiles."""

    def __init__(
        self,
        s: Scenario,
        head: int,
        precision: str,
        qkv: tuple[np.ndarray, np.ndarray, np.ndarray],
        hidden: np.ndarray,
        rows: tuple[int, int],
    ) -> None:
        self.s, self.head, self.precision, self.qkv, self.hidden = s, head, precision, qkv, hidden
        self.rows = rows
        self.acc = np.float32 if precision != "float64" else np.float64
        count, sink = rows[1] - rows[0], _sink(s, head)
        self.m: np.ndarray = np.full(count, -np.inf if sink is None else sink, dtype=self.acc)
        self.l: np.ndarray = np.full(count, 0.0 if sink is None else 1.0, dtype=self.acc)
        self.O: np.ndarray = np.zeros((count, qkv[2].shape[1]), dtype=self.acc)
        self.overflowed = np.zeros(count, bool)  # a visible score that is not a number

    def run(self, i: int, block_k: int) -> list[Step]:
        starts = list(range(0, self.s.m, block_k))
        return [
            self._step(i, j, (c0, min(self.s.m, c0 + block_k)), j == len(starts) - 1)
            for j, c0 in enumerate(starts)
        ]

    def _step(self, i: int, j: int, cols: tuple[int, int], last: bool) -> Step:
        (r0, r1), (c0, c1), acc = self.rows, cols, self.acc
        Q, K, V = self.qkv
        m, l, O = self.m, self.l, self.O
        tile_hidden = self.hidden[r0:r1, c0:c1]
        if tile_hidden.all():
            empty, ones = np.empty((r1 - r0, 0)), np.ones(r1 - r0, dtype=acc)
            return Step(i, j, self.rows, cols, True, empty, m, m, l, l, ones, empty, O, last)
        S = _scores(self.s, self.head, Q[r0:r1], K[c0:c1], self.rows, cols, tile_hidden, acc)
        self.overflowed |= (~np.isfinite(S) & ~tile_hidden).any(axis=1)
        m_new = np.maximum(m, S.max(axis=1))
        seen = ~np.isneginf(m_new)  # a row that has seen no key yet keeps m = −∞
        base = np.where(seen, m_new, 0.0)
        rescale = np.where(seen & ~np.isneginf(m), np.exp(m - base), 0.0).astype(acc)
        P = np.exp(S - base[:, None]).astype(acc)  # exp(−∞) = 0 on masked keys
        l_new = (rescale * l + P.sum(axis=1)).astype(acc)
        low = self.precision != "float64"
        PV = _rounded(P, self.precision) @ V[c0:c1] if low else P @ V[c0:c1]
        O_new = (rescale[:, None] * O + PV).astype(acc)
        self.m, self.l, self.O = m_new.astype(acc), l_new, O_new
        return Step(i, j, self.rows, cols, False, S, m, m_new, l, l_new, rescale, P, O_new, last)

    def finish(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """O / l, the log-sum-exp and which rows overflowed (NaN output and LSE)."""
        m, l, O = self.m, self.l, self.O
        output = np.where(l[:, None] > 0, O / l[:, None], 0.0)
        bad = self.overflowed | ~np.isfinite(l) | np.isnan(m) | ~np.isfinite(output).all(axis=1)
        lse = np.where(l > 0, m + np.log(l), -np.inf)
        return np.where(bad[:, None], np.nan, output), np.where(bad, np.nan, lse), bad


def overflowed_text(t: Tiling, tokens: Sequence[str] = ()) -> str:
    """Which rows overflowed, in words ("" when none did)."""
    rows = np.flatnonzero(t.overflowed)
    if not rows.size:
        return ""
    named = [f"{i + 1}" + (f" ({tokens[i]})" if i < len(tokens) else "") for i in rows[:8]]
    more = f" and {rows.size - 8} more" if rows.size > 8 else ""
    word = "row" if rows.size == 1 else "rows"
    return (
        f"{word} {', '.join(named)}{more} overflowed in {t.precision}: a score, a running "
        f"max or sum, or an output passed its largest number ({_largest(t.precision)})"
    )


def _largest(precision: str) -> str:
    return {"float16": "65504", "bfloat16": "about 3.4e38", "float32": "about 3.4e38"}.get(
        precision, "about 1.8e308"
    )


def _sink(s: Scenario, head: int) -> float | None:
    sinks = s.settings.sinks
    return None if sinks is None else float(sinks[head])


def _scores(
    s: Scenario,
    head: int,
    Q: np.ndarray,
    K: np.ndarray,
    rows: tuple[int, int],
    cols: tuple[int, int],
    hidden: np.ndarray,
    acc: type,
) -> np.ndarray:
    """One tile as softmax sees it, the engine's steps in the engine's order: × scale,
    soft-cap, − ALiBi slope·distance (or + T5's relative bias), −∞ where the mask hides a key."""
    st = s.settings
    raw = (Q.astype(acc) @ K.astype(acc).T).astype(np.float64)
    d = s.d_k if st.projections else s.d_model
    scale = scale_of(st, d)
    S = raw / np.sqrt(d) if scale is None else raw * scale
    if st.softcap is not None:
        S = softcap(S, st.softcap)
    if st.positional == "alibi":
        slope = np.asarray(st.alibi_slopes or alibi_slopes(s.n_heads))[head]
        qpos, kpos = positions(s)
        S = S - slope * np.abs(qpos[rows[0] : rows[1], None] - kpos[None, cols[0] : cols[1]])
    if st.positional == "relative-bias":  # T5's table by each score's bucket
        buckets = relative_buckets(s, slice(rows[0], rows[1]))[:, cols[0] : cols[1]]
        S = S + np.asarray(s.relative_bias)[buckets, head]
    return np.where(hidden, -np.inf, S).astype(acc)


def _weights_from_lse(s: Scenario, head: int, lse: np.ndarray, hidden: np.ndarray) -> np.ndarray:
    """P = exp(S − LSE), from Q, K and the LSE alone: the dense weights, rebuilt."""
    Q, K, _ = head_inputs(s, head)
    S = _scores(s, head, Q, K, (0, s.n), (0, s.m), hidden, np.float64)
    with np.errstate(invalid="ignore"):
        P = np.exp(S - lse[:, None])
    return np.where(np.isneginf(lse)[:, None], 0.0, P)


def _freeze(step: Step) -> None:
    arrays = (step.scores, step.m_old, step.m_new, step.l_old, step.l_new, step.rescale)
    for a in (*arrays, step.P, step.O):
        a.flags.writeable = False


def _rounded(x: np.ndarray, precision: str) -> np.ndarray:
    """x rounded to ``precision`` and held in float32 (as kernels feed tensor cores)."""
    if precision == "float16":
        return np.asarray(x).astype(np.float16).astype(np.float32)
    f = np.asarray(x, dtype=np.float32)
    if precision == "bfloat16":  # the top 16 bits of a float32, rounded to nearest even
        bits = f.view(np.uint32).astype(np.uint64)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16
        return np.asarray(rounded, dtype=np.uint32).view(np.float32)
    return f


# The worked arithmetic of one step ---------------------------------------------------

MAX_STEPS = 1 << 18  # tiles a pass keeps (each a few small arrays)
MAX_KEPT = 1 << 26  # numbers all its tiles keep: 512 MB as float64


def tile_count(s: Scenario, block_q: int, block_k: int) -> int:
    return math.ceil(s.n / block_q) * math.ceil(s.m / block_k)


def check_size(s: Scenario, block_q: int, block_k: int, max_tiles: int, max_kept: int) -> None:
    """Refuse, before anything is allocated, a pass whose tiles (each keeping its scores,
    P, O, m and l) are more than max_tiles or hold more than max_kept numbers."""
    count = tile_count(s, block_q, block_k)
    d = s.d_k if s.settings.projections else s.d_model
    kept = 2 * s.n * s.m + count * block_q * (d + 6)
    if count > max_tiles or kept > max_kept:
        raise ScenarioError(
            f"B_r = {block_q}, B_c = {block_k} make {count:,} tiles of this {s.n} × {s.m} "
            f"matrix keeping {kept:,} numbers; at most {max_tiles:,} tiles and "
            f"{max_kept:,} numbers are kept: raise the block sizes"
        )


TERMS_LISTED = 4  # e^(s − m) terms written out one by one; more are summed in one term


def describe_step(step: Step, row: int, tokens: Sequence[str] = ()) -> str:
    """The arithmetic of one query row (0-based, among ``step.rows``) in one step, in
    words: "row 3 (the), keys 3–4: m 1.40 → 1.98 (tile max 1.98); l = 2.31 × e^(1.40−1.98)
    + … = …"; after a block's last tile, its output and log-sum-exp."""
    r0, r1 = step.rows
    if not r0 <= row < r1:
        raise ValueError(f"row {row + 1}: the step covers rows {r0 + 1}–{r1}")
    k = row - r0
    name = f" ({tokens[row]})" if row < len(tokens) else ""
    c0, c1 = step.cols
    keys = f"key {c0 + 1}" if c1 - c0 == 1 else f"keys {c0 + 1}–{c1}"
    m_old, l_old = float(step.m_old[k]), float(step.l_old[k])
    m_new, l_new = float(step.m_new[k]), float(step.l_new[k])
    state = f"m {_n(m_old)}, l {_n(l_old)} and O"
    scores = np.asarray(step.scores[k], dtype=np.float64) if not step.skipped else None
    seen = np.flatnonzero(~np.isneginf(scores)) if scores is not None else np.zeros(0, int)
    overflowed = math.isnan(m_new) or m_new == math.inf or not math.isfinite(l_new)
    if scores is None:
        text = f"tile skipped (the mask hides all of it): {state} unchanged"
    elif overflowed:
        text = f"overflowed: m {_n(m_new)}, l {_n(l_new)} are not numbers the row can use"
    elif not seen.size:
        text = f"all masked: {state} unchanged"
    else:
        text = _update(scores, seen, m_old, m_new, l_old, l_new, float(step.rescale[k]))
        hidden = _spans(c0 + np.flatnonzero(np.isneginf(scores)))
        text += f" ({hidden} masked)" if hidden else ""
    if step.last:
        if overflowed:
            text += "; block done: its output and LSE are NaN"
        elif l_new > 0:
            lse = m_new + math.log(l_new)
            text += f"; block done: out = O / {_n(l_new)}, LSE = m + ln l = {_n(lse)}"
        else:
            text += "; block done: no key seen, out = 0"
    return f"row {row + 1}{name}, {keys}: {text}"


def _update(
    scores: np.ndarray,
    seen: np.ndarray,
    m_old: float,
    m_new: float,
    l_old: float,
    l_new: float,
    rescale: float,
) -> str:
    """m, l and O of one row after a tile with keys ``seen`` (not masked)."""
    first = math.isinf(m_old)  # nothing to rescale yet
    if first:
        text = f"m −∞ → {_n(m_new)}; l = "
    else:
        change = f"m {_n(m_old)} → {_n(m_new)}" if m_new > m_old else f"m {_n(m_old)} stays"
        top = _n(float(scores[seen].max()))
        text = f"{change} (tile max {top}); l = {_n(l_old)} × e^({_minus(m_old, m_new)}) + "
    if seen.size <= TERMS_LISTED:
        text += " + ".join(f"e^({_minus(float(scores[j]), m_new)})" for j in seen)
    else:
        total = "" if first else f" ({_n(float(np.exp(scores[seen] - m_new).sum()))})"
        text += f"Σ e^(s − {_n(m_new)}) over {seen.size} keys{total}"
    text += f" = {_n(l_new)}; O = " + ("P·V" if first else f"O × {_n(rescale)} + P·V")
    return text


def _n(x: float) -> str:
    """A number as the worked arithmetic prints it: two decimals, − for minus."""
    if x == -math.inf:
        return "−∞"
    if x == 0:
        return "0"
    text = f"{x:.2f}" if 0.01 <= abs(x) < 1000 else f"{x:.3g}"
    return text.replace("-", "−")


def _spans(columns: np.ndarray) -> str:
    """1-based key numbers of 0-based columns, runs joined: "keys 2–5, 8" or "key 3"."""
    runs: list[list[int]] = []
    for c in columns.tolist():
        if runs and c == runs[-1][1] + 1:
            runs[-1][1] = c
        else:
            runs.append([c, c])
    if not runs:
        return ""
    texts = [f"{a + 1}" if a == b else f"{a + 1}–{b + 1}" for a, b in runs]
    plural = len(runs) > 1 or runs[0][0] != runs[0][1]
    return f"key{'s' if plural else ''} {', '.join(texts)}"


def _minus(a: float, b: float) -> str:
    """ "a−b" for an exponent, written "a+|b|" when b is negative."""
    return f"{_n(a)}−{_n(b)}" if b >= 0 else f"{_n(a)}+{_n(-b)}"


# Memory traffic ------------------------------------------------------------------------


@dataclass(frozen=True)
class Traffic:
    """Numbers read from and written to the slow memory for one head."""

    dense_reads: int
    dense_writes: int
    tiled_reads: int
    tiled_writes: int

    @property
    def dense(self) -> int:
        return self.dense_reads + self.dense_writes

    @property
    def tiled(self) -> int:
        return self.tiled_reads + self.tiled_writes


def traffic(n: int, m: int, d: int, block_q: int, kv_columns: int | None = None) -> Traffic:
    """Dense attention (the paper's Algorithm 0): read Q and K, write S; read S, write P;
    read P and V, write O. Tiled (FlashAttention-2, query blocks outside): each query
    block is read once and reads the K and V columns of its computed tiles; O and the LSE
    are written once. ``kv_columns``: key columns read over all computed tiles (every
    block reads all m by default; fewer where a mask skips tiles)."""
    dense_reads = 2 * n * d + n * m + n * m + m * d
    dense_writes = n * m + n * m + n * d
    columns = math.ceil(n / block_q) * m if kv_columns is None else kv_columns
    return Traffic(dense_reads, dense_writes, n * d + 2 * columns * d, n * d + n)


def blocks_for_memory(M: int, d: int) -> tuple[int, int]:
    """The paper's block sizes for a fast memory of M numbers: B_c = ⌈M / 4d⌉ key
    columns, B_r = min(B_c, d) query rows."""
    if 4 * d > M:
        raise ScenarioError(f"fast memory of {M} numbers: at least 4·d = {4 * d} are needed")
    b_c = math.ceil(M / (4 * d))
    return min(b_c, d), b_c
