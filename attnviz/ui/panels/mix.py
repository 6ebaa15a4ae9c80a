"""Mix dock: concat with its head blocks, W_O, the final output, each head's contribution."""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
from PySide6.QtGui import QResizeEvent
from PySide6.QtWidgets import QGridLayout, QLabel, QVBoxLayout, QWidget

from attnviz.core.figures import colors
from attnviz.core.figures.figure import make_spec, spec_for
from attnviz.core.maths.compare import Contributions, contributions
from attnviz.core.maths.results import Result
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
            view.setMinimumSize(180, 150)
            view.square_cells = True
            h = len(self.parts)
            self.parts_grid.addWidget(view, h // 4, h % 4)
            self.parts.append(view)
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
