"""Small numerical experiments behind the lesson's scaling stage (stage 4) and the
Experiments dock.

``scaling_variance`` samples random query/key pairs to show that ``q·k`` has variance
``d_k`` and ``q·k / √d_k`` variance about 1; ``saturation`` shows what happens to
softmax when scores are not scaled down (``[2, 1, 0, -1]`` times 8 is nearly one-hot);
``permutation`` checks whether reordering the tokens only reorders the outputs (it does
when there is no mask and no position encoding); ``gradient_gain`` measures how much of
a gradient gets back through softmax, with and without ÷√d_k.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from attnviz.core.maths.forward import compute
from attnviz.core.maths.results import Result
from attnviz.core.maths.scenario import Scenario, permute_tokens

MAX_PAIRS = 1_000_000
MAX_D_K = 4096
# Random numbers drawn per block: 2**22 float64 is 32 MiB, whatever pairs and d_k are.
_BLOCK_NUMBERS = 2**22


@dataclass(frozen=True)
class ScalingStats:
    """Sample statistics of q·k over ``pairs`` standard-normal pairs of width ``d_k``.

    Variances are about the sample mean and divide by ``pairs`` (one pair gives 0).
    Expected: means near 0, ``var_raw`` near ``d_k``, ``var_scaled`` near 1.
    """

    d_k: int
    pairs: int
    mean_raw: float
    var_raw: float
    mean_scaled: float
    var_scaled: float


@dataclass(frozen=True)
class RowSummary:
    """How peaked a row of softmax weights is: entropy in nats and its largest weight."""

    entropy: float
    max_weight: float


@dataclass(frozen=True)
class Permutation:
    """The final outputs of a scenario and of its tokens reordered, compared.

    ``max_change`` is the largest ``|final(permuted)[i] − final(original)[order[i]]|``:
    0 (to rounding) when permuting the tokens only permutes the output rows.
    ``permuted_only`` is that change within ``tolerance``, 1e-12 of the largest output
    (at least 1e-12). ``conditions`` names the settings that decide it.
    """

    order: tuple[int, ...]
    conditions: str
    max_change: float
    tolerance: float

    @property
    def permuted_only(self) -> bool:
        return self.max_change <= self.tolerance

    @property
    def verdict(self) -> str:
        return "the outputs were only permuted" if self.permuted_only else "the outputs changed"

    @property
    def text(self) -> str:
        """One sentence for the user, e.g. "With no mask and no position encoding: ..."."""
        return f"With {self.conditions}: {self.verdict} (largest change {self.max_change:.3g})."


def permutation(
    s: Scenario,
    order: Sequence[int],
    permuted: Scenario | None = None,
    results: Callable[[Scenario], Result] | None = None,
) -> Permutation:
    """Compare the float64 final output of s with that of its tokens put in `order`
    (row i of the permuted scenario is token order[i], as in ``permute_tokens``).

    ``permuted`` is that scenario if already made; ``results`` computes a scenario
    (default ``compute``; the window passes its compute service's cached ``result_for``).
    A bad order raises ScenarioError.
    """
    order = tuple(int(i) for i in order)
    if permuted is None:
        permuted = permute_tokens(s, order)
    results = results or compute
    before, after = results(s).final, results(permuted).final
    moved = float(np.abs(after - before[list(order)]).max())
    tolerance = 1e-12 * max(1.0, float(np.abs(before).max()))
    st = s.settings
    conditions = (
        "no mask and no position encoding"
        if st.mask == "none" and st.positional == "none"
        else f"mask {st.mask}, position {st.positional}"
    )
    return Permutation(
        order=order,
        conditions=conditions,
        max_change=moved,
        tolerance=tolerance,
    )


def _whole(name: str, value: object, lo: int, hi: int) -> int:
    """value as an int in [lo, hi], or ValueError naming the argument."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name}: expected a whole number from {lo} to {hi}, got {value!r}")
    if not lo <= value <= hi:
        raise ValueError(f"{name}: {value} is out of range; expected {lo} to {hi}")
    return int(value)


