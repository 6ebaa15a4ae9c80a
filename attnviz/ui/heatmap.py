"""A labelled matrix heatmap: cell image, colour bar, token labels, values, hover, click.

One plain widget paints it all (a QGraphicsScene per view cost five times as much a
paint): the cells as an image, one pixel per cell (or per screen pixel where cells are
smaller), coloured by the core's colour map with explicit levels (the exported figures'
colours; masked cells grey); the hatching of masked (−∞) cells and each value, for the
cells on screen; the token labels, thinned so that they never overlap; a colour bar and
bars beside the rows. An edit recolours the rows and columns it changed. The wheel
zooms, a drag pans, a double click shows the whole matrix again.
"""

from __future__ import annotations

import math

import numpy as np
from PySide6.QtCore import QPointF, QRectF, QSize, Qt, Signal
from PySide6.QtGui import (
    QColor,
    QFont,
    QFontMetricsF,
    QMouseEvent,
    QPainter,
    QPaintEvent,
    QPen,
    QPixmap,
    QResizeEvent,
    QStaticText,
    QTransform,
    QWheelEvent,
)
from PySide6.QtWidgets import QApplication, QToolTip, QWidget

from attnviz.core.figures import colors
from attnviz.core.figures.edits import Lines
from attnviz.core.figures.figure import HeatmapSpec, colorbar_ticks, tick_label
from attnviz.ui.heatmap_parts import (
    CellImage,
    CellMarks,
    ColorBar,
    RowBars,
    RowStrip,
    Samples,
    changed_cells,
    changed_lines,
    labelled,
    samples,
)

__all__ = ["HeatmapView", "Overlay", "RowBars", "on_screen"]

MIN_TEXT_CELL = (26.0, 15.0)  # device pixels a cell needs before its value is printed
SQUARE_UP_TO = 32  # rows or columns; larger non-square matrices fill their view
WHOLE_UP_TO = 1 << 15  # cells: a matrix this small is recoloured whole, quicker than in part
MARGIN = 4.0
TURNED_UP_TO = 72.0  # pixels: a turned column label longer than this is elided
INK = QColor("#222222")
SELECTED = "#ff7f00"  # the selected cell's outline, and the frame of a view that is shown


def on_screen(widget: QWidget) -> bool:
    """Whether some of the widget is on screen: shown, and neither in a dock tabbed behind
    another (Qt keeps such a dock visible, moved outside the window) nor squeezed or
    scrolled out of sight. (A widget off screen is never painted.)"""
    return widget.isVisible() and not widget.visibleRegion().isEmpty()


class Overlay:
    """Something drawn over a heatmap's cells, in cell units (x: columns, y: rows)."""

    view: HeatmapView | None = None

    def update(self) -> None:
        if self.view is not None:
            self.view.update()

    def paint(self, painter: QPainter) -> None:
        raise NotImplementedError


