"""A labelled matrix heatmap: cell image, colour bar, token labels, values, hover, click.

The image holds one pixel per cell, coloured by the core's colour map with explicit
levels (the same colours as the exported figures; masked cells grey); an edit recolours
the rows and columns it changed. Values and the hatching of masked (−∞) cells are
painted by one item, and only for the cells on screen.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QPointF, QRectF, QSize, Qt, Signal
from PySide6.QtGui import (
    QBrush,
    QColor,
    QCursor,
    QFont,
    QFontMetrics,
    QImage,
    QLinearGradient,
    QPainter,
    QPaintEvent,
    QPen,
    QResizeEvent,
)
from PySide6.QtWidgets import QGraphicsLineItem, QStyleOptionGraphicsItem, QToolTip, QWidget

from attnviz.core.figures import colors
from attnviz.core.figures.figure import HeatmapSpec, colorbar_ticks, tick_label

pg.setConfigOptions(
    imageAxisOrder="row-major", background="w", foreground="#222222", antialias=False
)

MIN_TEXT_CELL = (26.0, 15.0)  # device pixels a cell needs before its value is printed
MIN_HATCH_CELL = 5.0  # below this, masked cells are plain grey
SQUARE_UP_TO = 32  # rows or columns; larger non-square matrices fill their view


def image_over(words: np.ndarray, fmt: QImage.Format) -> QImage:
    """A QImage over the memory of a (rows, cols) uint32 array (not a copy: keep the
    array alive, and the image shows changes made to it in place)."""
    rows, cols = words.shape
    return QImage(words.data, cols, rows, 4 * cols, fmt)


class CellOverlay(pg.GraphicsObject):
    """Hatches masked cells and prints each value while cells are large enough to read."""

    def __init__(self) -> None:
        super().__init__()
        self.values = np.zeros((0, 0))
        self.hatched = np.zeros((0, 0), dtype=bool)
        self.leaked: np.ndarray | None = None
        self.kind, self.levels = "diverging", (-1.0, 1.0)
        self.font = QFont()
        self.font.setPointSizeF(8.5)
        self.hatch = QBrush(QColor(colors.MASKED_HATCH), Qt.BrushStyle.BDiagPattern)
        self.shade: QImage | None = None  # masked cells shaded, for cells too small to hatch
        self._shade_pixels = np.zeros((0, 0), dtype=np.uint32)
        self.dark_pen, self.light_pen = QPen(QColor("#000000")), QPen(QColor("#ffffff"))
        self.leak_pen = QPen(QColor(colors.LEAK), 2.5)
        self.leak_pen.setCosmetic(True)
        self.setFlag(self.GraphicsItemFlag.ItemUsesExtendedStyleOption)  # for exposedRect

    def set_data(self, spec: HeatmapSpec) -> None:
        if spec.values.shape != self.values.shape:
            self.prepareGeometryChange()
        self.values, self.kind, self.levels = spec.values, spec.kind, spec.levels
        hatched, self.leaked = spec.hatched(), spec.leaked
        self.update()
        if hatched.shape == self.hatched.shape and not (hatched != self.hatched).any():
            return  # the same cells masked: the same shade
        self.hatched, self.shade = hatched, None
        if self.hatched.any():
            # Premultiplied ARGB: the hatch grey at 43% over the cell's colour.
            self._shade_pixels = np.where(self.hatched, np.uint32(0x6E3C3C3C), np.uint32(0))
            self.shade = image_over(self._shade_pixels, QImage.Format.Format_ARGB32_Premultiplied)

    def boundingRect(self) -> QRectF:
        rows, cols = self.values.shape
        return QRectF(0, 0, cols, rows)

    def paint(
        self, painter: QPainter, option: QStyleOptionGraphicsItem, widget: QWidget | None = None
    ) -> None:
        rows, cols = self.values.shape
        if not rows:
            return
        visible = option.exposedRect.intersected(self.boundingRect())  # type: ignore[attr-defined]
        r0, r1 = max(0, int(visible.top())), min(rows, math.ceil(visible.bottom()))
        c0, c1 = max(0, int(visible.left())), min(cols, math.ceil(visible.right()))
        block = self.values[r0:r1, c0:c1]
        to_device = painter.worldTransform()  # not deviceTransform: grab() adds an offset
        cell_w, cell_h = abs(to_device.m11()), abs(to_device.m22())
        # Masked cells: hatched over their colour (−∞ is grey), or shaded where cells are too
        # small for hatching to show; one run per row.
        if min(cell_w, cell_h) < MIN_HATCH_CELL:
            if self.shade is not None:  # too small for hatching: shaded, in one image
                painter.drawImage(QRectF(0, 0, cols, rows), self.shade)
            return
        for i, row in enumerate(self.hatched[r0:r1, c0:c1]):
            edges = np.flatnonzero(np.diff(np.concatenate(([0], row.view(np.int8), [0]))))
            for start, stop in zip(edges[::2], edges[1::2], strict=True):
                painter.fillRect(QRectF(c0 + start, r0 + i, stop - start, 1), self.hatch)
        if self.leaked is not None:
            painter.setPen(self.leak_pen)
            painter.setBrush(Qt.BrushStyle.NoBrush)
            inset = 2.0 / min(cell_w, cell_h)  # two pixels, in cells
            size = 1 - 2 * inset
            for i, j in np.argwhere(self.leaked[r0:r1, c0:c1]):
                painter.drawRect(QRectF(c0 + j + inset, r0 + i + inset, size, size))
        if cell_w < MIN_TEXT_CELL[0] or cell_h < MIN_TEXT_CELL[1]:
            return
        painter.save()
        painter.resetTransform()
        font = QFont(self.font)
        font.setPixelSize(max(9, min(14, int(min(cell_h * 0.45, cell_w * 0.24)))))
        painter.setFont(font)
        dark = colors.dark_text(colors.rgb(block, self.kind, self.levels)) | ~np.isfinite(block)
        sx, sy, ox, oy = to_device.m11(), to_device.m22(), to_device.dx(), to_device.dy()
        align = Qt.AlignmentFlag.AlignCenter
        for use_dark, pen in ((True, self.dark_pen), (False, self.light_pen)):
            painter.setPen(pen)
            for i, j in np.argwhere(dark == use_dark):
                x, y = ox + sx * (c0 + j), oy + sy * (r0 + i)
                rect = QRectF(x, y, sx, sy).normalized()
                painter.drawText(rect, align, colors.cell_text(float(block[i, j])))
        painter.restore()


class CellImage(pg.GraphicsObject):
    """The cells' colours, one pixel per cell, drawn unsmoothed: a QImage in Format_RGB32
    over an array of 0xffRRGGBB words (pyqtgraph's ImageItem makes an RGBA8888 image,
    which Qt converts on every paint)."""

    def __init__(self) -> None:
        super().__init__()
        self.pixels = np.zeros((0, 0), dtype=np.uint32)
        self._image: QImage | None = None

    def set_pixels(self, pixels: np.ndarray) -> None:
        """Show these words (kept, not copied: call again after changing them)."""
        if pixels.shape != self.pixels.shape:
            self.prepareGeometryChange()
        self.pixels = pixels
        self._image = image_over(pixels, QImage.Format.Format_RGB32) if pixels.size else None
        self.update()

    def boundingRect(self) -> QRectF:
        rows, cols = self.pixels.shape
        return QRectF(0, 0, cols, rows)

    def paint(
        self, painter: QPainter, option: QStyleOptionGraphicsItem, widget: QWidget | None = None
    ) -> None:
        if self._image is not None:
            painter.setRenderHint(QPainter.RenderHint.SmoothPixmapTransform, False)
            painter.drawImage(self.boundingRect(), self._image)


class ColorBar(pg.GraphicsWidget):
    """A vertical colour bar with low, middle and high ticks, painted in one go.

    Lighter than pyqtgraph's ColorBarItem (a whole PlotItem with menus), which made
    every heatmap slow to build.
    """

    WIDTH, TEXT = 12.0, 36.0

    def __init__(self) -> None:
        super().__init__()
        self.setCacheMode(self.CacheMode.DeviceCoordinateCache)  # repainted on new levels only
        self.kind, self.ticks = "diverging", [(0.0, "0")]
        self.levels = (-1.0, 1.0)
        self.setFixedWidth(self.WIDTH + self.TEXT + 8)
        self.font = QFont()
        self.font.setPixelSize(11)

    def set_scale(
        self, kind: str, levels: tuple[float, float], ticks: list[tuple[float, str]]
    ) -> None:
        self.kind, self.levels, self.ticks = kind, levels, ticks
        self.update()

    def paint(
        self, painter: QPainter, option: QStyleOptionGraphicsItem, widget: QWidget | None = None
    ) -> None:
        rect = self.boundingRect().adjusted(4, 10, 0, -10)
        bar = QRectF(rect.left(), rect.top(), self.WIDTH, rect.height())
        gradient = QLinearGradient(bar.bottomLeft(), bar.topLeft())
        table = colors.stops(self.kind)
        for k, (r, g, b) in enumerate(table):
            gradient.setColorAt(k / (len(table) - 1), QColor(int(r), int(g), int(b)))
        painter.fillRect(bar, QBrush(gradient))
        painter.setPen(QPen(QColor("#666666")))
        painter.drawRect(bar)
        painter.setFont(self.font)
        lo, hi = self.levels
        for value, text in self.ticks:
            y = bar.bottom() - (value - lo) / (hi - lo) * bar.height()
            painter.drawLine(QPointF(bar.right(), y), QPointF(bar.right() + 4, y))
            painter.drawText(
                QRectF(bar.right() + 6, y - 8, self.TEXT, 16), Qt.AlignmentFlag.AlignVCenter, text
            )


@dataclass(frozen=True, eq=False)
class RowBars:
    """One column of per-row bars beside a heatmap: lengths value / limit, one colour per row."""

    title: str
    values: np.ndarray
    limit: float
    colors: tuple[str, ...]
    texts: tuple[str, ...]


class RowStrip(pg.GraphicsWidget):
    """Bars beside a heatmap's rows (e.g. the weight each row leaks), aligned with its cells."""

    COLUMN = 40.0

    def __init__(self, vb: pg.ViewBox) -> None:
        super().__init__()
        self.vb = vb
        self.columns: list[RowBars] = []
        self.font = QFont()
        self.font.setPixelSize(11)
        self.set_columns([])
        vb.sigTransformChanged.connect(lambda *_: self.update())
        vb.sigResized.connect(lambda *_: self.update())

    def set_columns(self, columns: list[RowBars]) -> None:
        self.columns = columns
        self.setFixedWidth(self.COLUMN * len(columns) + (6 if columns else 0))
        self.update()

    def paint(
        self, painter: QPainter, option: QStyleOptionGraphicsItem, widget: QWidget | None = None
    ) -> None:
        if not self.columns:
            return
        rows = len(self.columns[0].values)
        top = self.mapFromScene(self.vb.mapViewToScene(QPointF(0, 0))).y()
        bottom = self.mapFromScene(self.vb.mapViewToScene(QPointF(0, rows))).y()
        shown = self.mapRectFromScene(self.vb.sceneBoundingRect())
        step = (bottom - top) / max(rows, 1)
        first = max(0, math.floor((shown.top() - top) / step))
        last = min(rows, math.ceil((shown.bottom() - top) / step))
        painter.setFont(self.font)
        painter.setClipRect(QRectF(0, shown.top() - 18, self.width(), shown.height() + 18))
        pad = min(2.0, step * 0.15)
        for c, column in enumerate(self.columns):
            x = 4 + c * self.COLUMN
            width = self.COLUMN - 8
            painter.setPen(QPen(QColor("#222222")))
            painter.drawText(
                QRectF(x, shown.top() - 17, width + 4, 15), Qt.AlignmentFlag.AlignLeft, column.title
            )
            painter.setPen(Qt.PenStyle.NoPen)
            fractions = np.clip(np.abs(column.values) / (column.limit or 1.0), 0, 1)
            for i in range(first, last):
                y = top + i * step
                painter.fillRect(QRectF(x, y + pad, width, step - 2 * pad), QColor("#eeeeee"))
                length = width * float(fractions[i])
                bar = QColor(column.colors[i])
                bar.setAlpha(150)  # light enough for black text on any bar
                painter.fillRect(QRectF(x, y + pad, length, step - 2 * pad), bar)
            if step >= 13:
                painter.setPen(QPen(QColor("#000000")))
                for i in range(first, last):
                    painter.drawText(
                        QRectF(x + 2, top + i * step, width, step),
                        Qt.AlignmentFlag.AlignVCenter | Qt.AlignmentFlag.AlignLeft,
                        column.texts[i],
                    )


