"""RoPE dock: each pair's frequency, the angle at each position, one pair turning with
position, and a live check that rotated scores depend only on the offset i − j."""

from __future__ import annotations

import dataclasses

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QPushButton,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from attnviz.core.figures.figure import make_spec
from attnviz.core.maths.results import Result
from attnviz.core.maths.rotary import angles, pairs, shift_change, turned_pair, width
from attnviz.core.maths.scenario import Settings
from attnviz.ui.heatmap import HeatmapView
from attnviz.ui.panels.common import ResultPanel, int_spin
from attnviz.ui.plotting import pg
from attnviz.ui.workspace import Workspace

OFF = (
    "RoPE is off. Choose Position → rope on the toolbar (or load the llama-style preset) "
    "to rotate each head's queries and keys by their positions."
)


class RopePanel(ResultPanel):
    """What rotary position embeddings do, on the scenario's own numbers."""

    def __init__(self, ws: Workspace, parent: QWidget | None = None):
        super().__init__(ws, parent)
        self.status = QLabel(OFF)
        self.status.setWordWrap(True)
        self.table = QTableWidget(0, 3)
        self.table.setHorizontalHeaderLabels(["features", "speed (rad/pos)", "one turn"])
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.table.verticalHeader().hide()
        self.table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        self.table.setToolTip(
            "Each pair of features turns at its own speed, base^(−2i/r) radians per position: "
            "the first pairs spin fast (they tell near positions apart), the last slowly"
        )
        self.angle_view = HeatmapView("rope-angles")
        self.plot = pg.PlotWidget(background="w")
        self.plot.setAspectLocked(True)
        self.plot.showGrid(x=True, y=True, alpha=0.3)
        self.plot.setLabel("bottom", "first feature of the pair")
        self.plot.setLabel("left", "second feature")
        self.plot.setMinimumHeight(220)

        controls = QHBoxLayout()
        controls.addWidget(QLabel("token"))
        self.token = int_spin(1, 1, "The query token whose pair is drawn")
        self.token.valueChanged.connect(lambda _: self.redraw())
        controls.addWidget(self.token)
        controls.addWidget(QLabel("pair"))
        self.pair = int_spin(1, 1, "Which pair of features (1 turns fastest)")
        self.pair.valueChanged.connect(lambda _: self.redraw())
        controls.addWidget(self.pair)
        controls.addStretch(1)

        shift_row = QHBoxLayout()
        shift_row.addWidget(QLabel("Shift every position by"))
        self.shift = int_spin(0, 100_000, "How far to move every query and key position")
        self.shift.setValue(1000)
        shift_row.addWidget(self.shift)
        check = QPushButton("Check the scores")
        check.setToolTip("Recompute this head's scores with every position moved")
        check.clicked.connect(self.check_shift)
        shift_row.addWidget(check)
        shift_row.addStretch(1)
        self.shift_result = QLabel()
        self.shift_result.setWordWrap(True)

        top = QSplitter(Qt.Orientation.Horizontal)
        top.addWidget(self.table)
        top.addWidget(self.angle_view)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addWidget(self.status)
        layout.addWidget(top, 1)
        layout.addLayout(shift_row)
        layout.addWidget(self.shift_result)
        layout.addLayout(controls)
        layout.addWidget(self.plot, 1)
        ws.view_state.headChanged.connect(lambda _: self.redraw())

    def show_result(self, result: Result) -> None:
        s = self.doc.scenario
        st = s.settings
        on = st.positional == "rope"
        for widget in (self.table, self.angle_view, self.plot):
            widget.setVisible(on)
        self.shift_result.clear()
        if not on:
            self.status.setText(OFF)
            return
        p = pairs(st, width(s))
        count = len(p.frequency)
        head = min(self.view_state.head, s.n_heads - 1)
        self.status.setText(
            f"<b>RoPE</b> on head {head + 1}: {count} pair(s) of features turn by position "
            f"({rope_source(st)}, {st.rope_style} pairs). A pair at position p (from 1, "
            "like rows) turns by (p − 1) × its frequency; a query and a key turned by their "
            "own positions meet at an angle that depends only on how far apart they are."
        )
        if not count:
            return
        labels = tuple(f"{a + 1}&{b + 1}" for a, b in zip(p.first, p.second, strict=True))
        self.table.setRowCount(count)
        for row, cells in enumerate(zip(labels, p.frequency, p.wavelength, strict=True)):
            texts = (cells[0], f"{cells[1]:.4g}", f"{cells[2]:.4g} positions")
            for col, text in enumerate(texts):
                self.table.setItem(row, col, QTableWidgetItem(text))
        theta = angles(s)
        spec = make_spec(
            "angle θ = (position − 1) × speed",
            theta,
            tuple(s.tokens),
            labels,
            "query",
            "pair",
            "sequential",
        )
        self.angle_view.set_spec(
            dataclasses.replace(spec, levels=(0.0, max(float(theta.max()), 1e-12)))
        )
        for spin, most in ((self.token, s.n), (self.pair, count)):
            spin.blockSignals(True)  # clamping to a new maximum would emit and redraw
            spin.setMaximum(most)
            spin.blockSignals(False)
        self._draw_pair(head, self.token.value() - 1, self.pair.value() - 1)

    def _draw_pair(self, head: int, token: int, pair: int) -> None:
        s = self.doc.scenario
        points, own = turned_pair(s, head, token, pair)
        self.plot.clear()
        self.plot.plot(points[:, 0], points[:, 1], pen=pg.mkPen("#9e9ac8", width=1))
        for pos, (a, b) in enumerate(points):
            current = pos == own
            colour = "#e6550d" if current else "#3182bd"
            self.plot.plot([0, a], [0, b], pen=pg.mkPen(colour, width=3 if current else 1))
            label = pg.TextItem(f"p{pos + 1}", color=colour, anchor=(0.5, 1.2))
            label.setPos(a, b)
            self.plot.addItem(label)
        self.plot.setTitle(
            f"query {token + 1} ({s.tokens[token]}), pair {pair + 1}: the same vector "
            f"turned to each position (its own, {own + 1}, in orange)"
        )

    def check_shift(self) -> None:
        s = self.doc.scenario
        if s.settings.positional != "rope":
            self.shift_result.setText(OFF)
            return
        head = min(self.view_state.head, s.n_heads - 1)
        k = self.shift.value()
        change = shift_change(s, head, k)
        self.shift_result.setText(
            f"Every position moved by {k}: head {head + 1}'s raw scores changed by at most "
            f"{change:.1e}, rounding only. RoPE scores depend on the offset i − j alone."
        )


def rope_source(st: Settings) -> str:
    """Where the frequencies come from: the base, or the model's own (scaled RoPE)."""
    if st.rope_frequencies is None and st.rope_factor == 1.0:
        return f"base {st.rope_base:g}"
    own = (
        "the model's own frequencies"
        if st.rope_frequencies is not None
        else f"base {st.rope_base:g}"
    )
    return own if st.rope_factor == 1.0 else f"{own}, cos and sin × {st.rope_factor:.4g}"
