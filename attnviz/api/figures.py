"""Figures of any view: SVG from the core's heatmap writer, PNG as ``attnviz export`` makes
it (Qt's SVG renderer, imported when a PNG is asked for, never before)."""

from __future__ import annotations

import functools
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnviz.api.scenarios import Computation, PathLike
from attnviz.core.figures.figure import VIEWS, HeatmapSpec, spec_for, svg_size, to_svg
from attnviz.core.io.files import atomic_write
from attnviz.core.maths.forward import one_head
from attnviz.core.maths.results import HEAD_MATRICES, TURNED_MATRICES
from attnviz.core.maths.scenario import Scenario, ScenarioError
from attnviz.core.maths.streaming import layer


@dataclass(frozen=True, eq=False)
class Figure:
    """One heatmap; shows inline in a notebook (SVG) and saves as SVG or PNG."""

    spec: HeatmapSpec

    @property
    def title(self) -> str:
        return self.spec.title

    @functools.cached_property
    def svg(self) -> str:
        """The figure as an SVG document."""
        return to_svg(self.spec)

    def _repr_svg_(self) -> str:
        return self.svg

    def to_png(self, scale: float = 2.0) -> bytes:
        """The figure as PNG bytes, ``scale`` pixels per SVG unit (renders with Qt)."""
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "figure.png"
            self.save(path, scale)
            return path.read_bytes()

    def save(self, path: PathLike, scale: float = 2.0) -> Path:
        """Write the figure as SVG or PNG, by the suffix (as ``attnviz export`` does; a
        PNG is ``scale`` pixels per SVG unit). Returns the path."""
        suffix = Path(path).suffix.lower()
        if suffix == ".svg":
            svg_size(self.svg)  # well-formed, or an error and no file
            atomic_write(path, self.svg.encode("utf-8"))
        elif suffix == ".png":
            from attnviz.api.window import qt_app

            qt_app()
            from attnviz.ui.images import write_png

            write_png(self.spec, path, scale)
        else:
            raise ValueError(f"{Path(path).name}: expected a .svg or .png file name")
        return Path(path)


def scenario_of(source: Any) -> Scenario:
    """The scenario of a Scenario, a Computation or a result holding one (``.scenario``)."""
    scenario = source if isinstance(source, Scenario) else getattr(source, "scenario", None)
    if not isinstance(scenario, Scenario):
        raise TypeError(
            f"expected a Scenario or something holding one (.scenario), got {type(source).__name__}"
        )
    return scenario


def figure(source: Any, view: str = "weights", head: int = 1) -> Figure:
    """The heatmap of one view of a scenario (or a Computation, or an imported or
    captured layer): ``view`` is one of ``VIEWS`` (Q, K, V, Q_rot, K_rot, scores, scaled,
    masked, weights, output, X, concat, final); ``head`` counts from 1, as the figure and
    the window label heads. Only the head shown is computed."""
    if view not in VIEWS:
        raise ScenarioError(f"view {view!r}: expected one of {', '.join(VIEWS)}")
    s = scenario_of(source)
    count = s.n_heads if s.settings.projections else 1
    if not 1 <= head <= count:
        raise ScenarioError(f"head {head}: the scenario has heads 1 to {count}")
    per_head = view in (*HEAD_MATRICES, *TURNED_MATRICES, "X")
    if isinstance(source, Computation):
        return Figure(spec_for(source.result, view, head - 1))
    if per_head:
        return Figure(spec_for(one_head(s, head - 1), view, head - 1))
    return Figure(spec_for(layer(s), view))  # concat and final: no n × n matrix kept