def _dots(d_k: int, pairs: int, rng: np.random.Generator) -> np.ndarray:
    """q·k for `pairs` fresh standard-normal pairs, drawn in memory-bounded blocks.

    Each block is one (rows, 2, d_k) draw; numpy's Generator fills arrays from one
    stream in order, so the numbers (and the dots) do not depend on the block size.
    """
    rows = max(1, _BLOCK_NUMBERS // (2 * d_k))
    dots = np.empty(pairs)
    for start in range(0, pairs, rows):
        stop = min(start + rows, pairs)
        qk = rng.standard_normal((stop - start, 2, d_k))
        dots[start:stop] = np.einsum("pd,pd->p", qk[:, 0], qk[:, 1])
    return dots


def scaling_variance(
    d_ks: Sequence[int] = (2, 64, 512), pairs: int = 20000, seed: int = 0
) -> list[ScalingStats]:
    """Mean and variance of q·k and q·k/√d_k for random standard-normal q, k; one per d_k.

    Each d_k draws from its own generator seeded with (seed, d_k), so its record does
    not depend on the other entries of d_ks. Cost: 2·pairs·d_k normal draws per d_k.
    """
    if isinstance(d_ks, (str, bytes)) or not isinstance(d_ks, Sequence) or not d_ks:
        raise ValueError(f"d_ks: expected a non-empty sequence of widths, got {d_ks!r}")
    widths = [_whole(f"d_ks[{i}]", d, 1, MAX_D_K) for i, d in enumerate(d_ks)]
    pairs = _whole("pairs", pairs, 1, MAX_PAIRS)
    seed = _whole("seed", seed, 0, 2**32 - 1)
    records = []
    for d_k in widths:
        raw = _dots(d_k, pairs, np.random.default_rng([seed, d_k]))
        scaled = raw / np.sqrt(d_k)
        records.append(
            ScalingStats(
                d_k=d_k,
                pairs=pairs,
                mean_raw=float(raw.mean()),
                var_raw=float(raw.var()),
                mean_scaled=float(scaled.mean()),
                var_scaled=float(scaled.var()),
            )
        )
    return records


@dataclass(frozen=True)
class GradientGain:
    """How much gradient gets back through softmax: the median over rows of
    ‖dS‖ / ‖dP‖, dS = P ⊙ (dP − P·dP), for scores of standard-normal q and k of width
    ``d_k`` over ``keys`` keys, divided by √d_k (``scaled``) or not (``unscaled``), and a
    standard-normal dP."""

    d_k: int
    keys: int
    rows: int
    scaled: float
    unscaled: float


def softmax_gradient(P: np.ndarray, dP: np.ndarray) -> np.ndarray:
    """dS = P ⊙ (dP − rowsum(dP ⊙ P)): the gradient softmax passes back to its scores."""
    return P * (dP - (dP * P).sum(axis=-1, keepdims=True))  # type: ignore[no-any-return]


def gradient_gain(
    d_ks: Sequence[int] = (1, 4, 16, 64, 256, 1024), keys: int = 16, rows: int = 2000, seed: int = 0
) -> list[GradientGain]:
    """For each d_k, the median ‖dS‖/‖dP‖ of ``rows`` random rows, scaled and unscaled
    (each d_k from its own generator seeded with (seed, d_k)). Unscaled scores have
    variance d_k: softmax saturates, and the gradient through it vanishes."""
    widths = [_whole(f"d_ks[{i}]", d, 1, MAX_D_K) for i, d in enumerate(d_ks)]
    keys, rows = _whole("keys", keys, 2, 4096), _whole("rows", rows, 1, 100_000)
    seed = _whole("seed", seed, 0, 2**32 - 1)
    records = []
    for d_k in widths:
        rng = np.random.default_rng([seed, d_k])
        block = max(1, _BLOCK_NUMBERS // ((keys + 1) * d_k))  # rows a draw: memory-bounded
        scaled, unscaled = [], []
        for start in range(0, rows, block):
            count = min(rows - start, block)
            q = rng.standard_normal((count, d_k))
            K = rng.standard_normal((count, keys, d_k))
            dP = rng.standard_normal((count, keys))
            raw = np.einsum("rkd,rd->rk", K, q)
            scaled.append(_gain(raw / np.sqrt(d_k), dP))
            unscaled.append(_gain(raw, dP))
        medians = (float(np.median(np.concatenate(g))) for g in (scaled, unscaled))
        records.append(GradientGain(d_k, keys, rows, *medians))
    return records


def _gain(scores: np.ndarray, dP: np.ndarray) -> np.ndarray:
    P = np.exp(scores - scores.max(axis=-1, keepdims=True))
    P /= P.sum(axis=-1, keepdims=True)
    gain: np.ndarray = np.linalg.norm(softmax_gradient(P, dP), axis=-1) / np.linalg.norm(
        dP, axis=-1
    )
    return gain


def _softmax(row: np.ndarray) -> np.ndarray:
    e = np.exp(row - row.max())  # the max subtracted first: no overflow, same weights
    weights: np.ndarray = e / e.sum()
    weights.flags.writeable = False
    return weights


def saturation(
    scores: Sequence[float] | np.ndarray, factor: float
) -> tuple[np.ndarray, np.ndarray]:
    """Softmax of a score row, and of the same row multiplied by factor (read-only float64).

    ``saturation([2, 1, 0, -1], 8)`` gives about [0.64, 0.24, 0.09, 0.03] and [1, 0, 0, 0].
    """
    try:
        row = np.asarray(scores, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"scores: expected a row of numbers, got {scores!r}") from None
    if row.ndim != 1 or row.size == 0:
        raise ValueError(f"scores: expected a non-empty 1-D row, got shape {row.shape}")
    if not np.isfinite(row).all():
        raise ValueError("scores: every score must be a finite number")
    if isinstance(factor, (bool, np.bool_)) or not isinstance(
        factor, (int, float, np.integer, np.floating)
    ):
        raise ValueError(f"factor: expected a number, got {factor!r}")
    with np.errstate(over="ignore", invalid="ignore"):
        scaled = row * float(factor)
    if not np.isfinite(scaled).all():
        raise ValueError(f"factor: {factor!r} makes a score overflow or is not finite")
    return _softmax(row), _softmax(scaled)


def row_summary(weights: Sequence[float] | np.ndarray) -> RowSummary:
    """Entropy −Σ p log p (nats, with 0 log 0 = 0) and largest weight of a weight row."""
    p = np.asarray(weights, dtype=np.float64)
    if p.ndim != 1 or p.size == 0:
        raise ValueError(f"weights: expected a non-empty 1-D row, got shape {p.shape}")
    if not (np.isfinite(p).all() and (p >= 0).all()):
        raise ValueError("weights: every weight must be a finite number ≥ 0")
    nonzero = p[p > 0]
    # 0.0 − x rather than −x: a one-hot row has entropy 0.0, not −0.0.
    entropy = 0.0 - float((nonzero * np.log(nonzero)).sum())
    return RowSummary(entropy=entropy, max_weight=float(p.max()))