class LabelAxis(pg.AxisItem):
    """Token (or feature) labels at cell centres, thinned so that they never overlap."""

    def __init__(self, orientation: str):
        super().__init__(orientation)
        self.labels: tuple[str, ...] = ()

    def set_labels(self, labels: tuple[str, ...]) -> None:
        self.labels = labels
        self.picture = None  # pyqtgraph's cached drawing
        self.update()

    def tickValues(
        self, minVal: float, maxVal: float, size: float
    ) -> list[tuple[float, list[float]]]:
        count = len(self.labels)
        minVal, maxVal = sorted((minVal, maxVal))  # the row axis runs downwards
        if not count or size <= 0 or maxVal <= minVal:
            return []
        pixels_per_cell = size / (maxVal - minVal)
        metrics = QFontMetrics(self.style["tickFont"] or QFont())
        if self.orientation in ("top", "bottom"):
            needed = max(metrics.horizontalAdvance(label) for label in self.labels) + 6
        else:
            needed = metrics.height() + 1
        step = max(1, math.ceil(needed / pixels_per_cell))
        first = max(0, math.floor(minVal)) // step * step
        last = min(count, math.ceil(maxVal))
        return [(float(step), [i + 0.5 for i in range(first, last, step)])]

    def tickStrings(self, values: list[float], scale: float, spacing: float) -> list[str]:
        return [self.labels[int(v)] if 0 <= int(v) < len(self.labels) else "" for v in values]


