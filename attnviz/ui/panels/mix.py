"""Mix dock: concat with its head blocks, W_O, the final output, each head's contribution."""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass

import numpy as np
from PySide6.QtGui import QResizeEvent
from PySide6.QtWidgets import QGridLayout, QLabel, QVBoxLayout, QWidget

from attnviz.core.figures import colors
from attnviz.core.figures.figure import make_spec, spec_for
from attnviz.core.maths.compare import head_contribution
from attnviz.core.maths.engine import Result
from attnviz.ui.heatmap import HeatmapView
from attnviz.ui.panels.common import ResultPanel
from attnviz.ui.view_state import Selection
from attnviz.ui.workspace import Workspace

BOX = "border:1px solid #888; background:#f4f4f4; padding:4px 8px"


def flow_diagram(n: int, d_model: int, heads: int, d_k: int, projections: bool) -> str:
    """The data flow with every shape labelled, as HTML boxes and arrows."""

    def box(name: str, shape: str) -> str:
        return f"<td style='{BOX}' align='center'><b>{name}</b><br>{shape}</td>"

    arrow = "<td align='center' style='padding:0 6px'>→</td>"
    if not projections:
        cells = [box("X", f"{n} × {d_model}"), arrow, box("softmax(X Xᵀ) X", f"{n} × {d_model}")]
    else:
        cells = [
            box("X", f"{n} × {d_model}"),
            arrow,
            box(f"{heads} heads: Q, K, V", f"{heads} × ({n} × {d_k})"),
            arrow,
            box("head outputs", f"{heads} × ({n} × {d_k})"),
            arrow,
            box("concat", f"{n} × {heads * d_k}"),
            arrow,
            box("· W_O", f"{heads * d_k} × {d_model}"),
            arrow,
            box("output", f"{n} × {d_model}"),
        ]
    return f"<table cellspacing='0'><tr>{''.join(cells)}</tr></table>"


@dataclass(frozen=True)
class _Part:
    """One head's contribution as drawn, and what it was made from."""

    output: np.ndarray  # the head's output (the very array)
    W_O: np.ndarray  # the (read-only) W_O whose rows it used
    off: bool  # switched off (ablated): zeros
    values: np.ndarray
    top: float  # the largest |value|


def _made(output: np.ndarray, W_O: np.ndarray, off: bool, values: np.ndarray) -> _Part:
    values.flags.writeable = False
    top = max(-float(values.min()), float(values.max())) if values.size else 0.0
    return _Part(output, W_O, off, values, top)


@functools.lru_cache(maxsize=4)
def concat_features(heads: int, d_k: int) -> tuple[str, ...]:
    """Labels of concat's features (W_O's rows): h1·1 … h1·d_k, h2·1, …"""
    return tuple(f"h{h + 1}·{k + 1}" for h in range(heads) for k in range(d_k))


