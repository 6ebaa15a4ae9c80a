"""Heads dock: every head's weights side by side; click one to show it everywhere; ablate.
While the gradients are shown, each head's ‖dL/dW_Q‖, ‖dL/dW_K‖, ‖dL/dW_V‖ under its map."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
from PySide6.QtCore import QPointF, QRect, QSize, Qt
from PySide6.QtGui import QFontMetricsF, QPainter, QPaintEvent, QResizeEvent
from PySide6.QtWidgets import QCheckBox, QLabel, QWidget

from attnviz.core.figures.figure import HeatmapSpec, colorbar_ticks, spec_for, tick_label
from attnviz.core.maths.backward import Gradients
from attnviz.core.maths.results import Result
from attnviz.ui.heatmap import HeatmapView
from attnviz.ui.heatmap_parts import ColorBar
from attnviz.ui.panels.common import ResultPanel
from attnviz.ui.view_state import Selection
from attnviz.ui.workspace import Workspace

MARGIN, GAP = 4, 6  # pixels: around the panel, between maps
SWITCH = 24  # pixels: a head's on/off box under its map
NORMS = 18  # pixels: its gradient norms under that, while the gradients are shown
BAR = math.ceil(ColorBar.ROOM)  # the shared colour bar's column
FEW = 12  # tokens: few enough that every one is labelled (the dock scrolls if need be)
OVERVIEW = 80.0  # pixels: more tokens, down to a pixel a cell or this much a matrix,
# before the dock scrolls (the view samples cells smaller than a pixel)
LARGEST = 64.0  # pixels: a cell no larger (a few tokens in a large dock)


@dataclasses.dataclass(frozen=True)
class Grid:
    """How the maps are laid out: so many to a row, every map the same size."""

    columns: int
    map_size: QSize
    below: int = SWITCH  # pixels under each map: its switch (and gradient norms)

    def rows(self, count: int) -> int:
        return math.ceil(count / self.columns)

    def height(self, count: int) -> int:
        return self.rows(count) * (self.map_size.height() + self.below + GAP)


def arrange(
    count: int,
    group: int,
    shape: tuple[int, int],
    room: QSize,
    around: tuple[float, float],
    smallest: float,
    below: int = SWITCH,
) -> Grid:
    """count maps of a (rows, cols) matrix with square cells, each needing ``around``
    (width, height) pixels for its labels and caption, in room: the columns that give
    the largest cells that fit (or nearly: more to a row), whole groups of heads that
    share keys and values to a row. When cells of ``smallest`` pixels do not fit, the
    most columns the width takes at that size (the dock scrolls)."""
    rows, cols = shape
    choices = range(group, count + 1, group) if 1 < group <= 4 else range(1, count + 1)

    def across(c: int) -> float:
        return ((room.width() - BAR) / c - GAP - around[0]) / cols  # a gap after each map

    def down(c: int) -> float:
        r = math.ceil(count / c)
        return ((room.height() - r * GAP) / r - below - around[1]) / rows

    def cell_of(c: int) -> float:
        return min(across(c), down(c), LARGEST)

    # More maps to a row (a wide dock's shape) when that costs their cells little.
    best = max(map(cell_of, choices))
    enough = best if best < smallest else max(0.9 * best, smallest)
    columns = max(c for c in choices if cell_of(c) >= enough)
    cell = cell_of(columns)
    if cell < smallest:
        wide = [c for c in choices if across(c) >= smallest]
        columns = max(wide) if wide else choices[0]
        cell = smallest if wide else max(across(columns), smallest / 4)
    size = QSize(math.floor(around[0] + cols * cell), math.floor(around[1] + rows * cell))
    return Grid(columns, size, below)


def norm_texts(q: float, k: float, v: float) -> list[str]:
    """A head's gradient norms as a line, from the longest to the shortest."""
    texts = []
    for digits in (3, 2, 1):
        numbers = f"Q {q:.{digits}g} · K {k:.{digits}g} · V {v:.{digits}g}"
        texts += [f"‖dL/dW‖ {numbers}", numbers]
    return [*texts, f"Q{q:.1g} K{k:.1g} V{v:.1g}"]


def head_norms(g: Gradients, kv_of: list[int]) -> list[tuple[float, float, float]] | None:
    """Each query head's ‖dL/dW_Q‖, ‖dL/dW_K‖, ‖dL/dW_V‖ (Frobenius; K and V those of the
    key/value head it reads), or None without projections."""
    if "W_Q" not in g.inputs:
        return None
    dq, dk, dv = (g.inputs[name] for name in ("W_Q", "W_K", "W_V"))
    return [
        (float(np.linalg.norm(dq[h])), float(np.linalg.norm(dk[kv])), float(np.linalg.norm(dv[kv])))
        for h, kv in enumerate(kv_of)
    ]


