"""Masks dock: the selected head under two mask strategies, the leak, the causality probe."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QBrush, QColor
from PySide6.QtWidgets import (
    QComboBox,
    QDoubleSpinBox,
    QGridLayout,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from attnviz.core.compare import MaskComparison, Probe, compare_masks, probe
from attnviz.core.engine import Result
from attnviz.core.figure import make_spec
from attnviz.core.scenario import MASKS
from attnviz.ui.background import Background
from attnviz.ui.document import Document, Selection, computes_at_once
from attnviz.ui.heatmap import HeatmapView
from attnviz.ui.panels.common import ResultPanel

LEAK_COLOUR = QColor("#fdd0c7")
COLUMNS = ("leak A", "leak B", "Δ head output", "Δ output", "probe A", "probe B")


class MasksPanel(ResultPanel):
    """Compares strategy A (default causal −∞) with B (default causal-zero)."""

    def __init__(self, doc: Document, parent: QWidget | None = None):
        super().__init__(doc, parent)
        self.comparison: MaskComparison | None = None
        self.probes: tuple[Probe, Probe] | None = None
        self.worker = Background(self)
        self.worker.done.connect(self._show)
        self.worker.failed.connect(self.note_error)

        self.mask_a, self.mask_b = QComboBox(), QComboBox()
        for box, default in ((self.mask_a, "causal"), (self.mask_b, "causal-zero")):
            box.addItems(MASKS)
            box.setCurrentText(default)
            box.currentTextChanged.connect(lambda _: self.redraw())
        controls = QHBoxLayout()
        controls.addWidget(QLabel("A"))
        controls.addWidget(self.mask_a)
        controls.addWidget(QLabel("against B"))
        controls.addWidget(self.mask_b)
        controls.addStretch(1)

        self.views = {
            "A": HeatmapView("weights"),
            "B": HeatmapView("weights"),
            "diff": HeatmapView("difference"),
        }
        self.views["A"].cellClicked.connect(lambda _, i, j: self._select("A", i, j))
        self.views["B"].cellClicked.connect(lambda _, i, j: self._select("B", i, j))
        grid = QGridLayout()
        for k, view in enumerate(self.views.values()):
            grid.addWidget(view, 0, k)

        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        self.table.setToolTip(
            "leak: weight on future tokens; Δ: how far the head's output row and the final "
            "output row moved from A to B; probe: how much each final output row changed when "
            "the probed token was nudged (red: an earlier token moved, the future leaked)"
        )
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Stretch)

        self.token = QComboBox()
        self.amount = QDoubleSpinBox()
        self.amount.setRange(-100, 100)
        self.amount.setValue(0.5)
        self.amount.setSingleStep(0.1)
        nudge = QPushButton("Nudge")
        nudge.setToolTip("Add the amount to every feature of the token's x, under A and under B")
        nudge.clicked.connect(self.run_probe)
        probe_row = QHBoxLayout()
        probe_row.addWidget(QLabel("Causality probe: nudge"))
        probe_row.addWidget(self.token)
        probe_row.addWidget(QLabel("by"))
        probe_row.addWidget(self.amount)
        probe_row.addWidget(nudge)
        probe_row.addStretch(1)
        self.verdict = QLabel()
        self.verdict.setWordWrap(True)

        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addLayout(controls)
        layout.addLayout(grid, 3)
        layout.addLayout(probe_row)
        layout.addWidget(self.verdict)
        layout.addWidget(self.table, 2)
        doc.headChanged.connect(lambda _: self.redraw())
        doc.selectionChanged.connect(lambda _: self._mark())

    def show_result(self, r: Result) -> None:
        """Recompute the comparison for the current scenario and head."""
        self.probes = None
        s, head = self.doc.result_scenario, self.doc.head
        a, b = self.mask_a.currentText(), self.mask_b.currentText()
        tokens = list(s.tokens)
        if [self.token.itemText(i) for i in range(self.token.count())] != tokens:
            current = self.token.currentIndex()
            self.token.clear()
            self.token.addItems(tokens)
            self.token.setCurrentIndex(
                min(max(current, 1 if len(tokens) > 1 else 0), len(tokens) - 1)
            )
        self.worker.run(
            lambda: (compare_masks(s, head, a, b, base=r), None),
            now=computes_at_once(self.doc.scenario),
        )

    def run_probe(self) -> None:
        s, token, amount = self.doc.result_scenario, self.token.currentIndex(), self.amount.value()
        a, b = self.mask_a.currentText(), self.mask_b.currentText()
        head, r = self.doc.head, self.doc.result

        def job() -> tuple[MaskComparison, tuple[Probe, Probe]]:
            return compare_masks(s, head, a, b, base=r), (
                probe(s.with_settings(mask=a), token, amount),
                probe(s.with_settings(mask=b), token, amount),
            )

        self.worker.run(job, now=computes_at_once(self.doc.scenario))

    def note_error(self, text: str) -> None:
        self.verdict.setText(f"<span style='color:#b00'>{text}</span>")

    def _show(self, answer: tuple[MaskComparison, tuple[Probe, Probe] | None]) -> None:
        c, probes = answer
        self.comparison, self.probes = c, probes
        tokens = c.result_a.tokens
        for key, weights, mask in (("A", c.weights_a, c.mask_a), ("B", c.weights_b, c.mask_b)):
            title = f"head {c.head + 1} · weights under {mask}"
            spec = make_spec(
                title, weights, tokens, tokens, "query", "key", "sequential", f"{key}: {mask}"
            )
            self.views[key].set_spec(spec)
        diff_title = f"head {c.head + 1} · weights B − A ({c.mask_b} − {c.mask_a})"
        spec = make_spec(diff_title, c.difference, tokens, tokens, "query", "key", caption="B − A")
        self.views["diff"].set_spec(spec)
        self._fill_table(c, probes)
        self.verdict.setText(self._verdict(c, probes))

    def _fill_table(self, c: MaskComparison, probes: tuple[Probe, Probe] | None) -> None:
        tokens = c.result_a.tokens
        self.table.setRowCount(len(tokens))
        self.table.setVerticalHeaderLabels(list(tokens))
        columns = [c.leak_a, c.leak_b, c.output_shift, c.final_shift]
        if probes:
            columns += [probes[0].change, probes[1].change]
        for j in range(len(COLUMNS)):
            for i in range(len(tokens)):
                text = f"{columns[j][i]:.4g}" if j < len(columns) else ""
                item = QTableWidgetItem(text)
                item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
                leaky = j < 2 and columns[j][i] > 0
                earlier = (
                    probes is not None and j >= 4 and i < probes[0].token and columns[j][i] > 0
                )
                if leaky or earlier:
                    item.setBackground(QBrush(LEAK_COLOUR))
                self.table.setItem(i, j, item)

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
        """Outline the selected cell in the view of its mask, and nowhere else."""
        sel, c = self.doc.selection, self.comparison
        for key, mask in (("A", c.mask_a if c else None), ("B", c.mask_b if c else None)):
            mine = (
                sel is not None
                and c is not None
                and sel.view == "weights"
                and sel.head == c.head
                and sel.mask == mask
            )
            self.views[key].select((sel.row, sel.col) if mine and sel is not None else None)

    def _select(self, key: str, row: int, col: int) -> None:
        if self.comparison is None:
            return
        mask = self.comparison.mask_a if key == "A" else self.comparison.mask_b
        self.doc.select(Selection("weights", self.comparison.head, row, col, mask=mask))
