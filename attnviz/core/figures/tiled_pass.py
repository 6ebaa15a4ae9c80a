"""A tiled pass prepared for the Tiling dock: the pass, the float64 pass to compare
with, and the dense scores it is drawn over (attnviz.core.maths.tiling runs the pass)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from attnviz.core.figures import colors
from attnviz.core.figures.figure import HeatmapSpec, spec_for
from attnviz.core.maths.results import Result
from attnviz.core.maths.scenario import Scenario, ScenarioError
from attnviz.core.maths.tiling import Tiling, check_supported, tiles

MAX_TILES = 4096  # the stepper keeps every tile
MAX_NUMBERS = 1 << 23  # numbers kept over all tiles (scores, P, O, m, l): 64 MB


@dataclass(frozen=True, eq=False)
class Pass:
    """A tiled pass and what the dock shows beside it."""

    tiling: Tiling
    exact: Tiling  # the same pass in float64 (itself when the precision is float64)
    scores: HeatmapSpec  # the dense scores softmax sees, for display only
    dense: np.ndarray  # the dense engine's output of the head
    tokens: tuple[str, ...]
    o_levels: tuple[float, float]  # one colour scale for O over the whole pass


def prepare(
    s: Scenario,
    head: int,
    block_q: int,
    block_k: int,
    precision: str,
    reference: Callable[[Scenario], Result],
) -> Pass:
    """Run the pass (and the float64 one to compare with); refuse what it cannot step."""
    check_supported(s)
    d = s.d_k if s.settings.projections else s.d_model
    count = math.ceil(s.n / block_q) * math.ceil(s.m / block_k)
    if count > MAX_TILES:
        raise ScenarioError(
            f"B_r = {block_q}, B_c = {block_k} make {count:,} tiles of this {s.n} × {s.m} "
            f"matrix; the stepper keeps every tile, up to {MAX_TILES:,}: raise B_r and B_c"
        )
    if 2 * s.n * s.m + count * block_q * (d + 6) > MAX_NUMBERS:
        raise ScenarioError(
            f"{s.n} × {s.m} scores are too many to keep every tile; `attnviz tiles` runs "
            "the pass on the command line"
        )
    result = reference(s)
    t = tiles(s, head, block_q, block_k, precision)
    exact = t if precision == "float64" else tiles(s, head, block_q, block_k)
    top = max((float(np.abs(x.O).max()) for x in t.steps if x.O.size), default=0.0)
    spec = spec_for(result, "masked", head)
    caption = f"head {head + 1} · scores S, tiles of {block_q} × {block_k}"
    spec = dataclasses.replace(spec, caption=caption, title=caption)
    levels = colors.levels(np.array([top]), "diverging")
    return Pass(t, exact, spec, result.heads[head].output, result.tokens, levels)
