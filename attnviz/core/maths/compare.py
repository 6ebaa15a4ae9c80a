"""Teaching comparisons: two mask strategies side by side, the causality probe, the mix.

All functions take a scenario (or a result) and return frozen records of NumPy arrays.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from attnviz.core.maths.forward import compute
from attnviz.core.maths.results import Computed, Result
from attnviz.core.maths.reuse import Base, compute_from
from attnviz.core.maths.scenario import MASKS, Scenario, ScenarioError


@dataclass(frozen=True, eq=False)
class MaskComparison:
    """One head under two mask strategies, a and b (b − a for differences)."""

    head: int
    mask_a: str
    mask_b: str
    result_a: Computed  # holds the head under a (the whole layer, or that head alone)
    result_b: Computed
    weights_a: np.ndarray  # n × n
    weights_b: np.ndarray
    difference: np.ndarray  # weights_b − weights_a
    leak_a: np.ndarray  # per row: total weight on future keys
    leak_b: np.ndarray
    output_shift: np.ndarray  # per row: |head output b − head output a| (Euclidean)
    final_shift: np.ndarray | None  # per row: |final output b − final output a|; None
    # when the results hold the head alone (compared first, before the whole layers)


def compare_masks(
    s: Scenario,
    head: int,
    mask_a: str = "causal",
    mask_b: str = "causal-zero",
    results: Callable[[Scenario], Computed] = compute,
) -> MaskComparison:
    """The selected head under two strategies; ``results`` computes a scenario: the whole
    layer (by default compute), or that head alone (then ``final_shift`` is None)."""
    for mask in (mask_a, mask_b):
        if mask not in MASKS:
            raise ScenarioError(f"mask {mask!r}: expected one of {', '.join(MASKS)}")
    a, b = (
        results(s if s.settings.mask == m else s.with_settings(mask=m)) for m in (mask_a, mask_b)
    )
    if not 0 <= head < a.n_heads:
        raise ScenarioError(f"head {head + 1} does not exist ({a.n_heads} heads)")
    ha, hb = a.head(head), b.head(head)
    final_shift = None
    if isinstance(a, Result) and isinstance(b, Result):
        final_shift = np.linalg.norm(b.final - a.final, axis=1)
    return MaskComparison(
        head=head,
        mask_a=mask_a,
        mask_b=mask_b,
        result_a=a,
        result_b=b,
        weights_a=ha.weights,
        weights_b=hb.weights,
        difference=hb.weights - ha.weights,
        leak_a=ha.leak,
        leak_b=hb.leak,
        output_shift=np.linalg.norm(hb.output - ha.output, axis=1),
        final_shift=final_shift,
    )


@dataclass(frozen=True, eq=False)
class Probe:
    """What nudging one token's x does to every final output row."""

    token: int
    amount: float
    change: np.ndarray  # per row: max |Δ final output|
    changed: np.ndarray  # per row: True where the output moved at all

    @property
    def earlier_rows_changed(self) -> bool:
        """True when a row before the nudged token moved: information flowed backwards."""
        return bool(self.changed[: self.token].any())


def probe(s: Scenario, token: int, amount: float = 0.5, base: Result | None = None) -> Probe:
    """Add amount to every feature of token's x and see which outputs change; ``base``:
    compute(s), if made already (the nudged scenario is then computed from it).

    Under the causal −∞ mask no earlier row can change (exactly: a masked key has weight
    0, and 0 times any value is 0); under causal-zero or no mask, earlier rows move.
    """
    if not 0 <= token < s.n:
        raise ScenarioError(f"token {token + 1} does not exist ({s.n} tokens)")
    before = base if base is not None else compute(s)
    row = s.X[token : token + 1] + amount
    after = compute_from(s.with_cells("X", None, token, 0, row), Base(s, before))
    change = np.abs(after.final - before.final).max(axis=1)
    return Probe(token=token, amount=amount, change=change, changed=change > 0)


def head_contribution(r: Result, W_O: np.ndarray, h: int) -> np.ndarray:
    """(n, d_model): head h's output times its rows of W_O (zeros if it is switched off).
    The heads' contributions add up to the final output but for b_O."""
    if h in r.settings.ablated:
        return np.zeros((len(r.tokens), W_O.shape[1]))
    return r.heads[h].output @ W_O[h * r.d_k : (h + 1) * r.d_k]  # type: ignore[no-any-return]


@dataclass(frozen=True, eq=False)
class Contributions:
    """Every head's contribution to the final output, on one shared colour scale."""

    tokens: tuple[str, ...]
    values: tuple[np.ndarray, ...]  # per head (n, d_model)
    tops: np.ndarray  # per head: the largest |value| (NaN or ∞ when one is)
    ablated: tuple[int, ...]


def contributions(r: Result, W_O: np.ndarray) -> Contributions:
    """Each head's output times its rows of W_O, and the largest |value| of each."""
    values = tuple(head_contribution(r, W_O, h) for h in range(r.n_heads))
    tops = np.array([max(-float(v.min()), float(v.max())) if v.size else 0.0 for v in values])
    for v in values:
        v.flags.writeable = False
    return Contributions(r.tokens, values, tops, r.settings.ablated)
