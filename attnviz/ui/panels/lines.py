"""Lines dock (BertViz's head view): queries left, keys right, a line per weight and head.

A line's opacity is the head's attention weight; each head has its colour. Hovering a
token (or moving to it with the arrow keys) keeps only its lines and prints their
weights beside the other column. The figure exports as SVG or PNG
(``attnviz.core.figures.lines``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PySide6.QtCore import QEvent, QLineF, QPoint, QRect, QRectF, QSize, Qt, Signal
from PySide6.QtGui import (
    QColor,
    QFont,
    QFontMetricsF,
    QIcon,
    QImage,
    QKeyEvent,
    QMouseEvent,
    QPainter,
    QPaintEvent,
    QPen,
    QPixmap,
)
from PySide6.QtWidgets import (
    QCheckBox,
    QFrame,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QMenu,
    QMessageBox,
    QPushButton,
    QScrollArea,
    QVBoxLayout,
    QWidget,
)

from attnviz.core.figures.lines import (
    MAX_WEIGHT_TEXTS,
    MUTED,
    THRESHOLD,
    HeadWeights,
    Isolated,
    head_color,
    isolated_weights,
    lines_svg,
    shown_lines,
    strand,
    weight_text,
)
from attnviz.core.io.files import printable
from attnviz.core.maths.results import Result
from attnviz.ui.images import ask_image_path, export_error, save_svg
from attnviz.ui.panels.common import ResultPanel
from attnviz.ui.workers import SerialQueue
from attnviz.ui.workspace import Workspace

MAX_LINES = 4000  # drawn at once without isolation: the strongest (painting costs per line)
SMOOTH_LINES = 1500  # antialiased up to this many lines (drawn once, then cached)
SMOOTH_HOVER = 500  # the same while hovering (drawn on every move)
HEAD_COLUMNS = 8  # head check boxes per row
MAX_ROW = 30.0  # rows grow to fill the height up to this (few tokens)
HEADING = 16.0  # the "queries" and "keys" headings above the columns
ISOLATED_FILL = "#e3ecf7"


@dataclass(frozen=True)
class Geometry:
    """Where the canvas draws, in widget pixels."""

    top: float  # the first row's top
    row: float  # row height
    q_x: float  # query labels end here (right-aligned)
    k_x: float  # key labels start here
    texts: float  # width of the printed weights beside a column
    label_w: tuple[float, float]  # widths of the query and key columns
    width: float  # the least width that shows it all

    def row_at(self, y: float, count: int) -> int | None:
        k = math.floor((y - self.top) / self.row)
        return k if 0 <= k < count else None

    def centre(self, k: int) -> float:
        return self.top + (k + 0.5) * self.row


class LinesCanvas(QWidget):
    """The token columns and the lines, painted; the lines are cached as an image."""

    isolatedChanged = Signal(object)  # Isolated or None
    reveal = Signal(int, int, int)  # x, y, margin: a token picked with the keys, to scroll to
    painted = Signal()  # after each paint

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setMouseTracking(True)
        self.setFocusPolicy(Qt.FocusPolicy.StrongFocus)
        self.setAccessibleName("Attention lines")
        self.setAccessibleDescription(
            "Queries left, keys right. Arrow keys pick a token and show its lines only; "
            "Escape shows all lines again."
        )
        self.tokens: tuple[str, ...] = ()
        self.keys: tuple[str, ...] = ()
        self.weights: HeadWeights = ()
        self.heads: tuple[int, ...] = ()
        self.isolated: Isolated | None = None
        self.note = ""  # how many lines are drawn
        self._by_mouse = False
        self._floor = THRESHOLD  # the faintest weight drawn without isolation
        self._version = 0
        self._cache: tuple[tuple[object, ...], QRect, QImage] | None = None
        self._geometry: tuple[tuple[object, ...], Geometry] | None = None

    # Data --------------------------------------------------------------------------------

    def set_data(
        self,
        tokens: tuple[str, ...],
        keys: tuple[str, ...],
        weights: HeadWeights,
        heads: tuple[int, ...],
    ) -> bool:
        """What to draw: weights holds each head's queries × keys; heads are those shown.
        Returns whether it will repaint."""
        if (tokens, keys, heads) == (self.tokens, self.keys, self.heads) and all(
            weights[h] is self.weights[h] for h in heads
        ):
            return False
        self.tokens, self.keys, self.weights, self.heads = tokens, keys, weights, heads
        self._version += 1
        iso = self.isolated
        if iso is not None and iso.index >= len(tokens if iso.side == "query" else keys):
            self.set_isolated(None)
        self._count_lines()
        self.updateGeometry()
        self.setMinimumSize(self.sizeHint())
        self.update()
        return True

    def set_isolated(self, isolated: Isolated | None, by_mouse: bool = False) -> None:
        self._by_mouse = by_mouse and isolated is not None
        if isolated != self.isolated:
            self.isolated = isolated
            self.update()
            self.isolatedChanged.emit(isolated)

    def _count_lines(self) -> None:
        found = sum(len(qs) for _, qs, _, _ in shown_lines(self.weights, self.heads))
        self._floor = THRESHOLD
        if found > MAX_LINES:  # (the strongest are among those that have lines)
            shown = [self.weights[h] for h in self.heads]
            every = np.concatenate([w[w >= THRESHOLD] for w in shown])
            self._floor = float(np.partition(every, -MAX_LINES)[-MAX_LINES])
            self.note = (
                f"Showing the {MAX_LINES:,} strongest of {found:,} lines (weights ≥ "
                f"{self._floor:.3f}); hover a token for all of its lines."
            )
        else:
            self.note = f"{found:,} lines (weights ≥ {THRESHOLD:g})." if self.heads else ""

    # Geometry ------------------------------------------------------------------------------

    def _font(self) -> QFont:
        font = QFont(self.font())
        font.setPixelSize(13 if max(len(self.tokens), len(self.keys)) <= 40 else 11)
        return font

    def _least_row(self, fm: QFontMetricsF) -> float:
        return math.ceil(fm.height()) + (6.0 if fm.height() > 15 else 2.0)

    def geometry_now(self) -> Geometry:
        font = self._font()
        # (not the weights: an edit that changes them alone measures no label again)
        key = (
            self.tokens,
            self.keys,
            len(self.heads),
            font.pixelSize(),
            self.width(),
            self.height(),
        )
        if self._geometry is not None and self._geometry[0] == key:
            return self._geometry[1]
        fm = QFontMetricsF(font)
        rows = max(len(self.tokens), len(self.keys), 1)
        row = max(self._least_row(fm), min(MAX_ROW, (self.height() - 16 - HEADING) / rows))
        strong = QFont(font)
        strong.setBold(True)  # an isolated token's label is bold: room for that
        bold = QFontMetricsF(strong)
        widest = [
            min(240.0, max([bold.horizontalAdvance(t) for t in labels] + [fm.averageCharWidth()]))
            for labels in (self.tokens, self.keys)
        ]
        shown = min(len(self.heads), MAX_WEIGHT_TEXTS)
        step = fm.horizontalAdvance("0.00") + 8
        texts = shown * step + (fm.horizontalAdvance("…") if len(self.heads) > shown else 0)
        gap, margin = 10.0, 8.0
        least = 2 * margin + 2 * texts + widest[0] + widest[1] + 2 * gap + 80.0
        band = min(420.0, max(80.0, self.width() - least + 80.0))
        used = least - 80.0 + band
        left = max(margin, (self.width() - used) / 2 + margin)
        q_x = left + texts + widest[0]
        k_x = q_x + 2 * gap + band
        top = 8.0 + HEADING
        geometry = Geometry(top, float(row), q_x, k_x, texts, (widest[0], widest[1]), least)
        self._geometry = (key, geometry)
        return geometry

    def sizeHint(self) -> QSize:
        g = self.geometry_now()
        rows = max(len(self.tokens), len(self.keys), 1)
        row = self._least_row(QFontMetricsF(self._font()))
        return QSize(math.ceil(g.width), math.ceil(g.top + rows * row + 8))

    def _draw_headings(self, p: QPainter, g: Geometry) -> None:
        font = QFont(self.font())
        font.setPixelSize(11)
        font.setItalic(True)
        p.setFont(font)
        p.setPen(QColor("#555555"))
        box = QRectF(0, 4, g.q_x, HEADING)
        p.drawText(box, Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter, "queries")
        box = QRectF(g.k_x, 4, max(1.0, self.width() - g.k_x), HEADING)
        p.drawText(box, Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter, "keys")

    def minimumSizeHint(self) -> QSize:
        return self.sizeHint()

    def resizeEvent(self, event: object) -> None:
        self._cache = None
        super().resizeEvent(event)  # type: ignore[arg-type]

    # Painting ------------------------------------------------------------------------------

    def paintEvent(self, event: QPaintEvent) -> None:
        g = self.geometry_now()
        p = QPainter(self)
        if self.isolated is None:
            seen = self.visibleRegion().boundingRect().united(event.rect())
            area, image = self._lines_image(seen, g)
            p.drawImage(area.topLeft(), image)
        else:
            p.fillRect(event.rect(), QColor("white"))
            self._draw_lines(p, g, QRectF(event.rect()), self.isolated, THRESHOLD, SMOOTH_HOVER)
        if event.rect().top() < g.top:
            self._draw_headings(p, g)
        self._draw_labels(p, g, event.rect())
        p.end()
        self.painted.emit()

    def _lines_image(self, seen: QRect, g: Geometry) -> tuple[QRect, QImage]:
        """The cached image of all lines, redrawn when it does not cover what is seen: of
        new lines (after an edit), what is seen alone, at once; of the same lines scrolled
        to, what is seen and as much again above and below (so scrolling on reuses it)."""
        key, more = (self._version, self.width(), g, self._floor), 0
        if self._cache is not None and self._cache[0] == key:  # the same lines
            if self._cache[1].contains(seen):
                return self._cache[1], self._cache[2]
            more = min(seen.height(), 2000)  # scrolled
        area = seen.adjusted(0, -more, 0, more).intersected(self.rect())
        area = area.united(seen)
        ratio = self.devicePixelRatioF()
        image = QImage(
            max(1, round(area.width() * ratio)),
            max(1, round(area.height() * ratio)),
            QImage.Format.Format_ARGB32_Premultiplied,
        )
        image.setDevicePixelRatio(ratio)
        image.fill(QColor("white"))
        p = QPainter(image)
        p.translate(-area.left(), -area.top())
        self._draw_lines(p, g, QRectF(area), None, self._floor, SMOOTH_LINES)
        p.end()
        self._cache = (key, area, image)
        return area, image

    def _draw_lines(
        self,
        p: QPainter,
        g: Geometry,
        area: QRectF,
        isolated: Isolated | None,
        floor: float,
        smooth: int,
    ) -> None:
        """Each head's lines at or above floor that cross area, one call per opacity step;
        antialiased when there are at most ``smooth`` lines: smooth edges cost Qt's
        rasteriser several times the time, and among thousands of lines nobody misses them."""
        x1, x2 = g.q_x + 6.0, g.k_x - 6.0
        found = shown_lines(self.weights, self.heads, isolated, floor)
        p.setRenderHint(QPainter.RenderHint.Antialiasing, sum(len(f[1]) for f in found) <= smooth)
        for c, (h, qs, ks, ws) in enumerate(found):
            d = g.top + 0.5 * g.row + strand(c, len(self.heads), g.row)
            y1, y2 = d + qs * g.row, d + ks * g.row
            seen = (np.minimum(y1, y2) <= area.bottom()) & (np.maximum(y1, y2) >= area.top())
            alpha = np.clip(np.rint(ws[seen] * 255), 1, 255).astype(int) // 4 * 4 + 3
            y1, y2 = y1[seen], y2[seen]
            color = QColor(head_color(h))
            for a in np.unique(alpha).tolist():
                pick = alpha == a
                color.setAlpha(min(a, 255))
                pen = QPen(color)
                pen.setWidthF(1.5)
                p.setPen(pen)
                p.drawLines(
                    [
                        QLineF(x1, u, x2, v)
                        for u, v in zip(y1[pick].tolist(), y2[pick].tolist(), strict=True)
                    ]
                )

    def _draw_labels(self, p: QPainter, g: Geometry, area: QRect) -> None:
        font = self._font()
        p.setFont(font)
        iso = self.isolated
        text_color, muted = QColor("#202020"), QColor(MUTED)  # on white, whatever the theme
        for side, labels, x, w in (
            ("query", self.tokens, g.q_x - g.label_w[0], g.label_w[0]),
            ("key", self.keys, g.k_x, g.label_w[1]),
        ):
            align = Qt.AlignmentFlag.AlignVCenter | (
                Qt.AlignmentFlag.AlignRight if side == "query" else Qt.AlignmentFlag.AlignLeft
            )
            first = max(0, math.floor((area.top() - g.top) / g.row))
            last = min(len(labels), math.ceil((area.bottom() - g.top) / g.row) + 1)
            for k in range(first, last):
                box = QRectF(x, g.top + k * g.row, w, g.row)
                mine = iso is not None and iso.side == side
                bold = mine and iso is not None and iso.index == k
                if bold:
                    p.fillRect(box.adjusted(-4, 0, 4, 0), QColor(ISOLATED_FILL))
                    if self.hasFocus() and not self._by_mouse:
                        p.setPen(QPen(QColor("#0072B2"), 1, Qt.PenStyle.DotLine))
                        p.drawRect(box.adjusted(-4, 0, 4, -1))
                font.setBold(bold)
                p.setFont(font)
                p.setPen(muted if mine and not bold else text_color)
                text = p.fontMetrics().elidedText(
                    labels[k], Qt.TextElideMode.ElideRight, round(w) + 1
                )
                p.drawText(box, align, text)
            font.setBold(False)
            p.setFont(font)
        if iso is not None:
            self._draw_weights(p, g, area, iso)

    def printed_weights(self) -> list[list[tuple[int, str, bool]]]:
        """While a token is isolated: per row of the other column, (head, text, has a line)
        of the weights printed beside it (for the first MAX_WEIGHT_TEXTS heads shown)."""
        iso = self.isolated
        if iso is None:
            return []
        columns = [(h, isolated_weights(self.weights, h, iso)) for h in self.heads]
        count = len(self.keys if iso.side == "query" else self.tokens)
        return [
            [
                (h, weight_text(float(w[k])), bool(w[k] >= THRESHOLD))
                for h, w in columns[:MAX_WEIGHT_TEXTS]
            ]
            for k in range(count)
        ]

    def _draw_weights(self, p: QPainter, g: Geometry, area: QRect, iso: Isolated) -> None:
        """The isolated lines' weights beside the other column, in their heads' colours
        (grey where the weight has no line)."""
        rows = self.printed_weights()
        step = QFontMetricsF(p.font()).horizontalAdvance("0.00") + 8
        if iso.side == "query":
            start = g.k_x + g.label_w[1] + 8
        else:
            start = g.q_x - g.label_w[0] - g.texts - 4
        first = max(0, math.floor((area.top() - g.top) / g.row))
        last = min(len(rows), math.ceil((area.bottom() - g.top) / g.row) + 1)
        align = Qt.AlignmentFlag.AlignVCenter | Qt.AlignmentFlag.AlignLeft
        more = len(self.heads) > MAX_WEIGHT_TEXTS
        for k in range(first, last):
            texts = [*rows[k], (-1, "…", False)] if more else rows[k]
            for c, (h, text, line) in enumerate(texts):
                p.setPen(QColor(head_color(h) if line else MUTED))
                p.drawText(QRectF(start + c * step, g.top + k * g.row, step, g.row), align, text)

    # Hover and keys --------------------------------------------------------------------------

    def token_at(self, pos: QPoint) -> Isolated | None:
        """The token under a point: a query left of the lines, a key right of them."""
        g = self.geometry_now()
        if pos.x() < g.q_x + 4:
            k = g.row_at(pos.y(), len(self.tokens))
            return None if k is None else Isolated("query", k)
        if pos.x() > g.k_x - 4:
            k = g.row_at(pos.y(), len(self.keys))
            return None if k is None else Isolated("key", k)
        return None

    def mouseMoveEvent(self, event: QMouseEvent) -> None:
        self.set_isolated(self.token_at(event.position().toPoint()), by_mouse=True)
        super().mouseMoveEvent(event)

    def leaveEvent(self, event: QEvent) -> None:
        if self._by_mouse:
            self.set_isolated(None)
        super().leaveEvent(event)

    def keyPressEvent(self, event: QKeyEvent) -> None:
        """Up/Down, Home/End: the previous, next, first, last token of the column;
        Left/Right: the query or key column; Escape: every line again."""
        iso, key = self.isolated, event.key()
        side = iso.side if iso is not None else "query"
        index = iso.index if iso is not None else -1
        count = len(self.tokens if side == "query" else self.keys)
        moves = {
            Qt.Key.Key_Up: (side, index - 1),
            Qt.Key.Key_Down: (side, index + 1),
            Qt.Key.Key_Home: (side, 0),
            Qt.Key.Key_End: (side, count - 1),
            Qt.Key.Key_Left: ("query", max(index, 0)),
            Qt.Key.Key_Right: ("key", max(index, 0)),
        }
        if key == Qt.Key.Key_Escape and iso is not None:
            self.set_isolated(None)
        elif key in moves:
            side, index = moves[key]  # type: ignore[index]
            count = len(self.tokens if side == "query" else self.keys)
            if count:
                index = max(0, min(index, count - 1))
                self.set_isolated(Isolated(side, index))
                g = self.geometry_now()
                x = g.q_x if side == "query" else g.k_x
                self.reveal.emit(round(x), round(g.centre(index)), round(g.row))
        else:
            super().keyPressEvent(event)

    def focusOutEvent(self, event: object) -> None:
        self.update()
        super().focusOutEvent(event)  # type: ignore[arg-type]


def swatch(color: str) -> QIcon:
    pixmap = QPixmap(12, 12)
    pixmap.fill(QColor(color))
    return QIcon(pixmap)


class LinesPanel(ResultPanel):
    """The lines view of the shown head, or of the heads ticked; export as SVG or PNG."""

    message = Signal(str)
    exported = Signal(str, str)  # path, '' or why it failed (from the export thread)

    def __init__(self, ws: Workspace, parent: QWidget | None = None):
        super().__init__(ws, parent)
        self.follow = True  # show the head the toolbar shows, until heads are ticked
        self.chosen: set[int] = set()
        self.switches: list[QCheckBox] = []
        self._writes = SerialQueue()
        hint = QLabel(
            "Queries on the left, keys on the right; a line's opacity is the head's "
            "attention weight. Hover a token, or use the arrow keys, to see only its lines "
            "and their weights."
        )
        hint.setWordWrap(True)
        self.heads_grid = QGridLayout()
        self.heads_grid.setHorizontalSpacing(10)
        self.shown_button = QPushButton("Shown head")
        self.shown_button.setToolTip("Show the head chosen in the toolbar (and follow it)")
        self.shown_button.clicked.connect(self.follow_shown_head)
        self.all_button = QPushButton("All heads")
        self.all_button.clicked.connect(self.show_all_heads)
        self.export_button = QPushButton("Export…")
        self.export_button.setToolTip("Save this view as SVG or PNG")
        self.export_button.clicked.connect(self.export)
        self.note = QLabel()
        self.note.setStyleSheet("color: #555555")
        self.canvas = LinesCanvas()
        self.canvas.isolatedChanged.connect(self._isolated)
        self.canvas.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.canvas.customContextMenuRequested.connect(self._context_menu)
        self.view = QScrollArea()
        self.view.setWidgetResizable(True)
        self.view.setFrameShape(QFrame.Shape.StyledPanel)
        self.view.setWidget(self.canvas)
        self.canvas.reveal.connect(lambda x, y, margin: self.view.ensureVisible(x, y, 0, margin))
        bar = QHBoxLayout()
        for button in (self.shown_button, self.all_button, self.export_button):
            bar.addWidget(button)
        bar.addStretch(1)
        heads = QHBoxLayout()
        heads.addWidget(QLabel("Heads:"), 0, Qt.AlignmentFlag.AlignTop)
        heads.addLayout(self.heads_grid)
        heads.addStretch(1)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addWidget(hint)
        layout.addLayout(bar)
        layout.addLayout(heads)
        layout.addWidget(self.note)
        layout.addWidget(self.view, 1)
        ws.view_state.headChanged.connect(self._head_changed)
        self.exported.connect(self._exported)

    # Heads -------------------------------------------------------------------------------------

    def shown_heads(self, n_heads: int) -> tuple[int, ...]:
        if self.follow:
            return (min(self.view_state.head, n_heads - 1),)
        return tuple(h for h in sorted(self.chosen) if h < n_heads)

    def _build_switches(self, count: int) -> None:
        for switch in self.switches:
            self.heads_grid.removeWidget(switch)
            switch.deleteLater()
        self.switches = []
        for h in range(count):
            switch = QCheckBox(str(h + 1))
            switch.setIcon(swatch(head_color(h)))
            switch.setToolTip(f"Show head {h + 1}'s lines")
            switch.setAccessibleName(f"head {h + 1}")
            switch.toggled.connect(lambda on, h=h: self._toggle(h, on))
            self.heads_grid.addWidget(switch, h // HEAD_COLUMNS, h % HEAD_COLUMNS)
            self.switches.append(switch)

    def _toggle(self, head: int, on: bool) -> None:
        if self.follow:
            self.chosen = {min(self.view_state.head, len(self.switches) - 1)}
            self.follow = False
        if on:
            self.chosen.add(head)
        else:
            self.chosen.discard(head)
        self.redraw()

    def _head_changed(self, _: int) -> None:
        if self.follow:
            self.redraw()

    def follow_shown_head(self) -> None:
        self.follow = True
        self.redraw()

    def show_all_heads(self) -> None:
        self.follow = False
        self.chosen = set(range(len(self.switches)))
        self.redraw()

    # Drawing ---------------------------------------------------------------------------------

    def show_result(self, result: Result) -> None:
        if len(self.switches) != result.n_heads:
            self._build_switches(result.n_heads)
        heads = self.shown_heads(result.n_heads)
        for h, switch in enumerate(self.switches):
            switch.blockSignals(True)
            switch.setChecked(h in heads)
            switch.blockSignals(False)
        self.shown_button.setEnabled(not self.follow)
        weights = tuple(head.weights for head in result.heads)  # (no stack: 25 MB at n = 512)
        self.canvas.set_data(tuple(result.tokens), tuple(result.keys), weights, heads)
        self.note.setText(self.canvas.note or "Tick a head to see its lines.")

    def title(self) -> str:
        heads = self.canvas.heads
        names = ", ".join(str(h + 1) for h in heads)
        return f"Attention lines · head{'s' * (len(heads) > 1)} {names}" if heads else ""

    def _isolated(self, iso: Isolated | None) -> None:
        if iso is None:
            return
        c = self.canvas
        if not c.heads:
            return
        # What a screen reader says of the token picked (the weights are only painted).
        w = isolated_weights(c.weights, c.heads[0], iso)
        top, most = int(np.argmax(w)), weight_text(float(np.max(w)))
        if iso.side == "query":
            text = f"query {c.tokens[iso.index]}: most weight on key {c.keys[top]}, {most}"
        else:
            text = f"key {c.keys[iso.index]}: most weight from query {c.tokens[top]}, {most}"
        c.setAccessibleDescription(f"{text} (head {c.heads[0] + 1})")

    # Export ----------------------------------------------------------------------------------

    def figure(self) -> str:
        """The view as shown (with the isolated token, if any) as an SVG document."""
        c = self.canvas
        return lines_svg(c.tokens, c.keys, c.weights, c.heads, c.isolated, self.title())

    def _context_menu(self, pos: QPoint) -> None:
        menu = QMenu(self.canvas)
        menu.addAction("Export as SVG or PNG…", self.export)
        menu.addAction("Show all heads", self.show_all_heads)
        menu.addAction("Show the shown head only", self.follow_shown_head)
        menu.exec(self.canvas.mapToGlobal(pos))

    def export(self) -> None:
        heads = "-".join(str(h + 1) for h in self.canvas.heads) or "none"
        folder = self.doc.path.parent if self.doc.path else Path.home()
        answer = ask_image_path(
            self, "Export the lines view", str(folder / f"lines-head{heads}.png")
        )
        if answer is not None:
            self.export_to(*answer)

    def export_to(self, path: Path, scale: float = 2.0) -> None:
        """Write the view as SVG or PNG (by the suffix) on a worker thread: a PNG of many
        lines takes a while to draw. ``exported`` follows."""
        svg = self.figure()

        def write() -> None:
            try:
                save_svg(svg, path, scale)
            except (OSError, ValueError, MemoryError) as e:
                self.exported.emit(str(path), export_error(path, e))
                return
            self.exported.emit(str(path), "")

        self.message.emit(f"Exporting {printable(path.name)}…")
        self._writes.submit(write)

    def wait(self) -> None:
        """Block until the queued exports are written (tests)."""
        self._writes.wait()

    def _exported(self, path: str, error: str) -> None:
        if error:
            self.message.emit(error)
            QMessageBox.warning(self, "Cannot export the image", error)
        else:
            self.message.emit(f"Exported {printable(Path(path).name)}")
