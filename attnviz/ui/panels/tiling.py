"""Tiling dock: FlashAttention-2's forward pass over the shown head, one tile at a time.

The score matrix (computed densely here, for display only) carries the tile grid, the
current tile, the skipped tiles and, faded, the tiles still to come; beside it each query
row's running maximum m and denominator l. To the right, the unnormalised output O being
rescaled and, once a query block's last tile is done, O / l. Step, back, play and reset
walk the pass (→, ←, Space, Home while the dock has the focus); the block sizes and the
precision run it again. The pass itself is ``attnviz.core.maths.tiling``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from PySide6.QtCore import QPointF, QRectF, Qt, QTimer
from PySide6.QtGui import QBrush, QColor, QKeySequence, QPainter, QPen, QShortcut
from PySide6.QtWidgets import (
    QComboBox,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from attnviz.core.figures import colors
from attnviz.core.figures.figure import HeatmapSpec
from attnviz.core.figures.tiled_pass import Pass, prepare
from attnviz.core.maths.results import Result
from attnviz.core.maths.scenario import LIMITS
from attnviz.core.maths.tiling import PRECISIONS, Tiling, describe_step, overflowed_text
from attnviz.core.scheduler import Results
from attnviz.ui.heatmap import HeatmapView, Overlay, RowBars
from attnviz.ui.panels.common import ResultPanel, int_spin
from attnviz.ui.workspace import Workspace

SPEEDS = {"slow": 1200, "medium": 500, "fast": 150}  # ms per step while playing
ROWS_DESCRIBED = 8  # rows of the current tile written out; more are counted
CURRENT = "#ff7f00"  # the current tile and the rows it just updated
EARLIER = "#6baed6"  # rows updated by an earlier step


@dataclass(frozen=True)
class Shown:
    """The running state after some steps: what the views show."""

    m: np.ndarray  # (n,) NaN where the row's block has not started
    l: np.ndarray
    O: np.ndarray  # (n, d) unnormalised; 0 where not started
    out: np.ndarray  # (n, d) O / l where the block is done; 0 elsewhere
    started: int  # rows [0, started) have begun
    done: int  # rows [0, done) are final


def state_after(t: Tiling, k: int) -> Shown:
    n, d = t.output.shape
    m, l = np.full(n, np.nan), np.full(n, np.nan)
    O, out = np.zeros((n, d)), np.zeros((n, d))
    started = done = 0
    for step in t.steps[:k]:
        r0, r1 = step.rows
        m[r0:r1], l[r0:r1], O[r0:r1] = step.m_new, step.l_new, step.O
        started = r1
        if step.last:
            out[r0:r1], done = t.output[r0:r1], r1
    return Shown(m, l, O, out, started, done)


class TileGrid(Overlay):
    """Over the score matrix: the tile grid, skipped tiles shaded, tiles to come faded,
    the current tile outlined. One painting item, in cell units."""

    def __init__(self) -> None:
        self.shape = (0, 0)
        self.blocks = (1, 1)
        self.skipped: list[tuple[int, int, int, int]] = []
        self.current: tuple[int, int, int, int] | None = None
        self.to_come: list[QRectF] = []

    def set_state(self, t: Tiling, n: int, m: int, k: int) -> None:
        self.shape, self.blocks = (n, m), (t.block_q, t.block_k)
        self.skipped = [(*x.rows, *x.cols) for x in t.steps if x.skipped]
        step = t.steps[k - 1] if k else None
        self.current = (*step.rows, *step.cols) if step else None
        if step is None:
            self.to_come = [QRectF(0, 0, m, n)]
        else:
            (r0, r1), c1 = step.rows, step.cols[1]
            self.to_come = [QRectF(c1, r0, m - c1, r1 - r0), QRectF(0, r1, m, n - r1)]
        self.update()

    def paint(self, painter: QPainter) -> None:
        n, m = self.shape
        for rect in self.to_come:
            painter.fillRect(rect, QColor(255, 255, 255, 120))
        shade, cross = (
            QColor(60, 60, 60, 120),
            QBrush(QColor("#444444"), Qt.BrushStyle.CrossPattern),
        )
        for r0, r1, c0, c1 in self.skipped:
            painter.fillRect(QRectF(c0, r0, c1 - c0, r1 - r0), shade)
            painter.fillRect(QRectF(c0, r0, c1 - c0, r1 - r0), cross)
        pen = QPen(QColor("#222222"), 1.5)
        pen.setCosmetic(True)
        painter.setPen(pen)
        bq, bk = self.blocks
        for r in range(bq, n, bq):
            painter.drawLine(QPointF(0, r), QPointF(m, r))
        for c in range(bk, m, bk):
            painter.drawLine(QPointF(c, 0), QPointF(c, n))
        if self.current is not None:
            r0, r1, c0, c1 = self.current
            outline_current(painter, QRectF(c0, r0, c1 - c0, r1 - r0))


def outline_current(painter: QPainter, rect: QRectF) -> None:
    """The block the step just worked on: a thick outline, 4 px at any zoom."""
    pen = QPen(QColor(CURRENT), 4)
    pen.setCosmetic(True)
    painter.setPen(pen)
    painter.setBrush(Qt.BrushStyle.NoBrush)
    painter.drawRect(rect)


class RowBands(Overlay):
    """Over an n × d matrix: rows not reached yet covered, the rows just updated outlined."""

    def __init__(self) -> None:
        self.shape = (0, 0)
        self.pending_from = 0
        self.current: tuple[int, int] | None = None

    def set_state(
        self, shape: tuple[int, int], pending_from: int, current: tuple[int, int] | None
    ) -> None:
        self.shape, self.pending_from, self.current = shape, pending_from, current
        self.update()

    def paint(self, painter: QPainter) -> None:
        n, d = self.shape
        if self.pending_from < n:
            rect = QRectF(0, self.pending_from, d, n - self.pending_from)
            painter.fillRect(rect, QColor("#f0f0f0"))
            painter.fillRect(rect, QBrush(QColor("#c8c8c8"), Qt.BrushStyle.BDiagPattern))
        if self.current is not None:
            r0, r1 = self.current
            outline_current(painter, QRectF(0, r0, d, r1 - r0))


def _span(name: str, start: int, stop: int) -> str:
    """0-based [start, stop) as words: "row 3" or "rows 3–4"."""
    return f"{name} {stop}" if stop - start == 1 else f"{name}s {start + 1}–{stop}"


def _number(x: float) -> str:
    return f"{x:.2g}".replace("-", "−")


class TilingPanel(ResultPanel):
    """The stepper over the shown head's tiled pass."""

    def __init__(self, ws: Workspace, parent: QWidget | None = None):
        super().__init__(ws, parent)
        self.pass_: Pass | None = None
        self.position = 0  # steps done
        self._asked: tuple[object, ...] = ()
        ws.compute.answered.connect(self._answered)
        ws.compute.queryFailed.connect(
            lambda name, text: self._refused(text) if name == "tiling" else None
        )
        self.timer = QTimer(self)
        self.timer.timeout.connect(self.step)
        controls = self._controls()
        self.refusal = QLabel()
        self.refusal.setWordWrap(True)
        self.refusal.setStyleSheet("color: #a00000; padding: 8px;")
        self.refusal.hide()
        self.body = self._body()
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addLayout(controls)
        layout.addWidget(self.refusal)
        layout.addWidget(self.body, 1)
        self.setFocusPolicy(Qt.FocusPolicy.StrongFocus)  # for the keys: → ← Space Home
        ws.view_state.headChanged.connect(lambda _: self.redraw())

    def _controls(self) -> QVBoxLayout:
        """Step, back, reset, play and its speed; the block sizes and the precision."""
        self.buttons = {
            "reset": QPushButton("Reset"),
            "back": QPushButton("◀ Back"),
            "step": QPushButton("Step ▶"),
            "play": QPushButton("Play"),
        }
        tips = {
            "reset": "Back to before the first tile (Home)",
            "back": "Undo the last step (←)",
            "step": "Compute the next tile (→)",
            "play": "Step on its own at the chosen speed (Space)",
        }
        actions = {"reset": self.reset, "back": self.back, "step": self.step, "play": self.play}
        keys = {"reset": Qt.Key.Key_Home, "back": Qt.Key.Key_Left, "step": Qt.Key.Key_Right}
        keys["play"] = Qt.Key.Key_Space
        for name, button in self.buttons.items():
            button.setToolTip(tips[name])
            button.clicked.connect(actions[name])
            shortcut = QShortcut(QKeySequence(keys[name]), self)
            shortcut.setContext(Qt.ShortcutContext.WidgetWithChildrenShortcut)
            shortcut.activated.connect(actions[name])
        self.speed = QComboBox()
        self.speed.addItems(list(SPEEDS))
        self.speed.setCurrentText("medium")
        self.speed.setToolTip("How fast Play steps")
        self.speed.currentTextChanged.connect(lambda name: self.timer.setInterval(SPEEDS[name]))
        self.timer.setInterval(SPEEDS["medium"])
        self.block_q = int_spin(1, LIMITS.tokens, "B_r: query rows per block", value=2)
        self.block_k = int_spin(1, LIMITS.tokens, "B_c: key columns per tile", value=2)
        self.block_q.setPrefix("B_r ")
        self.block_k.setPrefix("B_c ")
        self.precision = QComboBox()
        self.precision.addItems(list(PRECISIONS))
        self.precision.setToolTip(
            "float64: the reference. float32, float16, bfloat16: Q, K, V and P rounded to it, "
            "products and m, l, O accumulated in float32, as the GPU kernels do"
        )
        for spin in (self.block_q, self.block_k):
            spin.valueChanged.connect(lambda _: self.redraw())
        self.precision.currentTextChanged.connect(lambda _: self.redraw())
        # Two rows, so that the dock fits the right-hand column at 1280 × 720.
        steps, setup = QHBoxLayout(), QHBoxLayout()
        for button in self.buttons.values():
            steps.addWidget(button)
        steps.addWidget(self.speed)
        steps.addStretch(1)
        for widget in (self.block_q, self.block_k, self.precision):
            setup.addWidget(widget)
        setup.addStretch(1)
        controls = QVBoxLayout()
        controls.addLayout(steps)
        controls.addLayout(setup)
        return controls

    def _body(self) -> QWidget:
        """The views, the worked arithmetic, the check against dense attention, traffic."""
        self.where = QLabel()
        self.where.setWordWrap(True)
        # No colour bar: the cells print their values, and the room goes to the cells.
        self.scores = HeatmapView("tiling-scores", colorbar=False)
        self.scores.square_cells = True
        self.scores.turn_keys = True  # long tokens ([CLS]) upright: clear of the m and l columns
        self.scores.strip.COLUMN = 50.0
        self.grid = TileGrid()
        self.scores.add_overlay(self.grid)
        self.O_view, self.out_view = HeatmapView("tiling-O"), HeatmapView("tiling-output")
        self.error_view = HeatmapView("tiling-error")
        self.bands = {"O": RowBands(), "out": RowBands()}
        self.O_view.add_overlay(self.bands["O"])
        self.out_view.add_overlay(self.bands["out"])
        # The square score matrix leaves room below it: the error map goes there.
        self.views = views = QGridLayout()
        views.addWidget(self.scores, 0, 0, 2, 1)
        views.addWidget(self.error_view, 1, 0)
        self.error_view.hide()
        views.addWidget(self.O_view, 0, 1)
        views.addWidget(self.out_view, 1, 1)
        views.setColumnStretch(0, 3)
        views.setColumnStretch(1, 2)
        for view in (self.O_view, self.out_view, self.error_view):
            view.setMinimumSize(150, 130)
        self.scores.setMinimumSize(260, 200)
        self.arithmetic = QLabel()
        self.arithmetic.setWordWrap(True)
        self.arithmetic.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.arithmetic.setStyleSheet("background: #f6f6f6; padding: 4px;")
        self.legend = QLabel(
            f"<span style='color:{CURRENT}'>■</span> the current tile and the rows it updated "
            "· dark cross-hatched: tiles the mask hides, skipped (no scores, K and V not "
            "read) · faded: tiles still to come · m, l: each row's running maximum and "
            "denominator"
        )
        self.legend.setWordWrap(True)
        self.legend.setStyleSheet("color: #555555;")
        self.check, self.traffic = QLabel(), QLabel()
        for label in (self.check, self.traffic):
            label.setWordWrap(True)
        widget = QWidget()
        body = QVBoxLayout(widget)
        body.setContentsMargins(0, 0, 0, 0)
        body.addWidget(self.where)
        body.addLayout(views, 1)
        for label in (self.legend, self.arithmetic, self.check, self.traffic):
            body.addWidget(label)
        return widget

    # The pass ----------------------------------------------------------------------------

    def show_result(self, result: Result) -> None:
        s = self.compute.result_scenario
        head = min(self.view_state.head, result.n_heads - 1)
        for spin, most in ((self.block_q, s.n), (self.block_k, s.m)):
            spin.blockSignals(True)  # a smaller scenario clamps them: no second run
            spin.setMaximum(max(1, most))
            spin.blockSignals(False)
        asked = (
            self.compute.version,
            head,
            self.block_q.value(),
            self.block_k.value(),
            self.precision.currentText(),
        )
        if asked == self._asked:
            return
        self._asked = asked
        _, _, block_q, block_k, precision = asked

        def job(r: Results) -> Pass:
            return prepare(r.scenario, head, block_q, block_k, precision, lambda _: r.layer())

        self.compute.ask("tiling", job, needs_layer=True)

    def _answered(self, name: str, value: object) -> None:
        if name == "tiling":
            self._shown(value)  # type: ignore[arg-type]

    def _shown(self, p: Pass) -> None:
        old = self.pass_
        grid = (p.tiling.output.shape, p.tiling.block_q, p.tiling.block_k)
        same = old is not None and grid == (
            old.tiling.output.shape,
            old.tiling.block_q,
            old.tiling.block_k,
        )
        self.pass_ = p
        self.position = min(self.position, len(p.tiling.steps)) if same else 0
        self.refusal.hide()
        self.body.show()
        self.scores.set_spec(p.scores)
        self._draw_totals(p)
        self.show_position()

    def _refused(self, error: str) -> None:
        self.pause()
        self.pass_, self.position = None, 0
        self._asked = ()
        message = error.split(": ", 1)[1] if error.startswith("ScenarioError: ") else error
        self.refusal.setText(f"The tiled pass cannot run here: {message}")
        self.refusal.show()
        self.body.hide()
        for name in ("back", "step", "play", "reset"):
            self.buttons[name].setEnabled(False)

    # Stepping -----------------------------------------------------------------------------

    @property
    def steps(self) -> int:
        return len(self.pass_.tiling.steps) if self.pass_ is not None else 0

    def step(self) -> None:
        if self.position < self.steps:
            self.position += 1
            self.show_position()
        if self.position >= self.steps:
            self.pause()

    def back(self) -> None:
        if self.position > 0:
            self.position -= 1
            self.show_position()

    def reset(self) -> None:
        self.pause()
        self.position = 0
        self.show_position()

    def play(self) -> None:
        if self.timer.isActive():
            self.pause()
            return
        if self.pass_ is None:
            return
        if self.position >= self.steps:
            self.position = 0
            self.show_position()
        self.timer.start()
        self.buttons["play"].setText("Pause")

    def pause(self) -> None:
        self.timer.stop()
        self.buttons["play"].setText("Play")

    # Drawing ------------------------------------------------------------------------------

    def show_position(self) -> None:
        p = self.pass_
        if p is None:
            return
        t, k = p.tiling, self.position
        n, d = t.output.shape
        m = t.weights_from_lse.shape[1]
        shown = state_after(t, k)
        step = t.steps[k - 1] if k else None
        rows = step.rows if step else None
        self.grid.set_state(t, n, m, k)
        self._draw_strips(shown, rows)
        features = tuple(str(j + 1) for j in range(d))
        head = t.head + 1

        def spec(title: str, values: np.ndarray, levels: tuple[float, float]) -> HeatmapSpec:
            return HeatmapSpec(
                f"head {head} · {title}", values, p.tokens, features, "query", "feature",
                "diverging", levels, title,
            )  # fmt: skip

        self.O_view.set_spec(spec("O, unnormalised (running)", shown.O, p.o_levels))
        out_levels = colors.levels(t.output, "diverging")
        self.out_view.set_spec(spec("output O / l (blocks done)", shown.out, out_levels))
        self.bands["O"].set_state((n, d), shown.started, rows)
        done_now = rows if step is not None and step.last else None
        self.bands["out"].set_state((n, d), shown.done, done_now)
        self.where.setText(self._where(t, k))
        self.arithmetic.setText(self._arithmetic(t, k, p.tokens))
        at_end = k >= len(t.steps)
        self.buttons["step"].setEnabled(not at_end)
        self.buttons["back"].setEnabled(k > 0)
        self.buttons["reset"].setEnabled(k > 0)
        self.buttons["play"].setEnabled(True)

    def _draw_strips(self, shown: Shown, rows: tuple[int, int] | None) -> None:
        n = len(shown.m)
        colours = tuple(CURRENT if rows and rows[0] <= i < rows[1] else EARLIER for i in range(n))

        def column(title: str, values: np.ndarray) -> RowBars:
            finite = np.where(np.isfinite(values), values, 0.0)
            texts = tuple(
                "–" if math.isnan(v) else colors.cell_text(float(v)) for v in values.tolist()
            )
            limit = float(np.abs(finite).max()) or 1.0
            return RowBars(title, finite, limit, colours, texts)

        self.scores.set_row_bars([column("m", shown.m), column("l", shown.l)])

    def _where(self, t: Tiling, k: int) -> str:
        total = f"{len(t.steps)} tiles, {t.skipped} skipped by the mask"
        if k == 0:
            return (
                f"Before the first tile ({total}): every row starts at m = −∞, l = 0, O = 0. "
                "Press Step (→)."
            )
        step = t.steps[k - 1]
        (r0, r1), (c0, c1) = step.rows, step.cols
        what = "skipped: the mask hides all of it" if step.skipped else "computed"
        done = "; block done: output = O / l" if step.last else ""
        rows, keys = _span("row", r0, r1), _span("key", c0, c1)
        return (
            f"<b>Step {k} of {len(t.steps)}</b>: query block {step.q_block + 1} ({rows}) × "
            f"key block {step.k_block + 1} ({keys}), {what}{done}."
        )

    @staticmethod
    def _arithmetic(t: Tiling, k: int, tokens: tuple[str, ...]) -> str:
        if k == 0:
            return "The worked arithmetic of each row of the current tile appears here."
        step = t.steps[k - 1]
        (r0, r1), (c0, c1) = step.rows, step.cols
        if step.skipped and not step.last:  # the same for every row: said once
            return (
                f"{_span('row', r0, r1)}, {_span('key', c0, c1)}: tile skipped (the mask hides "
                "all of it): no scores computed, K and V not read; m, l and O unchanged"
            )
        lines = [describe_step(step, r, tokens) for r in range(r0, r1)]
        more = len(lines) - ROWS_DESCRIBED
        if more > 0:
            lines = [*lines[:ROWS_DESCRIBED], f"… and {more} more rows"]
        return "\n".join(lines)

    def _draw_totals(self, p: Pass) -> None:
        t = p.tiling
        kept = ~t.overflowed
        diff = float(np.abs(t.output[kept] - p.dense[kept]).max()) if kept.any() else 0.0
        if t.overflowed.any():
            self.check.setText(
                overflowed_text(t, p.tokens) + ": their output and LSE are not numbers (NaN); "
                "a kernel in this precision would return them so."
            )
        elif t.precision == "float64":
            scale = max(1.0, float(np.abs(p.dense).max()) if p.dense.size else 1.0)
            verb = "equals" if diff <= 1e-12 * scale else "differs from"
            self.check.setText(f"Output {verb} dense attention: max |Δ| = {_number(diff)}.")
        else:
            self.check.setText(
                f"{t.precision}: output vs dense attention in float64: max |Δ| = "
                f"{_number(diff)} (inputs and P rounded to {t.precision}; m, l and O kept in "
                "float32)."
            )
        tr = t.traffic()
        self.traffic.setText(
            f"Slow-memory traffic for this head, in numbers: dense {tr.dense_reads:,} read + "
            f"{tr.dense_writes:,} written = {tr.dense:,} (S and P written and read back); "
            f"tiled with these tiles {tr.tiled_reads:,} + {tr.tiled_writes:,} = {tr.tiled:,} "
            f"(never the n × m matrix). {t.computed} of {len(t.steps)} tiles computed."
        )
        low = t.precision != "float64"
        self.views.removeWidget(self.scores)
        self.views.addWidget(self.scores, 0, 0, 1 if low else 2, 1)
        self.error_view.setVisible(low)
        if low:
            self.error_view.set_spec(self._error_spec(p))

    @staticmethod
    def _error_spec(p: Pass) -> HeatmapSpec:
        """|output − float64 output| in units of a power of ten, so the cells read."""
        error = np.abs(p.tiling.output - p.exact.output)  # NaN in an overflowed row
        finite = error[np.isfinite(error)]
        top = float(finite.max()) if finite.size else 0.0
        exponent = math.floor(math.log10(top)) if top > 0 else 0
        unit = 10.0**exponent
        values = error / unit
        title = f"|out − out float64| ÷ 1e{exponent}".replace("-", "−")
        high = colors.nice_ceiling(top / unit) if top > 0 else 1.0
        d = values.shape[1]
        return HeatmapSpec(
            f"head {p.tiling.head + 1} · {title}", values, p.tokens,
            tuple(str(j + 1) for j in range(d)), "query", "feature", "sequential",
            (0.0, high), title,
        )  # fmt: skip