def _overhanging_min(label: pg.LabelItem) -> None:
    """pyqtgraph's LabelItem.updateMin, less the minimum width."""
    bounds = label.itemRect()
    label.setMinimumWidth(0)
    label.setMinimumHeight(bounds.height())
    label._sizeHint = {
        Qt.SizeHint.MinimumSize: (0, bounds.height()),
        Qt.SizeHint.PreferredSize: (bounds.width(), bounds.height()),
        Qt.SizeHint.MaximumSize: (-1, -1),
        Qt.SizeHint.MinimumDescent: (0, 0),
    }
    label.updateGeometry()


SAMPLED_ROWS = 16  # every so many rows compared first, for a matrix at least 4 × taller


def changed_cells(old: np.ndarray, new: np.ndarray) -> np.ndarray | None:
    """Where new differs from old, of the same shape (NaN never equals itself); None when
    a sample of the rows shows nearly every cell changed (after a weight edit, say): not
    worth comparing in full, everything is recoloured."""
    if old is new:
        return np.zeros(new.shape, dtype=bool)
    if len(new) >= 4 * SAMPLED_ROWS:
        sample = old[::SAMPLED_ROWS] != new[::SAMPLED_ROWS]
        if 4 * np.count_nonzero(sample) > 3 * sample.size:
            return None
    return old != new  # type: ignore[no-any-return]


