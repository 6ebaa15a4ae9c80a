"""Experiments dock: scaling and saturation, position and permutation, the KV cache."""

from __future__ import annotations

import math
from html import escape
from typing import Any

import numpy as np
from PySide6.QtCore import Qt
from PySide6.QtGui import QFontMetricsF
from PySide6.QtWidgets import (
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QSlider,
    QTableWidget,
    QTableWidgetItem,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from attnviz.core.figures.chart import PALETTE
from attnviz.core.io.text import parse_table
from attnviz.core.maths.experiments import (
    GradientGain,
    Permutation,
    ScalingStats,
    gradient_gain,
    permutation,
    row_summary,
    saturation,
    scaling_variance,
    softmax_gradient,
)
from attnviz.core.maths.forward import compute
from attnviz.core.maths.kvcache import KVCache, Step
from attnviz.core.maths.scenario import permute_tokens
from attnviz.core.scheduler import Results
from attnviz.ui.background import Background
from attnviz.ui.panels.common import int_spin
from attnviz.ui.plotting import pg
from attnviz.ui.workspace import Workspace

D_KS = (2, 64, 512)
GRADIENT_D_KS = (1, 4, 16, 64, 256, 1024)
# Okabe–Ito (colour-blind safe), as the timing plots: blue, vermillion.
BLUE, VERMILLION = PALETTE[0], PALETTE[1]


def bars(
    plot: pg.PlotItem, values: np.ndarray, x: np.ndarray, colour: str, width: float = 0.4
) -> None:
    plot.addItem(pg.BarGraphItem(x=x, height=values, width=width, brush=colour))


def head_colours(heads: int) -> list[str]:
    """Colour-blind-safe colours, one per head: Okabe–Ito, or cividis beyond eight."""
    if heads <= len(PALETTE):
        return list(PALETTE[:heads])
    cmap = pg.colormap.get("cividis")
    return [cmap.map(h / (heads - 1), mode="qcolor").name() for h in range(heads)]


def legend_html(entries: list[tuple[str, str]]) -> str:
    """A legend as one line of text: a coloured square and a name per entry, which wraps
    between entries only."""
    return "&nbsp;&nbsp; ".join(
        f"<span style='color:{colour}'>■</span>&nbsp;{escape(name).replace(' ', '&nbsp;')}"
        for name, colour in entries
    )


def legend_label(entries: list[tuple[str, str]] | None = None) -> QLabel:
    """A legend under a plot: outside it, so that it never covers a bar."""
    label = QLabel(legend_html(entries or []))
    label.setWordWrap(True)
    return label


class IndexAxis(pg.AxisItem):  # type: ignore[misc]  # (pyqtgraph has no types)
    """An axis of whole-number positions (bars, tokens): ticks at integers only, each named
    by its label, spaced so that no two labels overlap."""

    def __init__(self, orientation: str = "bottom"):
        super().__init__(orientation)
        self.labels: list[str] = []
        # Room for labels only grows: shrunk to fit no labels (or to pyqtgraph's 0.8 of a
        # label's height) it would cut off descenders, the _ of d_k.
        self.setStyle(autoReduceTextSpace=False)

    def set_labels(self, labels: list[str]) -> None:
        self.labels = list(labels)
        self.picture = None  # drawn anew
        self.update()

    def tickValues(self, minVal: float, maxVal: float, size: float) -> list[Any]:
        lo, hi = sorted((minVal, maxVal))
        first, last = max(0, math.ceil(lo)), min(len(self.labels) - 1, math.floor(hi))
        if last < first or size <= 0:
            return []
        font = QFontMetricsF(self.style["tickFont"] or self.font())
        widest = max(font.horizontalAdvance(self.labels[i]) for i in range(first, last + 1))
        per_unit = size / max(hi - lo, 1e-9)  # px per position
        for step in (m * 10**k for k in range(12) for m in (1, 2, 5)):
            if step * per_unit > widest + 6:
                break
        start = math.ceil(first / step) * step
        return [(float(step), [float(v) for v in range(start, last + 1, step)])]

    def tickStrings(self, values: list[float], scale: float, spacing: float) -> list[str]:
        return [self.labels[int(v)] if 0 <= int(v) < len(self.labels) else "" for v in values]


def table_item(text: str) -> QTableWidgetItem:
    item = QTableWidgetItem(text)
    item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
    return item


class ScalingTab(QWidget):
    """Variance of q·k with and without ÷√d_k, and softmax saturation."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.pairs = int_spin(1, 1_000_000, value=20_000, separators=True, commit_only=False)
        self.seed = int_spin(0, 2**31 - 1, commit_only=False)
        run = QPushButton("Run")
        run.clicked.connect(self.run)
        form = QHBoxLayout()
        for label, widget in (("random pairs", self.pairs), ("seed", self.seed)):
            form.addWidget(QLabel(label))
            form.addWidget(widget)
        form.addWidget(run)
        form.addStretch(1)
        self.table = QTableWidget(len(D_KS), 5)
        self.table.setHorizontalHeaderLabels(
            ["d_k", "mean q·k", "var q·k", "mean q·k/√d_k", "var q·k/√d_k"]
        )
        self.table.verticalHeader().hide()
        self.table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        self.variance_axis = IndexAxis()
        self.variance_plot = pg.PlotWidget(
            title="variance of q·k, log scale", axisItems={"bottom": self.variance_axis}
        )
        self.variance_legend = legend_label([("q·k", VERMILLION), ("q·k ÷ √d_k", BLUE)])
        decades = [(k + 1, f"{10.0**k:g}") for k in range(-1, 5)]
        self.variance_plot.getPlotItem().getAxis("left").setTicks([decades])
        self.status = QLabel()
        self.worker = Background(self)
        self.worker.done.connect(self.show_stats)
        self.worker.failed.connect(self.status.setText)

        self.scores = QLineEdit("2, 1, 0, -1")
        self.scores.setToolTip("A row of scores, separated by commas or spaces")
        self.factor = QSlider(Qt.Orientation.Horizontal)
        self.factor.setRange(1, 160)  # tenths: 0.1 to 16
        self.factor.setValue(80)
        self.factor_label = QLabel()
        self.saturation_axis = IndexAxis()
        self.saturation_plot = pg.PlotWidget(
            title="softmax of the row and of factor × row",
            axisItems={"bottom": self.saturation_axis},
        )
        self.saturation_plot.setLabel("bottom", "position in the row")
        self.saturation_plot.setYRange(0, 1)
        self.saturation_legend = legend_label(
            [("softmax(row)", BLUE), ("softmax(factor × row)", VERMILLION)]
        )
        self.saturation_note = QLabel()
        self.saturation_note.setWordWrap(True)
        self.scores.editingFinished.connect(self.show_saturation)
        self.factor.valueChanged.connect(lambda _: self.show_saturation())
        row = QHBoxLayout()
        row.addWidget(QLabel("scores"))
        row.addWidget(self.scores, 1)
        row.addWidget(QLabel("× factor"))
        row.addWidget(self.factor, 1)
        row.addWidget(self.factor_label)

        layout = QVBoxLayout(self)
        layout.addWidget(QLabel("<b>Why scale?</b> Variance of q·k for standard-normal q and k:"))
        layout.addLayout(form)
        layout.addWidget(self.table)
        layout.addWidget(self.status)
        layout.addWidget(self.variance_plot, 1)
        layout.addWidget(self.variance_legend)
        layout.addWidget(QLabel("<b>Softmax saturation</b>: the same scores, multiplied"))
        layout.addLayout(row)
        layout.addWidget(self.saturation_plot, 1)
        layout.addWidget(self.saturation_legend)
        layout.addWidget(self.saturation_note)
        self.run()
        self.show_saturation()

    def run(self) -> None:
        pairs, seed = self.pairs.value(), self.seed.value()
        self.status.setText("sampling…")
        self.worker.run(scaling_variance, D_KS, pairs, seed)

    def show_stats(self, stats: list[ScalingStats]) -> None:
        self.status.setText(
            f"{stats[0].pairs:,} pairs per d_k. Expected: var q·k ≈ d_k, scaled ≈ 1."
        )
        for i, st in enumerate(stats):
            values = (st.d_k, st.mean_raw, st.var_raw, st.mean_scaled, st.var_scaled)
            for j, v in enumerate(values):
                self.table.setItem(i, j, table_item(str(v) if j == 0 else f"{v:.4g}"))
        plot = self.variance_plot.getPlotItem()
        plot.clear()
        x = np.arange(len(stats), dtype=float)

        # A log scale drawn by hand: bars rise from 0.1, so a variance of 1 is still a bar.
        def height(values: list[float]) -> np.ndarray:
            return np.log10(np.maximum(values, 0.1)) + 1

        bars(plot, height([s.var_raw for s in stats]), x - 0.2, VERMILLION)
        bars(plot, height([s.var_scaled for s in stats]), x + 0.2, BLUE)
        self.variance_axis.set_labels([f"d_k = {s.d_k}" for s in stats])

    def show_saturation(self) -> None:
        factor = self.factor.value() / 10
        self.factor_label.setText(f"{factor:g}")
        try:
            row = parse_table(self.scores.text()).ravel()
            plain, scaled = saturation(row, factor)
        except ValueError as e:
            self.saturation_note.setText(f"<span style='color:#b00'>{e}</span>")
            return
        plot = self.saturation_plot.getPlotItem()
        plot.clear()
        x = np.arange(len(row), dtype=float)
        bars(plot, plain, x - 0.2, BLUE)
        bars(plot, scaled, x + 0.2, VERMILLION)
        self.saturation_axis.set_labels([str(i + 1) for i in range(len(row))])
        a, b = row_summary(plain), row_summary(scaled)
        # what a unit gradient on the largest weight sends back to the scores (its largest)
        top = np.eye(len(row))[int(np.argmax(row))]
        back = [float(np.abs(softmax_gradient(P, top)).max()) for P in (plain, scaled)]
        self.saturation_note.setText(
            f"weights {np.round(plain, 2).tolist()} → {np.round(scaled, 2).tolist()}; "
            f"largest weight {a.max_weight:.2f} → {b.max_weight:.2f}; "
            f"entropy {a.entropy:.2f} → {b.entropy:.2f} nats; gradient back to the scores "
            f"{back[0]:.2g} → {back[1]:.2g}"
        )


class GradientTab(QWidget):
    """How much gradient gets back through softmax, against d_k, with and without ÷√d_k:
    the saturation of the scaling stage, in the backward pass."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.axis = IndexAxis()
        self.plot = pg.PlotWidget(title="‖dS‖ / ‖dP‖, log scale", axisItems={"bottom": self.axis})
        self.legend = legend_label([("scores ÷ √d_k", BLUE), ("scores not scaled", VERMILLION)])
        self.note = QLabel("sampling…")
        self.note.setWordWrap(True)
        self.worker = Background(self)
        self.worker.done.connect(self.show_gains)
        self.worker.failed.connect(self.note.setText)
        layout = QVBoxLayout(self)
        intro = QLabel(
            "<b>Saturation stalls learning.</b> Backpropagation reaches the scores through "
            "softmax: dS = P ⊙ (dP − Σ P·dP). Where one weight is ≈ 1 this is ≈ 0. For random "
            "q and k of width d_k over 16 keys, the median share of a gradient dP that gets "
            "back to the scores:"
        )
        intro.setWordWrap(True)
        layout.addWidget(intro)
        layout.addWidget(self.plot, 1)
        layout.addWidget(self.legend)
        layout.addWidget(self.note)
        self.worker.run(gradient_gain, GRADIENT_D_KS)

    def show_gains(self, gains: list[GradientGain]) -> None:
        plot = self.plot.getPlotItem()
        plot.clear()
        x = np.arange(len(gains), dtype=float)
        floor = -7.0  # bars rise from 1e−7, so that a tiny gain is still a bar

        def height(values: list[float]) -> np.ndarray:
            return np.log10(np.maximum(values, 10**floor)) - floor

        bars(plot, height([g.scaled for g in gains]), x - 0.2, BLUE)
        bars(plot, height([g.unscaled for g in gains]), x + 0.2, VERMILLION)
        plot.getAxis("left").setTicks(
            [[(k - floor, f"1e{k}".replace("-", "−")) for k in range(-7, 1)]]
        )
        self.axis.set_labels([f"d_k = {g.d_k}" for g in gains])
        by = {g.d_k: g for g in gains}
        g = by.get(64, gains[-1])
        self.note.setText(
            f"At d_k = {g.d_k}: {g.scaled:.3g} scaled, {g.unscaled:.3g} unscaled "
            f"({g.scaled / g.unscaled:.3g} times less); scaled stays near "
            f"{np.median([x.scaled for x in gains]):.2g} at every width. Median of "
            f"{g.rows:,} random rows each."
        )


class PositionTab(QWidget):
    """Without position information, permuting the tokens just permutes the outputs."""

    def __init__(self, ws: Workspace, parent: QWidget | None = None):
        super().__init__(parent)
        self.doc, self.compute = ws.doc, ws.compute
        self.rng = np.random.default_rng()
        self.note = QLabel()
        ws.compute.answered.connect(self._answered)
        ws.compute.queryFailed.connect(lambda name, text: self._failed(name, text))
        text = QLabel(
            "Attention itself has no idea of order: with no mask and no position encoding, "
            "reversing or shuffling the tokens reverses or shuffles the output rows, and "
            "changes nothing else. Add the sinusoidal encoding (toolbar: Position) and the "
            "outputs change for real. Each button is one undoable step."
        )
        text.setWordWrap(True)
        reverse, shuffle = QPushButton("Reverse tokens"), QPushButton("Shuffle tokens")
        reverse.clicked.connect(
            lambda: self.permute(list(range(self.doc.scenario.n))[::-1], "Reverse")
        )
        shuffle.clicked.connect(
            lambda: self.permute(list(self.rng.permutation(self.doc.scenario.n)), "Shuffle")
        )
        self.note.setWordWrap(True)
        row = QHBoxLayout()
        row.addWidget(reverse)
        row.addWidget(shuffle)
        row.addStretch(1)
        layout = QVBoxLayout(self)
        layout.addWidget(text)
        layout.addLayout(row)
        layout.addWidget(self.note)
        layout.addStretch(1)

    def permute(self, order: list[int], verb: str) -> None:
        s = self.doc.scenario
        new = permute_tokens(s, [int(i) for i in order])
        # Judged with the float64 reference, whatever engine the views show.
        numpy = self.compute.view.engine == "numpy" and not self.compute.busy
        before = self.compute.result if numpy else None
        self.doc.replace(new, f"{verb} tokens")
        self.note.setText("comparing…")

        def judge(r: Results) -> Permutation:
            reference = compute(s) if before is None else before
            return permutation(s, order, new, lambda x: reference if x is s else r.layer())

        self.compute.ask("permutation", judge, needs_layer=True)

    def _answered(self, name: str, value: object) -> None:
        if name == "permutation":
            self.note.setText(value.text)  # type: ignore[attr-defined]

    def _failed(self, name: str, text: str) -> None:
        if name == "permutation":
            self.note.setText(text)


class KVCacheTab(QWidget):
    """Generate token by token: one new query row against the cached keys and values."""

    def __init__(self, ws: Workspace, parent: QWidget | None = None):
        super().__init__(parent)
        self.doc, self.compute = ws.doc, ws.compute
        doc = ws.doc
        self.cache: KVCache | None = None
        text = QLabel(
            "Generation is causal: step t computes token t's query, key and value, appends the "
            "key and value to each key/value head's cache (fewer heads under GQA: a smaller "
            "cache), and attends from the one new query to all cached keys. The row must equal "
            "row t of full causal attention."
        )
        text.setWordWrap(True)
        self.step_button, reset = QPushButton("Step"), QPushButton("Start over")
        self.step_button.clicked.connect(self.step)
        reset.clicked.connect(self.reset)
        row = QHBoxLayout()
        row.addWidget(self.step_button)
        row.addWidget(reset)
        row.addStretch(1)
        self.info = QFormLayout()
        self.labels = {k: QLabel("–") for k in ("token", "cache", "bytes", "match")}
        for key, title in (
            ("token", "step"),
            ("cache", "cache size"),
            ("bytes", "cache memory"),
            ("match", "vs full causal attention"),
        ):
            self.info.addRow(title, self.labels[key])
        self.axis = IndexAxis()
        self.plot = pg.PlotWidget(
            title="new row's weights per head", axisItems={"bottom": self.axis}
        )
        self.plot.setYRange(0, 1)
        self.legend = legend_label()
        layout = QVBoxLayout(self)
        layout.addWidget(text)
        layout.addLayout(row)
        layout.addLayout(self.info)
        layout.addWidget(self.plot, 1)
        layout.addWidget(self.legend)
        ws.compute.answered.connect(
            lambda name, cache: self._started(cache) if name == "kv-cache" else None
        )
        ws.compute.queryFailed.connect(
            lambda name, text: self._refused(text) if name == "kv-cache" else None
        )
        doc.scenarioChanged.connect(self.reset)
        doc.cellsChanged.connect(lambda *_: self.reset())

    def reset(self) -> None:
        self.cache = None
        self.step_button.setEnabled(True)
        for label in self.labels.values():
            label.setText("–")
        self.plot.getPlotItem().clear()
        self.axis.set_labels([])
        self.legend.setText("")

    def step(self) -> None:
        if self.cache is None:
            self.step_button.setEnabled(False)
            self.compute.ask(
                "kv-cache", lambda r: KVCache(r.scenario, r.layer(mask="causal", dropout=0.0))
            )
            return
        self.show_step(self.cache.step())
        self.step_button.setEnabled(not self.cache.done)

    def _refused(self, error: str) -> None:
        self.step_button.setEnabled(True)
        self.labels["token"].setText(error.split(": ", 1)[-1])

    def _started(self, cache: KVCache) -> None:
        self.cache = cache
        self.step()

    def show_step(self, st: Step) -> None:
        tokens = self.doc.scenario.tokens
        self.labels["token"].setText(f"t = {st.t + 1} of {len(tokens)}: {tokens[st.t]}")
        self.labels["cache"].setText(
            f"{st.cache_numbers:,} numbers (2 × {st.t + 1} rows × KV heads × d_k)"
        )
        self.labels["bytes"].setText(" · ".join(f"{v:,} B {k}" for k, v in st.cache_bytes.items()))
        ok = st.max_diff <= 1e-12 * max(1.0, float(np.abs(st.final).max()))
        colour = "#070" if ok else "#b00"
        self.labels["match"].setText(
            f"<span style='color:{colour}'>max difference {st.max_diff:.2g}</span>"
        )
        plot = self.plot.getPlotItem()
        plot.clear()
        heads, width = st.weights.shape[0], 0.8 / st.weights.shape[0]
        colours = head_colours(heads)
        for h in range(heads):
            x = np.arange(st.t + 1) + (h - (heads - 1) / 2) * width
            plot.addItem(pg.BarGraphItem(x=x, height=st.weights[h], width=width, brush=colours[h]))
        self.axis.set_labels(list(tokens[: st.t + 1]))
        self.legend.setText(legend_html([(f"head {h + 1}", c) for h, c in enumerate(colours)]))


class ExperimentsPanel(QTabWidget):
    def __init__(self, ws: Workspace, parent: QWidget | None = None):
        super().__init__(parent)
        self.scaling = ScalingTab()
        self.position = PositionTab(ws)
        self.kv_cache = KVCacheTab(ws)
        self.gradient = GradientTab()
        self.addTab(self.scaling, "Scaling")
        self.addTab(self.gradient, "Gradients")
        self.addTab(self.position, "Position")
        self.addTab(self.kv_cache, "KV cache")