class MixPanel(ResultPanel):
    def __init__(self, ws: Workspace, parent: QWidget | None = None):
        super().__init__(ws, parent)
        self.diagram = QLabel()
        self.concat, self.w_o, self.final = (
            HeatmapView("concat"),
            HeatmapView("W_O"),
            HeatmapView("final"),
        )
        self.concat.cellClicked.connect(
            lambda _, i, j: ws.view_state.select(Selection("concat", None, i, j))
        )
        self.final.cellClicked.connect(
            lambda _, i, j: ws.view_state.select(Selection("final", None, i, j))
        )
        self.top = QGridLayout()
        for view in (self.concat, self.w_o, self.final):
            view.setMinimumSize(150, 150)
            view.square_cells = True
        self.columns = 0
        self._arrange(3)
        self.parts_grid = QGridLayout()  # the dock scrolls when there are many heads
        self.parts: list[HeatmapView] = []
        self._parts_made: list[_Part] = []
        caption = QLabel(
            "<b>Each head's contribution</b>: its block of concat times its rows of W_O "
            "(shared colour scale). The contributions add up to the output."
        )
        caption.setWordWrap(True)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addWidget(self.diagram)
        layout.addLayout(self.top, 3)
        layout.addWidget(caption)
        layout.addLayout(self.parts_grid, 2)

    def _arrange(self, columns: int) -> None:
        """concat, W_O and the output in a row when wide enough, else two to a row."""
        if columns == self.columns:
            return
        self.columns = columns
        for k, view in enumerate((self.concat, self.w_o, self.final)):
            self.top.removeWidget(view)
            self.top.addWidget(view, k // columns, k % columns)

    def resizeEvent(self, event: QResizeEvent) -> None:
        self._arrange(3 if event.size().width() >= 900 else 2)
        super().resizeEvent(event)

    def show_result(self, r: Result) -> None:
        s = self.compute.result_scenario
        st = r.settings
        self.diagram.setText(
            flow_diagram(len(r.tokens), s.d_model, r.n_heads, r.d_k, st.projections)
        )
        self.concat.set_spec(spec_for(r, "concat"))
        self.concat.mark_column_blocks(r.d_k)
        self.final.set_spec(spec_for(r, "final"))
        self.w_o.setVisible(st.projections)
        if not st.projections:
            self._show_parts([])
            return
        if self.w_o.spec is None or self.w_o.spec.values is not s.W_O:  # (read-only arrays)
            rows = concat_features(r.n_heads, r.d_k)
            spec = make_spec(
                "W_O", s.W_O, rows, row_title="concat feature", col_title="output feature"
            )
            self.w_o.set_spec(spec)
        self._show_parts([self._part(r, s.W_O, h) for h in range(r.n_heads)])

    def _part(self, r: Result, W_O: np.ndarray, h: int) -> _Part:
        """Head h's contribution: the one shown, when made from the same output (the
        very array) and the same rows of W_O (after an edit of one head, or of one row of
        W_O, one head's changes: the others are neither multiplied nor drawn again); that
        one with some rows multiplied again, when fewer than half of the output's rows
        changed (after an edit of a row of X under a causal mask: it and those after it)."""
        block = slice(h * r.d_k, (h + 1) * r.d_k)
        output, off = r.heads[h].output, h in r.settings.ablated
        old = self._parts_made[h] if h < len(self._parts_made) else None
        if (
            old is not None
            and old.off == off
            and (old.W_O is W_O or np.array_equal(old.W_O[block], W_O[block]))
        ):
            if old.output is output:
                return dataclasses.replace(old, W_O=W_O)
            if not off and old.output.shape == output.shape:
                rows = np.flatnonzero((old.output != output).any(axis=1))
                if 2 * len(rows) < len(output):
                    values = old.values.copy()
                    values[rows] = output[rows] @ W_O[block]
                    return _made(output, W_O, off, values)
        return _made(output, W_O, off, head_contribution(r, W_O, h))

    def _show_parts(self, parts: list[_Part]) -> None:
        self._parts_made = parts
        while len(self.parts) > len(parts):
            view = self.parts.pop()
            self.parts_grid.removeWidget(view)
            view.deleteLater()
        while len(self.parts) < len(parts):
            view = HeatmapView("contribution")
            view.setMinimumSize(180, 150)
            view.square_cells = True
            h = len(self.parts)
            self.parts_grid.addWidget(view, h // 4, h % 4)
            self.parts.append(view)
        if not parts:
            return
        # One colour scale for all: from each part's largest |value|, found once
        shared = colors.levels(np.array([part.top for part in parts]), "diverging")
        tokens = self.compute.result.tokens
        for h, (view, part) in enumerate(zip(self.parts, parts, strict=True)):
            title = f"head {h + 1} contribution" + (" (switched off)" if part.off else "")
            spec = make_spec(title, part.values, tokens, col_title="output feature", levels=shared)
            # (min and max carry any NaN or ∞ into top: finite, so is every value)
            view.set_spec(dataclasses.replace(spec, finite=math.isfinite(part.top)))