class HeatmapView(QWidget):
    """One matrix as a heatmap with token labels, a colour bar, a tooltip and click-to-select."""

    cellClicked = Signal(str, int, int)  # view name, row, col
    painted = Signal(str)  # view name, after each paint

    def __init__(self, name: str, parent: QWidget | None = None, colorbar: bool = True):
        super().__init__(parent)
        self.name = name
        self.spec: HeatmapSpec | None = None
        self.selected: tuple[int, int] | None = None
        self.marked_column: int | None = None
        self.block_lines: list[int] = []  # x of each line between column blocks
        self.square_cells = False  # set by panels that want them
        # Set by panels that want them: column labels turned upright when, side by side,
        # they would not all show (narrow columns, long tokens).
        self.turn_keys = False
        self._turned = False  # whether they are turned now
        self.framed = False  # an orange frame: the head shown elsewhere
        self.image, self.marks, self.strip = CellImage(), CellMarks(), RowStrip()
        self.bar = ColorBar() if colorbar else None  # none where a neighbour's shows the scale
        self.overlays: list[Overlay] = []
        self.caption_font = QFont()
        self.caption_font.setPointSizeF(10)
        self.value_font = QFont()
        self._line = QFontMetricsF(self.font()).height()  # of a label
        self._caption_line = QFontMetricsF(self.caption_font).height()
        self._range = QRectF(0, 0, 1, 1)  # the cells shown: x columns, y rows
        self._limits = QRectF(0, 0, 1, 1)  # how far zooming out and panning may go
        self._plot = QRectF(0, 0, 1, 1)  # where the cells are drawn, in pixels
        self._titles = (True, True)  # axis titles shown: rows, columns
        self._fill = (1.0, 1.0)  # how much of each axis the matrix fills
        self._label_width = 0.0  # the widest row label
        self._label_height = 0.0  # the widest column label (thinning is by width)
        self._backdrop: QPixmap | None = None  # everything but the cells and the row bars
        self._backdrop_key: tuple[object, ...] = ()
        self._texts: dict[tuple[str, int], QStaticText] = {}  # the values' laid-out words
        self._sampled: tuple[Samples | None, Samples | None] = (None, None)
        self._sampled_for: tuple[object, ...] = ()
        self._press: tuple[QPointF, QRectF] | None = None  # a left press: where, range then
        self._panned = False
        self.setMouseTracking(True)
        self.setFocusPolicy(Qt.FocusPolicy.ClickFocus)  # the last one clicked is exported
        self.setAttribute(Qt.WidgetAttribute.WA_OpaquePaintEvent)
        self.setMinimumSize(150, 120)
        self.preferred = QSize(240, 200)  # a panel short of room asks for less

    # The data ----------------------------------------------------------------------------

    def set_spec(self, spec: HeatmapSpec, changed: Lines | None = None) -> bool:
        """Redraw from a new spec (the values, labels and levels of one matrix); nothing is
        redrawn when it looks exactly like the last one. Returns whether it will repaint.
        ``changed``: the rows and columns outside which the values are those drawn last,
        when the caller knows (from the edit's record); else the view compares. A view off
        screen (scrolled out of sight, say) neither compares nor colours: its image is
        coloured whole when it next paints."""
        before = self.spec
        reshaped = before is None or before.values.shape != spec.values.shape
        same, found = False, None
        seen = on_screen(self)
        if before is not None and not reshaped and changed is None:
            found, same = self._compare(before.values, spec.values, seen)
        elif before is not None and not reshaped and changed is not None:
            same = not (len(changed[0]) or len(changed[1]))
        if same and before is not None and before.looks_like(spec):
            self.spec = spec
            return False
        self.spec = spec
        if self.bar is not None and (self.bar.kind, self.bar.levels) != (spec.kind, spec.levels):
            ticks = [(t, tick_label(t)) for t in colorbar_ticks(spec)]
            self.bar.set_scale(spec.kind, spec.levels, ticks)
        if before is None or (before.row_labels, before.col_labels) != (
            spec.row_labels,
            spec.col_labels,
        ):
            metrics = QFontMetricsF(self.font())
            advance = metrics.horizontalAdvance
            self._label_width = max(map(advance, spec.row_labels), default=0.0)
            self._label_height = max(map(advance, spec.col_labels), default=0.0)
        if reshaped:
            self.fit()
            if self.selected and not self._inside(*self.selected):
                self.select(None)
        else:
            self._relayout()
        # Coloured here with the exported figures' map: masked cells come out grey. When
        # the colour scale stayed, only the rows and columns whose values changed.
        same_scale = before is not None and (before.kind, before.levels) == (spec.kind, spec.levels)
        lines = None
        if same_scale and not reshaped:
            lines = changed if found is None else changed_lines(found)
        if seen:
            self.image.colour(spec, *self._samples(), lines)
        else:
            self.image.key = ()  # (coloured by _paint_image)
        self.marks.set_data(spec, lines)
        self.update()
        return True

    @staticmethod
    def _compare(old: np.ndarray, new: np.ndarray, seen: bool) -> tuple[np.ndarray | None, bool]:
        """(where new differs from old, when found; whether nothing does)."""
        if new is old:
            return None, True
        if not seen:
            return None, False  # (not compared: coloured whole if it is painted)
        if new.size <= WHOLE_UP_TO:
            # A small matrix is recoloured whole: quicker than finding what changed. (Not
            # a large one in a small picture: changed_cells samples its rows first.)
            return None, bool(np.array_equal(old, new))
        found = changed_cells(old, new)
        return found, found is not None and not found.any()

    def set_row_bars(self, columns: list[RowBars]) -> bool:
        """Per-row bars beside the matrix (none by default); nothing is redrawn when they
        are as before. Returns whether it will repaint."""
        same = len(columns) == len(self.strip.columns) and all(
            a.same_as(b) for a, b in zip(columns, self.strip.columns, strict=True)
        )
        self.strip.columns = columns
        if not same:
            self._relayout()
            self.update()
        return not same

    def mark_column(self, col: int | None) -> bool:
        """Outline a whole column, dashed (the key a probe nudged), or none. Returns
        whether it will repaint."""
        if col == self.marked_column:
            return False
        self.marked_column = col
        self.update()
        return True

    def mark_column_blocks(self, width: int) -> None:
        """Draw a line every width columns (the head blocks of concat)."""
        cols = self.spec.values.shape[1] if self.spec is not None else 0
        self.block_lines = list(range(width, cols, width))
        self.update()

    def set_framed(self, framed: bool) -> None:
        if framed != self.framed:
            self.framed = framed
            self.update()

    def add_overlay(self, overlay: Overlay) -> None:
        overlay.view = self
        self.overlays.append(overlay)
        self.update()

    def select(self, cell: tuple[int, int] | None) -> None:
        """Outline one cell (or none)."""
        if cell != self.selected:
            self.selected = cell
            self.update()

    def describe(self, row: int, col: int) -> str:
        """The tooltip text: which cell and its exact value."""
        assert self.spec is not None
        v = float(self.spec.values[row, col])
        value = "−∞ (masked)" if v == -math.inf else repr(v)
        s = self.spec
        where = f"{s.row_title} {s.row_labels[row]} · {s.col_title} {s.col_labels[col]}"
        return f"{s.title}\n{where}\n{value}"

    # Where things go ---------------------------------------------------------------------

    def fit(self) -> None:
        """Show the whole matrix (the user may zoom in; a double click comes back here).

        With square cells the matrix sits in the top-left corner, next to its labels.
        """
        if self.spec is None:
            return
        for _ in range(2):  # once more if the axis titles came or went: the room changed
            self._place()
            rows, cols = self.spec.values.shape
            width, height = self._plot.width(), self._plot.height()
            self._fill = (1.0, 1.0)
            if self._square():
                cell = min(width / cols, height / rows)
                self._fill = (rows * cell / height, cols * cell / width)
                rows, cols = height / cell, width / cell  # what is shown around the matrix
            self._range = QRectF(0, 0, cols, rows)
            self._limits = QRectF(self._range)
            if not self._show_axis_titles():
                break
        self.update()

    def _square(self) -> bool:
        """Square cells, when asked for, for matrices small enough to read cell by cell."""
        rows, cols = self.spec.values.shape if self.spec is not None else (0, 0)
        return self.square_cells and (rows == cols or max(rows, cols) <= SQUARE_UP_TO)

    def _show_axis_titles(self) -> bool:
        """Axis titles (query, key, …) only where there is room and the matrix fills its
        axis; True when that changed.

        Small views give the room to their cells; a square-celled matrix that leaves much of
        an axis empty would have its title float beside nothing. (Hysteresis, because
        hiding a title resizes the cells.)
        """
        roomy = self.height() >= 220 and self.width() >= 240
        titles = tuple(
            roomy and (fill > 0.8 or (shown and fill > 0.6))
            for fill, shown in zip(self._fill, self._titles, strict=True)
        )
        changed = titles != self._titles
        self._titles = (titles[0], titles[1])
        return changed

    def _place(self) -> None:
        """The cells' rectangle, with the column labels turned if asked for and needed:
        when the whole matrix leaves a column less room than the widest label."""
        self._turned = False
        self._plot = self._cells_room()
        if self.turn_keys and self.spec is not None:
            rows, cols = self.spec.values.shape
            cell = self._plot.width() / cols
            if self._square():
                cell = min(cell, self._plot.height() / rows)
            if cell < self._label_height + 6:
                self._turned = True
                self._plot = self._cells_room()

    def _keys_room(self) -> float:
        """The height of the column labels: a line, or the longest turned label."""
        return min(self._label_height, TURNED_UP_TO) if self._turned else self._line

    def _cells_room(self) -> QRectF:
        """Below the caption, the column title and labels, right of the row title and
        labels, left of the row bars and the colour bar."""
        line = self._line
        top = MARGIN + self._caption_line + 4
        top += self._keys_room() + 2 + (line + 2) * self._titles[1]
        left = MARGIN + (line + 4) * self._titles[0] + min(self._label_width, 160.0) + 6
        right = self.width() - MARGIN - self.strip.width()
        right -= self.bar.ROOM if self.bar is not None else 0
        bottom = self.height() - MARGIN
        return QRectF(left, top, max(1.0, right - left), max(1.0, bottom - top))

    def _relayout(self) -> None:
        """Place the cells again; square cells are fitted again when their room changed."""
        before = QRectF(self._plot)
        self._place()
        if self._square() and self._plot != before:
            self.fit()

    def _samples(self) -> tuple[Samples | None, Samples | None]:
        """Along the rows and the columns, the cells the image holds for the view as it is
        now (None: every cell, while cells are a device pixel or more)."""
        if self.spec is None:
            return None, None
        rows, cols = self.spec.values.shape
        t, plot, ratio = self._transform(), self._plot, self.devicePixelRatioF()
        key = (rows, cols, t.m11(), t.m22(), t.dx(), t.dy(), plot.getRect(), ratio)
        if key != self._sampled_for:  # the same until the view moves: not on every edit
            self._sampled_for = key
            self._sampled = (
                samples(
                    rows, t.dy() * ratio, t.m22() * ratio, plot.top() * ratio, plot.bottom() * ratio
                ),
                samples(
                    cols, t.dx() * ratio, t.m11() * ratio, plot.left() * ratio, plot.right() * ratio
                ),
            )
        return self._sampled

    def _transform(self) -> QTransform:
        """Cell units to widget pixels."""
        shown, plot = self._range, self._plot
        sx, sy = plot.width() / shown.width(), plot.height() / shown.height()
        return QTransform(
            sx, 0, 0, sy, plot.left() - shown.left() * sx, plot.top() - shown.top() * sy
        )

    def view_range(self) -> tuple[tuple[float, float], tuple[float, float]]:
        """The cells shown: (first column, last column), (first row, last row)."""
        r = self._range
        return (r.left(), r.right()), (r.top(), r.bottom())

    def point_at(self, x: float, y: float) -> QPointF:
        """Widget pixels of a point in cell units (x: columns, y: rows)."""
        return self._transform().map(QPointF(x, y))

    def labelled(self) -> tuple[range, range]:
        """The rows and the columns whose labels are shown."""
        if self.spec is None:
            return range(0), range(0)
        rows, cols = self.spec.values.shape
        (x0, x1), (y0, y1) = self.view_range()
        line = self._line
        across = line + 1 if self._turned else self._label_height + 6
        return (
            labelled(rows, y0, y1, self._plot.height() / (y1 - y0), line + 1),
            labelled(cols, x0, x1, self._plot.width() / (x1 - x0), across),
        )

    def printed_cells(self) -> tuple[int, int, int, int] | None:
        """Rows r0:r1 and columns c0:c1 whose values are printed: the cells wholly on
        screen (a cut one would show "1.86" as ".86"), when they are large enough to read;
        else None."""
        if self.spec is None:
            return None
        to_pixels = self._transform()
        if to_pixels.m11() < MIN_TEXT_CELL[0] or to_pixels.m22() < MIN_TEXT_CELL[1]:
            return None
        rows, cols = self.spec.values.shape
        (x0, x1), (y0, y1) = self.view_range()
        r0, c0 = max(0, math.ceil(y0 - 1e-6)), max(0, math.ceil(x0 - 1e-6))
        r1, c1 = min(rows, math.floor(y1 + 1e-6)), min(cols, math.floor(x1 + 1e-6))
        return (r0, r1, c0, c1) if r0 < r1 and c0 < c1 else None

    def _inside(self, row: int, col: int) -> bool:
        return (
            self.spec is not None
            and 0 <= row < self.spec.values.shape[0]
            and 0 <= col < self.spec.values.shape[1]
        )

    def _cell_at(self, pos: QPointF) -> tuple[int, int] | None:
        if not self._plot.contains(pos):
            return None
        p = self._transform().inverted()[0].map(pos)
        row, col = math.floor(p.y()), math.floor(p.x())
        return (row, col) if self._inside(row, col) else None

    # Painting ----------------------------------------------------------------------------

    def paintEvent(self, event: QPaintEvent) -> None:
        painter = QPainter(self)
        painter.drawPixmap(0, 0, self._backdrop_now())
        right = self._plot.right()  # of the cells on screen
        if self.spec is not None:
            to_pixels = self._transform()
            self._paint_cells(painter, to_pixels)
            right = min(right, to_pixels.dx() + self.spec.values.shape[1] * to_pixels.m11())
            self.strip.paint(painter, right, to_pixels.dy(), to_pixels.m22(), self._plot)
        if self.bar is not None:  # beside the cells (and their row bars), at most at the edge
            left = min(self.width() - MARGIN - self.bar.ROOM, right + self.strip.width())
            bar = self.bar.pixmap(self._plot.height(), self.devicePixelRatioF())
            painter.drawPixmap(QPointF(left, self._plot.top() - self.bar.PAD), bar)
        if self.framed:
            painter.setPen(QPen(QColor(SELECTED), 3))
            painter.setBrush(Qt.BrushStyle.NoBrush)
            painter.drawRect(QRectF(self.rect()).adjusted(1.5, 1.5, -1.5, -1.5))
        painter.end()
        self.painted.emit(self.name)

    def _backdrop_now(self) -> QPixmap:
        """The white page with the caption, axis titles and labels: redrawn when one of
        them or the view changes, not on every edit."""
        spec = self.spec
        words = () if spec is None else (spec.caption, spec.row_labels, spec.col_labels)
        titles = () if spec is None else (spec.row_title, spec.col_title, self._titles)
        shape = (self.size(), self.devicePixelRatioF(), self._range, self._plot, self._turned)
        key = (*shape, words, titles)
        if self._backdrop is not None and key == self._backdrop_key:
            return self._backdrop
        ratio = self.devicePixelRatioF()
        pixmap = QPixmap(self.size() * ratio)
        pixmap.setDevicePixelRatio(ratio)
        pixmap.fill(QColor("white"))
        painter = QPainter(pixmap)
        if spec is not None:
            self._paint_words(painter, spec)
        painter.end()
        self._backdrop, self._backdrop_key = pixmap, key
        return pixmap

    def _paint_words(self, painter: QPainter, spec: HeatmapSpec) -> None:
        """The caption over the cells, the axis titles, and the labels of the rows and
        columns on screen."""
        plot, line = self._plot, self._line
        cells = QRectF(self.point_at(0, 0), self.point_at(*spec.values.shape[::-1]))
        cells = cells.intersected(plot)
        painter.setPen(QPen(INK))
        painter.setFont(self.caption_font)
        caption_height = self._caption_line
        centre = Qt.AlignmentFlag.AlignCenter
        over = QRectF(cells.left() - 200, MARGIN, cells.width() + 400, caption_height)
        painter.drawText(over, centre | Qt.TextFlag.TextDontClip, spec.caption)
        painter.setFont(self.font())
        rows, cols = self.labelled()
        self._paint_keys(painter, spec, cols, cells)
        width = min(self._label_width, 160.0)
        right = Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter
        for i in rows:
            y = self.point_at(0, i + 0.5).y()
            painter.drawText(
                QRectF(plot.left() - 6 - width, y - line / 2, width, line),
                right,
                spec.row_labels[i],
            )
        if self._titles[1]:
            painter.drawText(
                QRectF(
                    cells.left(), plot.top() - self._keys_room() - line - 4, cells.width(), line
                ),
                centre,
                spec.col_title,
            )
        if self._titles[0]:
            painter.save()
            painter.translate(MARGIN, cells.center().y())
            painter.rotate(-90)
            painter.drawText(
                QRectF(-cells.height() / 2, 0, cells.height(), line), centre, spec.row_title
            )
            painter.restore()

    def _paint_keys(self, painter: QPainter, spec: HeatmapSpec, cols: range, cells: QRectF) -> None:
        """The column labels: side by side, or turned to read upwards from the cells, each
        within the cells' width (never over what is drawn beside them)."""
        plot, line = self._plot, self._line
        if not self._turned:
            for j in cols:
                x = self.point_at(j + 0.5, 0).x()
                painter.drawText(
                    QRectF(x - 100, plot.top() - line - 2, 200, line),
                    Qt.AlignmentFlag.AlignCenter,
                    spec.col_labels[j],
                )
            return
        room = self._keys_room()
        metrics = QFontMetricsF(self.font())
        low, high = cells.left() + line / 2, cells.right() - line / 2
        for j in cols:
            x = max(min(self.point_at(j + 0.5, 0).x(), high), low)
            text = metrics.elidedText(spec.col_labels[j], Qt.TextElideMode.ElideRight, room)
            painter.save()
            painter.translate(x, plot.top() - 2)
            painter.rotate(-90)
            painter.drawText(
                QRectF(0, -line / 2, room, line),
                Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter,
                text,
            )
            painter.restore()

    def _paint_cells(self, painter: QPainter, to_pixels: QTransform) -> None:
        """The cells on screen, their marks and values, and what lies over them."""
        assert self.spec is not None
        rows, cols = self.spec.values.shape
        shown = to_pixels.inverted()[0].mapRect(self._plot).intersected(QRectF(0, 0, cols, rows))
        if shown.isEmpty():
            return
        r0, r1 = max(0, int(shown.top())), min(rows, math.ceil(shown.bottom()))
        c0, c1 = max(0, int(shown.left())), min(cols, math.ceil(shown.right()))
        painter.save()
        painter.setClipRect(self._plot)
        self._paint_image(painter, to_pixels, (r0, r1, c0, c1))
        painter.setTransform(to_pixels)
        cell_w, cell_h = to_pixels.m11(), to_pixels.m22()
        self.marks.paint(painter, (r0, r1, c0, c1), min(cell_w, cell_h))
        printed = self.printed_cells()
        if printed is not None:
            self._paint_values(painter, printed, to_pixels)
        self._paint_lines(painter, rows, cols)
        for overlay in self.overlays:
            overlay.paint(painter)
        painter.restore()

    def _paint_image(
        self, painter: QPainter, to_pixels: QTransform, shown: tuple[int, int, int, int]
    ) -> None:
        """The cells' colours and, where cells are too small to hatch, the masked cells'
        shade: pixel for pixel along an axis the image samples, scaled along the others."""
        assert self.spec is not None
        along_rows, along_cols = self._samples()
        if self.image.key != self.image.key_of(self.spec, along_rows, along_cols):
            self.image.colour(self.spec, along_rows, along_cols)  # resized, zoomed or panned
        ratio = self.devicePixelRatioF()

        def span(
            sampled: Samples | None, first: int, last: int, origin: float, cell: float
        ) -> tuple[float, float, float, float]:
            """Image pixels from, to; widget pixels from, to."""
            if sampled is None:
                return first, last, origin + first * cell, origin + last * cell
            return 0, len(sampled.cells), sampled.first / ratio, sampled.last / ratio

        r0, r1, c0, c1 = shown
        y0, y1, top, bottom = span(along_rows, r0, r1, to_pixels.dy(), to_pixels.m22())
        x0, x1, left, right = span(along_cols, c0, c1, to_pixels.dx(), to_pixels.m11())
        source, target = (
            QRectF(x0, y0, x1 - x0, y1 - y0),
            QRectF(left, top, right - left, bottom - top),
        )
        if self.image.image is None:  # no whole pixel shows a cell
            return
        painter.drawImage(target, self.image.image, source)
        if not self.marks.hatches(min(to_pixels.m11(), to_pixels.m22())):
            shade = self.marks.shade_of(self.image)
            if shade is not None:
                painter.drawImage(target, shade, source)

    def _paint_values(
        self, painter: QPainter, shown: tuple[int, int, int, int], to_pixels: QTransform
    ) -> None:
        """Each value, centred in its cell, black or white, whichever reads better."""
        assert self.spec is not None
        r0, r1, c0, c1 = shown
        block = self.spec.values[r0:r1, c0:c1]
        sx, sy, ox, oy = to_pixels.m11(), to_pixels.m22(), to_pixels.dx(), to_pixels.dy()
        painter.save()
        painter.resetTransform()
        font = QFont(self.value_font)
        font.setPixelSize(max(9, min(14, int(min(sy * 0.45, sx * 0.24)))))
        painter.setFont(font)
        kind, levels = self.spec.kind, self.spec.levels
        dark = colors.dark_text_on(block, kind, levels)
        values = block.tolist()  # Python numbers: the loop below runs per cell
        for use_dark, colour in ((True, "#000000"), (False, "#ffffff")):
            painter.setPen(QPen(QColor(colour)))
            for i, j in np.argwhere(dark == use_dark).tolist():
                text = self._static_text(colors.cell_text(values[i][j]), font)
                size = text.size()
                x = ox + sx * (c0 + j) + (sx - size.width()) / 2
                y = oy + sy * (r0 + i) + (sy - size.height()) / 2
                painter.drawStaticText(QPointF(x, y), text)
        painter.restore()

    def _static_text(self, words: str, font: QFont) -> QStaticText:
        """words laid out once in font, for as long as they are printed (a cell's number
        drawn from its layout: half the time of drawText)."""
        key = (words, font.pixelSize())
        text = self._texts.get(key)
        if text is None:
            if len(self._texts) > 4096:
                self._texts.clear()
            text = QStaticText(words)
            text.setTextFormat(Qt.TextFormat.PlainText)
            text.prepare(QTransform(), font)
            self._texts[key] = text
        return text

    def _paint_lines(self, painter: QPainter, rows: int, cols: int) -> None:
        """Lines between column blocks, the probe's column (dashed), the selected cell."""

        def pen(colour: str, width: float, style: Qt.PenStyle = Qt.PenStyle.SolidLine) -> QPen:
            p = QPen(QColor(colour), width, style)
            p.setCosmetic(True)
            return p

        painter.setBrush(Qt.BrushStyle.NoBrush)
        if self.block_lines:
            painter.setPen(pen("#222222", 2))
            for x in self.block_lines:
                painter.drawLine(QPointF(x, 0), QPointF(x, rows))
        if self.marked_column is not None and 0 <= self.marked_column < cols:
            painter.setPen(pen(colors.PROBE, 3, Qt.PenStyle.DashLine))
            painter.drawRect(QRectF(self.marked_column, 0, 1, rows))
        if self.selected is not None:
            painter.setPen(pen(SELECTED, 3))
            painter.drawRect(QRectF(self.selected[1], self.selected[0], 1, 1))

    # Events ------------------------------------------------------------------------------

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        self._show_axis_titles()
        self._relayout()

    def sizeHint(self) -> QSize:
        return self.preferred

    def wheelEvent(self, event: QWheelEvent) -> None:
        """Zoom about the pointer, both axes alike, between one cell and the whole matrix."""
        if self.spec is None or not self._plot.contains(event.position()):
            event.ignore()
            return
        shown, limits = self._range, self._limits
        factor = 0.8 ** (event.angleDelta().y() / 120)
        smallest = max(1 / shown.width(), 1 / shown.height())
        largest = min(limits.width() / shown.width(), limits.height() / shown.height())
        factor = min(max(factor, smallest), max(largest, smallest))
        at = self._transform().inverted()[0].map(event.position())
        zoomed = QRectF(
            at.x() - (at.x() - shown.left()) * factor,
            at.y() - (at.y() - shown.top()) * factor,
            shown.width() * factor,
            shown.height() * factor,
        )
        self._show(zoomed)
        event.accept()

    def _show(self, shown: QRectF) -> None:
        """Show these cells, moved inside the limits."""
        limits = self._limits
        x = min(max(shown.left(), limits.left()), limits.right() - shown.width())
        y = min(max(shown.top(), limits.top()), limits.bottom() - shown.height())
        self._range = QRectF(
            max(x, limits.left()), max(y, limits.top()), shown.width(), shown.height()
        )
        self.update()

    def mousePressEvent(self, event: QMouseEvent) -> None:
        if event.button() == Qt.MouseButton.LeftButton:
            self._press, self._panned = (event.position(), QRectF(self._range)), False

    def mouseMoveEvent(self, event: QMouseEvent) -> None:
        if self._press is not None:
            start, shown = self._press
            moved = event.position() - start
            if self._panned or moved.manhattanLength() >= QApplication.startDragDistance():
                self._panned = True
                to_pixels = self._transform()
                dx, dy = moved.x() / to_pixels.m11(), moved.y() / to_pixels.m22()
                self._show(shown.translated(-dx, -dy))
                return
        cell = self._cell_at(event.position())
        if cell is None:
            QToolTip.hideText()
        else:
            QToolTip.showText(event.globalPosition().toPoint(), self.describe(*cell), self)

    def mouseReleaseEvent(self, event: QMouseEvent) -> None:
        if event.button() != Qt.MouseButton.LeftButton or self._press is None:
            return
        self._press = None
        if self._panned:
            return
        cell = self._cell_at(event.position())
        if cell is not None:
            self.select(cell)
            self.cellClicked.emit(self.name, *cell)

    def mouseDoubleClickEvent(self, event: QMouseEvent) -> None:
        if event.button() == Qt.MouseButton.LeftButton:
            self.fit()

    def leaveEvent(self, event: object) -> None:
        QToolTip.hideText()
