"""Masks dock: the selected head under two mask strategies, the leak, the causality probe."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
from PySide6.QtCore import QAbstractTableModel, QModelIndex, QSize, Qt
from PySide6.QtGui import QBrush, QColor
from PySide6.QtWidgets import (
    QComboBox,
    QDoubleSpinBox,
    QGridLayout,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QPushButton,
    QTableView,
    QVBoxLayout,
    QWidget,
)

from attnviz.core.figures import colors
from attnviz.core.figures.figure import make_spec, mask_marks, spec_for
from attnviz.core.maths.compare import MaskComparison, Probe, compare_masks, probe
from attnviz.core.maths.results import Computed
from attnviz.core.maths.scenario import MASKS, Scenario
from attnviz.core.scheduler import Results
from attnviz.ui.heatmap import HeatmapView, RowBars, on_screen
from attnviz.ui.matrix_model import Index
from attnviz.ui.panels.common import ScreenPanel
from attnviz.ui.view_state import Selection
from attnviz.ui.workspace import Workspace

LEAK_COLOUR = QColor("#fdd0c7")
GREY = "#7f7f7f"  # a bar that marks nothing
COLUMNS = ("leak A", "leak B", "Δ head output", "Δ output", "probe A", "probe B")
LEGEND = (
    "<span style='background:#ddd'>&nbsp;╱╱&nbsp;</span> set by the mask (it reads what the "
    f"strategy put there) · <b style='color:{colors.LEAK}'>▢ red outline</b>: weight that "
    "leaked to a future key · bars beside each row: its leak, and after a probe how far "
    "its output moved (red: an earlier row, so the future leaked) · <b>B − A</b>: how much "
    "each weight changes when B replaces A (red: more weight on that key, blue: less)"
)


class MasksPanel(ScreenPanel):
    """Compares strategy A (default causal −∞) with B (default causal-zero).

    For each strategy: the scores softmax sees and the weights, masked cells hatched and
    leaked weight outlined, with each row's leak as a bar; then B − A and the probe.
    """

    def __init__(self, ws: Workspace, parent: QWidget | None = None):
        super().__init__(parent)
        self.doc, self.view_state, self.compute = ws.doc, ws.view_state, ws.compute
        self.comparison: MaskComparison | None = None
        self._asked: object = None  # (version, head, masks, busy) of the last question
        self.probes: tuple[Probe, Probe] | None = None
        ws.compute.headReady.connect(lambda _: self.redraw())
        ws.compute.resultChanged.connect(lambda _: self.redraw())
        ws.compute.answered.connect(self._answered)
        ws.compute.queryFailed.connect(self._failed)

        self.mask_a, self.mask_b = QComboBox(), QComboBox()
        for box, default in ((self.mask_a, "causal"), (self.mask_b, "causal-zero")):
            box.addItems(MASKS)
            box.setCurrentText(default)
            box.currentTextChanged.connect(lambda _: self.redraw())
        controls = QHBoxLayout()
        controls.addWidget(QLabel("Strategy A"))
        controls.addWidget(self.mask_a)
        controls.addWidget(QLabel("against B"))
        controls.addWidget(self.mask_b)
        controls.addStretch(1)
        legend = QLabel(LEGEND)
        legend.setWordWrap(True)

        # Every value is written in its cell, so no map carries a colour bar: they keep the
        # same size and all fit beside each other at 1280 × 720.
        self.views = {
            "A-scores": HeatmapView("masked", colorbar=False),
            "B-scores": HeatmapView("masked", colorbar=False),
            "A": HeatmapView("weights", colorbar=False),
            "B": HeatmapView("weights", colorbar=False),
            "diff": HeatmapView("difference", colorbar=False),
        }
        for key, view in self.views.items():
            view.setMinimumSize(150, 140)
            view.preferred = QSize(200, 150)
            view.square_cells = True  # rows and keys alike
            if key != "diff":
                view.cellClicked.connect(lambda name, i, j, key=key: self._select(key, name, i, j))

        self.table_model = ColumnsModel(self)
        self.table = QTableView()
        self.table.setModel(self.table_model)
        self.table.setToolTip(
            "leak: weight on future tokens; Δ: how far the head's output row and the final "
            "output row moved from A to B; probe: how much each final output row changed when "
            "the probed token was nudged (red: an earlier token moved, the future leaked)"
        )
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Stretch)
        self.table.verticalHeader().setDefaultSectionSize(self.table.fontMetrics().height() + 6)
        self.table.setMinimumHeight(110)
        self.table.setMaximumHeight(125)  # more rows than four scroll inside it

        self.token = QComboBox()
        self._probe_tokens: tuple[str, ...] = ()  # the tokens the box offers
        self.amount = QDoubleSpinBox()
        self.amount.setRange(-100, 100)
        self.amount.setValue(0.5)
        self.amount.setSingleStep(0.1)
        nudge = QPushButton("Nudge")
        nudge.setToolTip("Add the amount to every feature of the token's x, under A and under B")
        nudge.clicked.connect(self.run_probe)
        probe_row = QHBoxLayout()
        probe_row.addWidget(self.token)
        probe_row.addWidget(QLabel("+"))
        probe_row.addWidget(self.amount)
        probe_row.addStretch(1)
        self.verdict = QLabel()
        self.verdict.setWordWrap(True)
        probe_text = QLabel(
            "<b>Causality probe</b>: add an amount to one token's x. Does an earlier output "
            f"move? (<span style='color:{colors.PROBE}'>dashed</span>: the nudged key)"
        )
        probe_text.setWordWrap(True)
        side = QVBoxLayout()
        side.addWidget(probe_text)
        side.addLayout(probe_row)
        side.addWidget(nudge, 0, Qt.AlignmentFlag.AlignLeft)
        side.addWidget(self.verdict)
        side.addStretch(1)

        # Three columns, two rows: the whole comparison in sight at 1280 × 720.
        grid = QGridLayout()
        grid.addWidget(self.views["A-scores"], 0, 0)
        grid.addWidget(self.views["B-scores"], 0, 1)
        grid.addWidget(self.views["diff"], 0, 2)
        grid.addWidget(self.views["A"], 1, 0)
        grid.addWidget(self.views["B"], 1, 1)
        grid.addLayout(side, 1, 2)
        for k in range(3):
            grid.setColumnStretch(k, 1)
        for k in range(2):
            grid.setRowStretch(k, 1)

        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addLayout(controls)
        layout.addWidget(legend)
        layout.addLayout(grid, 5)
        layout.addWidget(self.table, 1)
        ws.view_state.headChanged.connect(lambda _: self.redraw())
        ws.view_state.selectionChanged.connect(lambda _: self._mark())

    def redraw(self) -> None:
        """Ask for the comparison of the newest version and the shown head: that head
        alone first (the maps and the head's columns) while the layer is being made,
        then the whole layers (the output's column)."""
        self._stale = not on_screen(self)
        if self._stale:
            return
        head, a, b = self.view_state.head, self.mask_a.currentText(), self.mask_b.currentText()
        asked = (self.compute.version, head, a, b, self.compute.busy)
        if asked == self._asked:
            return
        self._asked = asked
        self._show_tokens(self.compute.scenario.tokens)

        def under(results: Results, whole: bool) -> Callable[[Scenario], Computed]:
            def of(s: Scenario) -> Computed:
                mask = s.settings.mask
                return results.layer(mask=mask) if whole else results.head(head, mask=mask)

            return of

        if self.compute.busy:
            self.compute.ask(
                "masks:head",
                lambda r: (compare_masks(r.scenario, head, a, b, under(r, False)), None),
            )
        self.compute.ask(
            "masks",
            lambda r: (compare_masks(r.scenario, head, a, b, under(r, True)), None),
            needs_layer=True,
        )

    def _show_tokens(self, tokens: tuple[str, ...]) -> None:
        """The probe's tokens (not read back from the box: 512 calls)."""
        if tokens == self._probe_tokens:
            return
        self._probe_tokens = tokens
        current = self.token.currentIndex()
        self.token.clear()
        self.token.addItems(list(tokens))
        self.token.setCurrentIndex(min(max(current, 1 if len(tokens) > 1 else 0), len(tokens) - 1))

    def run_probe(self) -> None:
        token, amount = self.token.currentIndex(), self.amount.value()
        a, b = self.mask_a.currentText(), self.mask_b.currentText()
        head = self.view_state.head

        def job(r: Results) -> tuple[MaskComparison, tuple[Probe, Probe]]:
            c = compare_masks(r.scenario, head, a, b, lambda s: r.layer(mask=s.settings.mask))
            return c, (
                probe(r.under(mask=a), token, amount, r.layer(mask=a)),
                probe(r.under(mask=b), token, amount, r.layer(mask=b)),
            )

        self.compute.ask("masks:probe", job, needs_layer=True)

    def _answered(self, name: str, value: object) -> None:
        if name in ("masks:head", "masks", "masks:probe"):
            self._show(value)  # type: ignore[arg-type]

    def _failed(self, name: str, text: str) -> None:
        if name.startswith("masks"):
            self.verdict.setText(f"<span style='color:#b00'>{text}</span>")

    def _show(self, answer: tuple[MaskComparison, tuple[Probe, Probe] | None]) -> None:
        c, probes = answer
        self.comparison, self.probes = c, probes
        tokens = c.result_a.tokens
        nudged = probes[0].token if probes else None
        strategies = (
            ("A", c.result_a, c.mask_a, c.leak_a, probes[0] if probes else None),
            ("B", c.result_b, c.mask_b, c.leak_b, probes[1] if probes else None),
        )
        for key, result, mask, leak, p in strategies:
            scores = spec_for(result, "masked", c.head)
            title = f"head {c.head + 1} · scores softmax sees under {mask}"
            scores = replace(scores, title=title, caption=f"{key}: {mask} · scores")
            weights = spec_for(result, "weights", c.head)
            _, leaked = mask_marks(
                mask, "weights", weights.values, causal_intent=True, hidden=result.future
            )
            title = f"head {c.head + 1} · weights under {mask}"
            weights = replace(
                weights, title=title, caption=f"{key}: {mask} · weights", leaked=leaked
            )
            views = (self.views[f"{key}-scores"], self.views[key])
            for view, spec in zip(views, (scores, weights), strict=True):
                view.set_spec(spec)
                view.mark_column(nudged)
            views[1].set_row_bars(self._bars(leak, result.head(c.head).row_sum, p, probes))
        diff_title = f"head {c.head + 1} · weights B − A ({c.mask_b} − {c.mask_a})"
        keys = c.result_a.keys  # (the key tokens under cross-attention)
        spec = make_spec(diff_title, c.difference, tokens, keys, "query", "key", caption="B − A")
        diff = self.views["diff"]
        shift = c.output_shift
        bars = [RowBars("Δ out", shift, float(shift.max()), (GREY,) * len(shift))]
        diff.set_spec(spec)
        diff.set_row_bars(bars)
        self._fill_table(c, probes)
        self.verdict.setText(self._verdict(c, probes))

    @staticmethod
    def _bars(
        leak: np.ndarray,
        row_sum: np.ndarray,
        p: Probe | None,
        probes: tuple[Probe, Probe] | None,
    ) -> list[RowBars]:
        """Each row's leak; its sum when it is not 1; how far its output moved when probed."""
        n = len(leak)
        leak_colors = tuple(np.where(leak > 0, colors.LEAK, GREY).tolist())
        bars = [RowBars("leak", leak, 1.0, leak_colors)]
        if np.any(np.abs(row_sum - 1) > 1e-12):
            bars.append(RowBars("Σ", row_sum, 1.0, (GREY,) * n))
        if p is not None and probes is not None:
            limit = max(float(q.change.max()) for q in probes)
            earlier = (np.arange(n) < p.token) & p.changed
            probe_colors = tuple(np.where(earlier, colors.LEAK, colors.PROBE).tolist())
            bars.append(RowBars("probe", p.change, limit, probe_colors))
        return bars

    def _fill_table(self, c: MaskComparison, probes: tuple[Probe, Probe] | None) -> None:
        columns: list[np.ndarray | None] = [c.leak_a, c.leak_b, c.output_shift, c.final_shift]
        if probes:
            columns += [probes[0].change, probes[1].change]
        self.table_model.show(c.result_a.tokens, columns, probes[0].token if probes else None)

    @staticmethod
    def _verdict(c: MaskComparison, probes: tuple[Probe, Probe] | None) -> str:
        leak = float(c.leak_b.max())
        lines = [
            f"Largest leak under B ({c.mask_b}): <b>{leak:.3g}</b> of a row's weight on "
            f"future tokens; under A ({c.mask_a}): <b>{float(c.leak_a.max()):.3g}</b>."
        ]
        if probes:
            token = c.result_a.tokens[probes[0].token]
            for name, p in (("A", probes[0]), ("B", probes[1])):
                moved = [c.result_a.tokens[i] for i in range(len(p.changed)) if p.changed[i]]
                flag = (
                    " <b style='color:#b00'>— an earlier output moved: the future leaked</b>"
                    if p.earlier_rows_changed
                    else " — no earlier output moved"
                )
                moved_text = ", ".join(moved) or "nothing"
                lines.append(f"Nudging <b>{token}</b> under {name} moved: {moved_text}{flag}")
        return "<br>".join(lines)

    def _mark(self) -> None:
        """Outline the selected cell in the view it came from, and nowhere else."""
        sel, c = self.view_state.selection, self.comparison
        for key, view in self.views.items():
            if key == "diff" or c is None:
                view.select(None)
                continue
            mask = c.mask_a if key.startswith("A") else c.mask_b
            view.select(sel.cell_in(view.name, c.head, mask) if sel else None)

    def _select(self, key: str, view: str, row: int, col: int) -> None:
        if self.comparison is None:
            return
        mask = self.comparison.mask_a if key.startswith("A") else self.comparison.mask_b
        self.view_state.select(Selection(view, self.comparison.head, row, col, mask=mask))


class ColumnsModel(QAbstractTableModel):
    """The table under the maps: a row per token, the COLUMNS that are known (the probe's
    once run), each number printed as it is shown (a model, not an item per cell: at 512
    tokens, 3,072 items took 37 ms to make after every edit)."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.tokens: tuple[str, ...] = ()
        self.columns: list[np.ndarray | None] = []  # (None: not known yet, shown as …)
        self.nudged: int | None = None  # the probed token

    def show(
        self, tokens: tuple[str, ...], columns: list[np.ndarray | None], nudged: int | None
    ) -> None:
        """New numbers; for the same tokens as changed data (the view keeps its selection
        and scroll), else a new table."""
        tokens = tuple(tokens)
        if tokens == self.tokens and tokens:
            self.columns, self.nudged = columns, nudged
            last = self.index(len(tokens) - 1, len(COLUMNS) - 1)
            self.dataChanged.emit(self.index(0, 0), last)
            return
        self.beginResetModel()
        self.tokens, self.columns, self.nudged = tokens, columns, nudged
        self.endResetModel()

    def rowCount(self, parent: Index = QModelIndex()) -> int:  # noqa: B008
        return 0 if parent.isValid() else len(self.tokens)

    def columnCount(self, parent: Index = QModelIndex()) -> int:  # noqa: B008
        return 0 if parent.isValid() else len(COLUMNS)

    def data(self, index: Index, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        i, j = index.row(), index.column()
        known = j < len(self.columns)  # (a known column may wait for its numbers: None)
        column = self.columns[j] if known else None
        if role == Qt.ItemDataRole.DisplayRole:
            if column is None:
                return "…" if known else ""
            return f"{column[i]:.4g}"
        if role == Qt.ItemDataRole.TextAlignmentRole:
            return Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter
        if role == Qt.ItemDataRole.BackgroundRole and column is not None and column[i] > 0:
            leaky = j < 2  # weight on future keys
            earlier = j >= 4 and self.nudged is not None and i < self.nudged  # moved before it
            if leaky or earlier:
                return QBrush(LEAK_COLOUR)
        return None

    def headerData(
        self, section: int, orientation: Qt.Orientation, role: int = Qt.ItemDataRole.DisplayRole
    ) -> Any:
        if role != Qt.ItemDataRole.DisplayRole:
            return None
        if orientation == Qt.Orientation.Horizontal:
            return COLUMNS[section]
        return self.tokens[section]
