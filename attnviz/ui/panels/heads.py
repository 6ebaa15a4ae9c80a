"""Heads dock: every head's weights side by side; click one to show it everywhere; ablate."""

from __future__ import annotations

import dataclasses
import math

from PySide6.QtWidgets import QCheckBox, QGridLayout, QLabel, QVBoxLayout, QWidget

from attnviz.core.figures.figure import spec_for
from attnviz.core.maths.results import Result
from attnviz.ui.heatmap import HeatmapView
from attnviz.ui.panels.common import ResultPanel
from attnviz.ui.view_state import Selection
from attnviz.ui.workspace import Workspace


class HeadsPanel(ResultPanel):
    """Small multiples of the weights (all on the same 0–1 scale), with an on/off per head."""

    def __init__(self, ws: Workspace, parent: QWidget | None = None):
        super().__init__(ws, parent)
        self.views: list[HeatmapView] = []
        self.switches: list[QCheckBox] = []
        self._shape = (0, 1)  # heads, and query heads per key/value head
        self.grid = QGridLayout()  # the dock scrolls when there are many heads
        hint = QLabel(
            "Every head's attention weights, on the same 0–1 scale. Click a head to show it "
            "in the Pipeline; untick it to switch it off in the W_O mix (ablation). Heads "
            "that share keys and values (GQA) sit side by side, a group per row."
        )
        hint.setWordWrap(True)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addWidget(hint)
        layout.addLayout(self.grid)
        ws.view_state.headChanged.connect(lambda _: self._mark_selected())
        ws.view_state.selectionChanged.connect(lambda _: self._mark_selected())

    def _build(self, count: int, group: int) -> None:
        for widget in self.views + self.switches:
            self.grid.removeWidget(widget)
            widget.deleteLater()
        self.views, self.switches = [], []
        self._shape = (count, group)
        # Heads that share keys and values side by side, a group per row (when it fits).
        columns = group if 1 < group <= 4 else max(1, min(4, math.ceil(math.sqrt(count))))
        for h in range(count):
            # Many heads: one colour bar per row of maps (they share the 0–1 scale); a bar
            # per map would leave the maps of a 12-head layer too small to read.
            bar = count <= 4 or h % columns == columns - 1 or h == count - 1
            view = HeatmapView("weights", colorbar=bar)
            # narrower with many heads, so that four columns fit the dock at 1280 × 720
            view.setMinimumSize(160 if count <= 4 else 130, 150)
            view.square_cells = True  # queries and keys alike
            view.setMaximumHeight(420)  # square cells leave a taller view empty
            view.cellClicked.connect(lambda _, i, j, h=h: self._clicked(h, i, j))
            switch = QCheckBox(f"head {h + 1} on")
            switch.setToolTip("Untick to switch this head off in the W_O mix")
            switch.toggled.connect(lambda on, h=h: self._toggle(h, on))
            self.grid.addWidget(view, 2 * (h // columns), h % columns)
            self.grid.addWidget(switch, 2 * (h // columns) + 1, h % columns)
            self.views.append(view)
            self.switches.append(switch)

    def show_result(self, result: Result) -> None:
        s = self.doc.scenario
        shared = result.settings.projections and s.kv_heads != s.n_heads == result.n_heads
        group = result.n_heads // s.kv_heads if shared else 1
        if (result.n_heads, group) != self._shape:
            self._build(result.n_heads, group)
        for h, view in enumerate(self.views):
            spec = spec_for(result, "weights", h)
            off = h in result.settings.ablated and result.settings.projections
            note = " (switched off)" if off else ""
            kv = f" · KV {s.kv_head_of(h) + 1}" if shared else ""
            view.set_spec(dataclasses.replace(spec, caption=f"head {h + 1}{kv}{note}"))
        ablated = result.settings.ablated
        for h, switch in enumerate(self.switches):
            switch.blockSignals(True)
            switch.setChecked(h not in ablated)
            switch.setEnabled(result.settings.projections)
            switch.blockSignals(False)
        self._mark_selected()

    def _mark_selected(self) -> None:
        """Frame the shown head; outline the selected cell in its view only."""
        sel = self.view_state.selection
        for h, view in enumerate(self.views):
            view.select(sel.cell_in("weights", h) if sel else None)
            view.set_framed(h == self.view_state.head)

    def _clicked(self, head: int, row: int, col: int) -> None:
        self.view_state.set_head(head)
        self.view_state.select(Selection("weights", head, row, col))

    def _toggle(self, head: int, on: bool) -> None:
        s = self.doc.scenario
        ablated = set(s.settings.ablated)
        if on:
            ablated.discard(head)
        else:
            ablated.add(head)
        new = s.with_settings(ablated=tuple(sorted(ablated)))
        text = f"{'Switch on' if on else 'Switch off'} head {head + 1}"
        self.doc.replace(new, text)