class HeatmapView(pg.GraphicsLayoutWidget):
    """One matrix as a heatmap with token labels, a colour bar, a tooltip and click-to-select."""

    cellClicked = Signal(str, int, int)  # view name, row, col
    painted = Signal(str)  # view name, after each paint

    def __init__(self, name: str, parent: QWidget | None = None, colorbar: bool = True):
        super().__init__(parent)
        self.name = name
        self.spec: HeatmapSpec | None = None
        self.selected: tuple[int, int] | None = None
        self.rows_axis, self.cols_axis = LabelAxis("left"), LabelAxis("top")
        self.plot = self.addPlot(axisItems={"left": self.rows_axis, "top": self.cols_axis})
        self.plot.invertY(True)
        self.plot.hideButtons()
        self.plot.setMenuEnabled(False)
        self.plot.showAxis("top")
        self.plot.hideAxis("bottom")
        for side in ("top", "left"):
            axis = self.plot.getAxis(side)
            axis.setStyle(tickLength=0)
            axis.setPen(pg.mkPen(None))  # labels only: a line would run past square cells
            axis.setTextPen(pg.mkPen("#222222"))
            # Token labels rarely change: repaint them from a pixmap, not glyph by glyph.
            axis.setCacheMode(axis.CacheMode.DeviceCoordinateCache)
        title = self.plot.titleLabel
        title.setCacheMode(title.CacheMode.DeviceCoordinateCache)
        # A title wider than the matrix may overhang it; it must not squeeze the colour bar.
        title.updateMin = lambda: _overhanging_min(title)

        self.image = CellImage()
        self.plot.addItem(self.image)
        self.overlay = CellOverlay()
        self.plot.addItem(self.overlay)
        self.marker = pg.QtWidgets.QGraphicsRectItem(0, 0, 1, 1)
        self.marker.setPen(pg.mkPen("#ff7f00", width=3, cosmetic=True))
        self.marker.setVisible(False)
        self.plot.addItem(self.marker)
        self.strip = RowStrip(self.plot.vb)
        self.addItem(self.strip)
        self.bar = ColorBar()
        if colorbar:  # off where a neighbour's bar shows the same scale
            self.addItem(self.bar)
        self.column_mark = pg.QtWidgets.QGraphicsRectItem(0, 0, 1, 1)
        probe_pen = pg.mkPen(colors.PROBE, width=3, cosmetic=True, style=Qt.PenStyle.DashLine)
        self.column_mark.setPen(probe_pen)
        self.column_mark.setVisible(False)
        self.plot.addItem(self.column_mark)
        self._bar_key: tuple[object, ...] = ()
        self._block_lines: list[QGraphicsLineItem] = []
        self._labels: tuple[object, ...] = ()
        self._titles: tuple[bool, ...] = (True, True)  # rows, columns
        self._fill = (1.0, 1.0)  # how much of each axis the matrix fills
        self.square_cells = False  # set by panels that want them
        self.plot.vb.sigResized.connect(self._resized)
        self.scene().sigMouseMoved.connect(self._hover)
        self.scene().sigMouseClicked.connect(self._click)
        self.setMinimumSize(150, 120)

    def set_spec(self, spec: HeatmapSpec) -> bool:
        """Redraw from a new spec (the values, labels and levels of one matrix); nothing is
        redrawn when it looks exactly like the last one. Returns whether it will repaint."""
        before = self.spec
        reshaped = before is None or before.values.shape != spec.values.shape
        changed = None  # where the values differ from those drawn (compared once)
        if before is not None and not reshaped:
            changed = changed_cells(before.values, spec.values)
            if changed is not None and not changed.any() and before.looks_like(spec):
                self.spec = spec
                return False
        self.spec = spec
        lo, hi = spec.levels
        # Coloured here with the exported figures' map: masked cells come out grey. The
        # pixels go into the image's own array; when the colour scale stayed, only the
        # rows and columns whose values changed.
        pixels = self.image.pixels
        if reshaped:
            pixels = np.empty(spec.values.shape, dtype=np.uint32)
        partly = (
            changed is not None
            and before is not None
            and (before.kind, before.levels) == (spec.kind, spec.levels)
            and self._recolour_changes(changed, spec, pixels)
        )
        if not partly:
            colors.argb(spec.values, spec.kind, spec.levels, out=pixels)
        self.image.set_pixels(pixels)
        if self._bar_key != (spec.kind, lo, hi):
            self._bar_key = (spec.kind, lo, hi)
            ticks = [(t, tick_label(t)) for t in colorbar_ticks(spec)]
            self.bar.set_scale(spec.kind, (lo, hi), ticks)
        self.overlay.set_data(spec)
        if self.plot.titleLabel.text != spec.caption:
            self.plot.setTitle(spec.caption, size="10pt")
        labels = (spec.row_labels, spec.col_labels, spec.row_title, spec.col_title)
        if labels != self._labels:
            self._labels = labels
            self._set_ticks()
        if reshaped:
            self.fit()
            if self.selected and not self._inside(*self.selected):
                self.select(None)
        return True

    @staticmethod
    def _recolour_changes(changed: np.ndarray, spec: HeatmapSpec, pixels: np.ndarray) -> bool:
        """Recolour only the rows and columns holding the changed cells (an edited token's
        row and column of the scores, the rows of the weights below it); False when that
        would be most of the matrix."""
        height, width = changed.shape
        counts = changed.view(np.uint8)
        row_count = counts.sum(axis=1, dtype=np.int32)
        col_count = counts.sum(axis=0, dtype=np.int32)
        # Whole rows (or columns) where most cells changed, then the columns (rows) of the
        # changes outside them: whichever order covers fewer cells.
        many_rows = np.flatnonzero(row_count > width // 2)
        many_cols = np.flatnonzero(col_count > height // 2)
        by_rows = (many_rows, np.flatnonzero(col_count > changed[many_rows].sum(axis=0)))
        by_cols = (np.flatnonzero(row_count > changed[:, many_cols].sum(axis=1)), many_cols)
        rows, cols = min(by_rows, by_cols, key=lambda rc: len(rc[0]) * width + len(rc[1]) * height)
        if len(rows) * width + len(cols) * height > height * width * 3 // 4:
            return False
        values, kind, levels = spec.values, spec.kind, spec.levels
        if len(rows) and rows[-1] - rows[0] + 1 == len(rows):  # one run: no copies
            span = slice(rows[0], rows[-1] + 1)
            colors.argb(values[span], kind, levels, out=pixels[span])
        elif len(rows):
            pixels[rows] = colors.argb(values[rows], kind, levels)
        if len(cols):
            pixels[:, cols] = colors.argb(values[:, cols], kind, levels)
        return True

    def fit(self) -> None:
        """Show the whole matrix (the user may zoom in; a double click comes back here).

        With square cells the matrix sits in the top-left corner, next to its labels.
        """
        if self.spec is None:
            return
        rows, cols = self.spec.values.shape
        vb = self.plot.vb
        width, height = vb.width(), vb.height()
        self._fill = (1.0, 1.0)
        if self._square() and width > 0 and height > 0:
            cell = min(width / cols, height / rows)
            self._fill = (rows * cell / height, cols * cell / width)
            rows, cols = height / cell, width / cell  # what the box shows around the matrix
        # Limits first: the old limits would clamp the new range (a grown matrix shown cut).
        vb.setLimits(xMin=0, xMax=cols, yMin=0, yMax=rows)
        vb.setRange(xRange=(0, cols), yRange=(0, rows), padding=0)
        self._show_axis_titles()

    def _resized(self, _: object) -> None:
        if self._square():
            self.fit()

    def _square(self) -> bool:
        """Square cells, when asked for, for matrices small enough to read cell by cell."""
        rows, cols = self.spec.values.shape if self.spec is not None else (0, 0)
        return self.square_cells and (rows == cols or max(rows, cols) <= SQUARE_UP_TO)

    def set_row_bars(self, columns: list[RowBars]) -> None:
        """Per-row bars beside the matrix (none by default)."""
        self.strip.set_columns(columns)

    def mark_column(self, col: int | None) -> None:
        """Outline a whole column, dashed (the key a probe nudged), or none."""
        self.column_mark.setVisible(col is not None and self.spec is not None)
        if col is not None and self.spec is not None:
            self.column_mark.setRect(col, 0, 1, self.spec.values.shape[0])

    def resizeEvent(self, event: QResizeEvent | None) -> None:
        if hasattr(self, "_titles"):  # once built
            self._show_axis_titles()
        super().resizeEvent(event)

    def sizeHint(self) -> QSize:
        return QSize(240, 200)  # pyqtgraph asks for 480 high, which makes panels scroll

    def mark_column_blocks(self, width: int) -> None:
        """Draw a line every width columns (the head blocks of concat)."""
        for line in self._block_lines:
            self.plot.removeItem(line)
        self._block_lines = []
        rows, cols = self.spec.values.shape if self.spec is not None else (0, 0)
        pen = pg.mkPen("#222222", width=2, cosmetic=True)
        for x in range(width, cols, width):
            line = QGraphicsLineItem(x, 0, x, rows)  # the matrix's height only
            line.setPen(pen)
            self.plot.addItem(line)
            self._block_lines.append(line)

    def paintEvent(self, event: QPaintEvent) -> None:
        super().paintEvent(event)
        self.painted.emit(self.name)

    def _set_ticks(self) -> None:
        assert self.spec is not None
        self.rows_axis.set_labels(self.spec.row_labels)
        self.cols_axis.set_labels(self.spec.col_labels)
        for axis, title, on in zip(
            (self.rows_axis, self.cols_axis),
            (self.spec.row_title, self.spec.col_title),
            self._titles,
            strict=True,
        ):
            axis.setLabel(title)
            axis.showLabel(on)

    def _show_axis_titles(self) -> None:
        """Axis titles (query, key, …) only where there is room and the matrix fills its axis.

        Small views give the room to their cells; a square-celled matrix that leaves much of
        an axis empty would have its title float beside nothing. (Hysteresis, because
        hiding a title resizes the cells.)
        """
        roomy = self.height() >= 220 and self.width() >= 240
        titles: tuple[bool, ...] = tuple(
            roomy and (fill > 0.8 or (shown and fill > 0.6))
            for fill, shown in zip(self._fill, self._titles, strict=True)
        )
        if titles != self._titles:
            self._titles = titles
            for axis, on in zip((self.rows_axis, self.cols_axis), titles, strict=True):
                axis.showLabel(on)

    def _inside(self, row: int, col: int) -> bool:
        return (
            self.spec is not None
            and 0 <= row < self.spec.values.shape[0]
            and 0 <= col < self.spec.values.shape[1]
        )

    def _cell_at(self, scene_pos: QPointF) -> tuple[int, int] | None:
        if not self.plot.sceneBoundingRect().contains(scene_pos):
            return None
        p = self.plot.vb.mapSceneToView(scene_pos)
        row, col = math.floor(p.y()), math.floor(p.x())
        return (row, col) if self._inside(row, col) else None

    def describe(self, row: int, col: int) -> str:
        """The tooltip text: which cell and its exact value."""
        assert self.spec is not None
        v = float(self.spec.values[row, col])
        value = "−∞ (masked)" if v == -math.inf else repr(v)
        s = self.spec
        where = f"{s.row_title} {s.row_labels[row]} · {s.col_title} {s.col_labels[col]}"
        return f"{s.title}\n{where}\n{value}"

    def _hover(self, scene_pos: QPointF) -> None:
        cell = self._cell_at(scene_pos)
        if cell is None:
            QToolTip.hideText()
            return
        QToolTip.showText(QCursor.pos(), self.describe(*cell), self)

    def _click(self, event: object) -> None:
        button = event.button()  # type: ignore[attr-defined]
        if button != Qt.MouseButton.LeftButton:
            return
        if event.double():  # type: ignore[attr-defined]
            self.fit()
            return
        cell = self._cell_at(event.scenePos())  # type: ignore[attr-defined]
        if cell is not None:
            self.select(cell)
            self.cellClicked.emit(self.name, *cell)

    def select(self, cell: tuple[int, int] | None) -> None:
        """Outline one cell (or none)."""
        self.selected = cell
        self.marker.setVisible(cell is not None)
        if cell is not None:
            self.marker.setRect(cell[1], cell[0], 1, 1)