def roomy(size: QSize) -> bool:
    """Whether a map this size shows its axis titles (HeatmapView's rule)."""
    return size.width() >= 240 and size.height() >= 220


class ScaleBar(QWidget):
    """The maps' one colour bar, beside them, as tall as the first map's cells."""

    def __init__(self, view: HeatmapView, parent: QWidget | None = None):
        super().__init__(parent)
        self.view, self.bar = view, ColorBar()
        view.painted.connect(lambda _: self.update())

    def set_spec(self, spec: HeatmapSpec) -> None:
        if (self.bar.kind, self.bar.levels) != (spec.kind, spec.levels):
            self.bar.set_scale(
                spec.kind, spec.levels, [(t, tick_label(t)) for t in colorbar_ticks(spec)]
            )
            self.update()

    def paintEvent(self, event: QPaintEvent) -> None:
        spec = self.view.spec
        if spec is None:
            return
        top = self.view.point_at(0, 0).y()
        bottom = self.view.point_at(*spec.values.shape[::-1]).y()
        pixmap = self.bar.pixmap(bottom - top, self.devicePixelRatioF())
        painter = QPainter(self)
        painter.drawPixmap(QPointF(0, top - self.bar.PAD), pixmap)
        painter.end()


class HeadsPanel(ResultPanel):
    """Small multiples of the weights (all on the same 0–1 scale), with an on/off per head:
    every map the same size, the scale in a colour bar of its own."""

    def __init__(self, ws: Workspace, parent: QWidget | None = None):
        super().__init__(ws, parent)
        self.views: list[HeatmapView] = []
        self.switches: list[QCheckBox] = []
        self.norms: list[QLabel] = []  # each head's gradient norms, while shown
        self.source = ws.gradients
        self.bar: ScaleBar | None = None
        self._shape = (0, 1)  # heads, and query heads per key/value head
        self.hint = QLabel(self)
        self.hint.setWordWrap(True)
        # Laid out here, not by a QLayout: the maps' size depends on the dock's width and
        # height, and the dock scrolls (by heightForWidth) only when they cannot shrink more.
        policy = self.sizePolicy()
        policy.setHeightForWidth(True)
        self.setSizePolicy(policy)
        ws.view_state.headChanged.connect(lambda _: self._mark_selected())
        ws.view_state.selectionChanged.connect(lambda _: self._mark_selected())
        ws.view_state.gradientsChanged.connect(lambda _: self._lay_out())
        ws.gradients.gradientsReady.connect(lambda _: self._show_norms())
        self._set_hint()

    def _set_hint(self) -> None:
        text = (
            "Every head's attention weights, on the same 0–1 scale. Click a head to show it "
            "in the Pipeline; untick it to switch it off in the W_O mix (ablation). Heads "
            "that share keys and values (GQA) sit side by side."
        )
        if self.view_state.gradients:
            text += " Under each: its gradient norms ‖dL/dW_Q‖, ‖dL/dW_K‖, ‖dL/dW_V‖."
            if self._shape[1] > 1:
                text += " (Heads that share a KV head share its ‖dL/dW_K‖ and ‖dL/dW_V‖.)"
        self.hint.setText(text)

    def _build(self, count: int, group: int) -> None:
        for widget in [*self.views, *self.switches, *self.norms, self.bar]:
            if widget is not None:
                widget.deleteLater()
        self.views, self.switches, self.norms = [], [], []
        self._shape = (count, group)
        for h in range(count):
            view = HeatmapView("weights", self, colorbar=False)
            view.setMinimumSize(40, 40)  # sized by _lay_out
            view.square_cells = True  # queries and keys alike
            view.turn_keys = True  # every key labelled where the cells leave a line's room
            view.cellClicked.connect(lambda _, i, j, h=h: self._clicked(h, i, j))
            switch = QCheckBox(f"head {h + 1} on", self)
            switch.setToolTip("Untick to switch this head off in the W_O mix")
            switch.toggled.connect(lambda on, h=h: self._toggle(h, on))
            norms = QLabel(self)
            norms.setAlignment(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter)
            for widget in (view, switch):
                widget.show()
            self.views.append(view)
            self.switches.append(switch)
            self.norms.append(norms)
        self.bar = ScaleBar(self.views[0], self) if count else None
        if self.bar is not None:
            self.bar.show()

    # Layout -------------------------------------------------------------------------------

    def _grid(self, room: QSize) -> Grid | None:
        """The maps' layout in room. Each needs, as HeatmapView places them, beside its
        cells its margins, row labels and (in a roomy map) row title; above and below
        them its margins, caption, key labels (a line, or turned where a cell is narrower
        than the widest) and (roomy) column title."""
        spec = self.views[0].spec if self.views else None
        if spec is None:
            return None
        count, group = self._shape
        shape = spec.values.shape
        metrics = QFontMetricsF(self.font())
        line = metrics.height()
        labels = max(map(metrics.horizontalAdvance, spec.row_labels), default=0.0)
        keys = max(map(metrics.horizontalAdvance, spec.col_labels), default=0.0)
        caption = QFontMetricsF(self.views[0].caption_font).height()
        # Few tokens: cells a line tall (and a little: the room for labels is estimated),
        # so that every label shows (turned, for the keys).
        smallest = line + 3 if max(shape) <= FEW else min(1.0, OVERVIEW / max(shape))
        turned = titled = False
        for _ in range(3):  # until the guesses hold
            title = (line + 4) * titled
            beside = 2 * 4 + min(labels, 160.0) + 6 + title
            above = 2 * 4 + caption + 4 + (min(keys, 72.0) if turned else line) + 2 + title
            below = SWITCH + (NORMS if self.view_state.gradients else 0)
            grid = arrange(count, group, shape, room, (beside, above), smallest, below)
            size = grid.map_size
            now = ((size.width() - beside) / shape[1] < keys + 6, roomy(size))
            if now == (turned, titled):
                break
            turned, titled = now
        return grid

    def _hint_height(self, width: int) -> int:
        return self.hint.heightForWidth(width - 2 * MARGIN)

    def heightForWidth(self, width: int) -> int:
        """The least height the maps need at this width (their smallest legible size)."""
        top = MARGIN + self._hint_height(width) + GAP
        grid = self._grid(QSize(width - 2 * MARGIN, 0))
        return top + (grid.height(len(self.views)) if grid else 0)

    def hasHeightForWidth(self) -> bool:
        return True

    def sizeHint(self) -> QSize:
        return QSize(480, 480)

    def minimumSizeHint(self) -> QSize:
        return QSize(220, 160)

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        self._lay_out()

    def _lay_out(self) -> None:
        self._set_hint()
        width = self.width()
        hint = self._hint_height(width)
        self.hint.setGeometry(MARGIN, MARGIN, width - 2 * MARGIN, hint)
        top = MARGIN + hint + GAP
        grid = self._grid(QSize(width - 2 * MARGIN, self.height() - top - MARGIN))
        if grid is None:
            return
        w, h = grid.map_size.width(), grid.map_size.height()
        for k, (view, switch) in enumerate(zip(self.views, self.switches, strict=True)):
            x = MARGIN + (k % grid.columns) * (w + GAP)
            y = top + (k // grid.columns) * (h + grid.below + GAP)
            view.setGeometry(x, y, w, h)
            switch.setGeometry(x, y + h, w, SWITCH)
            self.norms[k].setGeometry(x, y + h + SWITCH, w, NORMS)
        if self.bar is not None:
            self.bar.setGeometry(QRect(MARGIN + grid.columns * (w + GAP), top, BAR, h))
        self._show_norms()
        self.updateGeometry()  # the scroll area asks heightForWidth again

    def _show_norms(self) -> None:
        """Each head's gradient norms under its map, all in the longest form that fits
        every map's width (the exact numbers in the tooltips); hidden while off."""
        g = self.source.gradients if self.view_state.gradients else None
        s = self.doc.scenario
        kv_of = [s.kv_head_of(h) for h in range(s.n_heads)]
        norms = head_norms(g, kv_of) if g is not None and s.n_heads == len(self.norms) else None
        for label in self.norms:
            label.setVisible(norms is not None)
        if norms is None or not self.norms:
            return
        texts = [norm_texts(*n) for n in norms]
        metrics, room = self.norms[0].fontMetrics(), self.norms[0].width()
        form = next(
            (i for i in range(len(texts[0])) if all(
                metrics.horizontalAdvance(t[i]) <= room for t in texts)),
            len(texts[0]) - 1,
        )  # fmt: skip
        shared = "; W_K and W_V are KV head {}'s" if s.kv_heads != s.n_heads else ""
        for h, label in enumerate(self.norms):
            q, k, v = norms[h]
            label.setText(texts[h][form])
            label.setToolTip(
                f"Head {h + 1}: ‖dL/dW_Q‖ = {q!r}, ‖dL/dW_K‖ = {k!r}, ‖dL/dW_V‖ = {v!r} "
                "(Frobenius norms of the gradients of the loss, View → Loss)"
                + shared.format(kv_of[h] + 1)
            )

    # Drawing ------------------------------------------------------------------------------

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
            if h == 0 and self.bar is not None:
                self.bar.set_spec(spec)
        self._lay_out()  # (the same sizes again, unless the shape or the labels changed)
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
