"""Mix dock: concat with its head blocks, W_O, the final output, each head's contribution."""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np
from PySide6.QtGui import QFont, QResizeEvent, QTextDocument
from PySide6.QtWidgets import QGridLayout, QLabel, QSizePolicy, QVBoxLayout, QWidget

from attnviz.core.figures import colors
from attnviz.core.figures.figure import make_spec, spec_for
from attnviz.core.maths.compare import Contributions, contributions
from attnviz.core.maths.results import Result
from attnviz.ui.heatmap import HeatmapView
from attnviz.ui.panels.common import ResultPanel
from attnviz.ui.view_state import Selection
from attnviz.ui.workspace import Workspace

BOX = "border:1px solid #888; background:#f4f4f4; padding:4px 8px"
GAP = 6  # pixels between the contribution maps (the grid's spacing)
PART_WIDTH = 180  # pixels: a contribution map no narrower


def flow_diagram(
    n: int, d_model: int, heads: int, d_k: int, projections: bool, per_line: int = 6
) -> str:
    """The data flow with every shape labelled, as HTML boxes and arrows, so many boxes
    to a line."""

    def box(name: str, shape: str) -> str:
        return f"<td style='{BOX}' align='center'><b>{name}</b><br>{shape}</td>"

    arrow = "<td align='center' style='padding:0 6px'>→</td>"
    if not projections:
        boxes = [box("X", f"{n} × {d_model}"), box("softmax(X Xᵀ) X", f"{n} × {d_model}")]
    else:
        boxes = [
            box("X", f"{n} × {d_model}"),
            box(f"{heads} heads: Q, K, V", f"{heads} × ({n} × {d_k})"),
            box("head outputs", f"{heads} × ({n} × {d_k})"),
            box("concat", f"{n} × {heads * d_k}"),
            box("· W_O", f"{heads * d_k} × {d_model}"),
            box("output", f"{n} × {d_model}"),
        ]
    lines = [boxes[k : k + per_line] for k in range(0, len(boxes), per_line)]
    return "".join(
        f"<table cellspacing='0'><tr>{arrow.join(line)}{arrow if k < len(lines) - 1 else ''}"
        "</tr></table>"
        for k, line in enumerate(lines)
    )


def fitting_diagram(width: float, font: QFont, flow: tuple[int, int, int, int, bool]) -> str:
    """The flow diagram of (n, d_model, heads, d_k, projections) with as many boxes to a
    line as fit in width pixels."""
    document = QTextDocument()
    document.setDefaultFont(font)
    html = ""
    for per_line in range(6, 0, -1):
        html = flow_diagram(*flow, per_line=per_line)
        document.setHtml(html)
        if document.idealWidth() <= width:
            break
    return html


def columns_for(count: int, width: int, least: int) -> int:
    """Maps to a row: as few rows as width allows maps of least pixels, then as few
    columns as those rows need (four maps in a 2 × 2, not 3 + 1)."""
    most = max(1, min(4, (width + GAP) // (least + GAP)))
    rows = math.ceil(count / most) if count else 1
    return max(1, math.ceil(count / rows))


@functools.lru_cache(maxsize=4)
def concat_features(heads: int, d_k: int) -> tuple[str, ...]:
    """Labels of concat's features (W_O's rows): h1·1 … h1·d_k, h2·1, …"""
    return tuple(f"h{h + 1}·{k + 1}" for h in range(heads) for k in range(d_k))


class MixPanel(ResultPanel):
    def __init__(self, ws: Workspace, parent: QWidget | None = None):
        super().__init__(ws, parent)
        self.diagram = QLabel()
        # As wide as the panel, never wider: its boxes go on as many lines as they need.
        self.diagram.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self._flow: tuple[int, int, int, int, bool] | None = None
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
        self.parts_grid.setSpacing(GAP)
        self.part_columns = 0
        self.parts: list[HeatmapView] = []
        caption = QLabel(
            "<b>Each head's contribution</b>: its block of concat times its rows of W_O "
            "(shared colour scale). The contributions add up to the output."
        )
        caption.setWordWrap(True)
        ws.compute.answered.connect(self._answered)
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

    def _arrange_parts(self, width: int) -> None:
        """The contribution maps in as many columns as fit the width (at most four)."""
        columns = columns_for(len(self.parts), width, PART_WIDTH)
        if columns == self.part_columns:
            return
        self.part_columns = columns
        for h, view in enumerate(self.parts):
            self.parts_grid.removeWidget(view)
            self.parts_grid.addWidget(view, h // columns, h % columns)

    def _draw_diagram(self, width: int) -> None:
        if self._flow is not None:
            room = width - 2 * 4 - 8  # the panel's margins, and a little slack
            self.diagram.setText(fitting_diagram(room, self.diagram.font(), self._flow))

    def resizeEvent(self, event: QResizeEvent) -> None:
        width = event.size().width()
        self._arrange(3 if width >= 900 else 2)
        self._arrange_parts(width)
        self._draw_diagram(width)
        super().resizeEvent(event)

    def show_result(self, r: Result) -> None:
        s = self.compute.result_scenario
        st = r.settings
        self._flow = (len(r.tokens), s.d_model, r.n_heads, r.d_k, st.projections)
        self._draw_diagram(self.width())
        self.concat.set_spec(spec_for(r, "concat"))
        self.concat.mark_column_blocks(r.d_k)
        self.final.set_spec(spec_for(r, "final"))
        self.w_o.setVisible(st.projections)
        if not st.projections:
            self._show_parts(None)
            return
        rows = concat_features(r.n_heads, r.d_k)
        spec = make_spec("W_O", s.W_O, rows, row_title="concat feature", col_title="output feature")
        self.w_o.set_spec(spec)
        self.compute.ask("mix", lambda results: contributions(results.layer(), s.W_O), True)

    def _answered(self, name: str, value: object) -> None:
        if name == "mix":
            self._show_parts(value)  # type: ignore[arg-type]

    def _show_parts(self, parts: Contributions | None) -> None:
        count = 0 if parts is None else len(parts.values)
        while len(self.parts) > count:
            view = self.parts.pop()
            self.parts_grid.removeWidget(view)
            view.deleteLater()
        while len(self.parts) < count:
            view = HeatmapView("contribution")
            view.setMinimumSize(PART_WIDTH, 150)
            view.square_cells = True
            self.parts.append(view)
        self.part_columns = 0  # placed again
        self._arrange_parts(self.width())
        if parts is None:
            return
        # One colour scale for all, from each part's largest |value|; min and max carry
        # any NaN or ∞ into them: finite, so is every value.
        levels = colors.levels(parts.tops, "diverging")
        finite = bool(np.isfinite(parts.tops).all())
        for h, (view, values) in enumerate(zip(self.parts, parts.values, strict=True)):
            off = h in parts.ablated
            title = f"head {h + 1} contribution" + (" (switched off)" if off else "")
            spec = make_spec(title, values, parts.tokens, col_title="output feature", levels=levels)
            view.set_spec(dataclasses.replace(spec, finite=finite))
