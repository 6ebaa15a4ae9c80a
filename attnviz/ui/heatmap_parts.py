"""What a heatmap view paints, piece by piece: the cells' image, the masked cells'
marks, the colour bar, the bars beside the rows; and which cells an edit changed.

Each piece paints with a QPainter it is given, in cell units (x: columns, y: rows) for
the cells and in widget pixels for the rest; the view decides where.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from itertools import groupby

import numpy as np
from PySide6.QtCore import QPointF, QRectF, QSize, Qt
from PySide6.QtGui import (
    QBrush,
    QColor,
    QFont,
    QImage,
    QLinearGradient,
    QPainter,
    QPen,
    QPixmap,
)

from attnviz.core.figures import colors
from attnviz.core.figures.edits import Lines
from attnviz.core.figures.figure import HeatmapSpec

MIN_HATCH_CELL = 5.0  # pixels; below this, masked cells are shaded, not hatched
SHADE = np.uint32(0x6E3C3C3C)  # premultiplied ARGB: the hatch grey at 43 % over a cell


def image_over(words: np.ndarray, fmt: QImage.Format) -> QImage:
    """A QImage over the memory of a (rows, cols) uint32 array (not a copy: keep the
    array alive, and the image shows changes made to it in place)."""
    rows, cols = words.shape
    return QImage(words.data, cols, rows, 4 * cols, fmt)


@dataclass(frozen=True, eq=False)
class Samples:
    """Along one axis, where cells are smaller than pixels: the device pixels first..last
    (exclusive) that show cells, and for each the cell under its middle."""

    cells: np.ndarray
    first: int
    last: int
    key: tuple[float, ...]  # what they were found from


def samples(count: int, origin: float, cell: float, low: float, high: float) -> Samples | None:
    """The samples of one axis of count cells, cell device pixels each, cell 0 starting at
    origin, the screen showing low..high (device pixels); None while a cell is a pixel or
    more (the image then holds every cell)."""
    if cell >= 1.0:
        return None
    a, b = max(low, origin), min(high, origin + count * cell)
    first, last = math.ceil(a - 0.5), math.ceil(b - 0.5)  # pixels whose middle shows cells
    middles = np.arange(first, max(first, last)) + 0.5
    cells = np.clip(np.floor((middles - origin) / cell).astype(np.intp), 0, count - 1)
    return Samples(cells, first, max(first, last), (count, origin, cell, low, high))


def _taken(values: np.ndarray, rows: np.ndarray | None, cols: np.ndarray | None) -> np.ndarray:
    """values at these rows and columns (None: all of them)."""
    if rows is not None:
        values = values.take(rows, axis=0)
    return values if cols is None else values.take(cols, axis=1)  # (quicker than np.ix_)


def _at(sampled: np.ndarray | None, lines: np.ndarray) -> np.ndarray:
    """Where the given rows (or columns) of the matrix (non-negative indices) are in the
    image, whose rows (or columns) show the matrix's ``sampled`` ones (None: all)."""
    if sampled is None:
        return lines
    if not len(lines) or not len(sampled):
        return np.empty(0, dtype=np.intp)
    # A lookup table of the lines (np.isin sorts: 0.15 ms a call, this a few µs).
    member = np.zeros(max(int(sampled.max()), int(lines.max())) + 1, dtype=bool)
    member[lines] = True
    return np.flatnonzero(member[sampled])


class CellImage:
    """The cells' colours as a QImage in Format_RGB32 over an array of 0xffRRGGBB words
    (the format Qt draws fastest): one pixel per cell, or, along an axis where cells are
    smaller than pixels, one per device pixel (the cell under its middle): a 2048-token
    matrix in a 300-pixel view is coloured at 300, not 2048."""

    def __init__(self) -> None:
        self.pixels = np.zeros((0, 0), dtype=np.uint32)
        self.image: QImage | None = None
        self.rows: np.ndarray | None = None  # the cells the pixels hold (None: every one)
        self.cols: np.ndarray | None = None
        self.key: tuple[object, ...] = ()  # the sampling they were coloured for

    @staticmethod
    def key_of(spec: HeatmapSpec, rows: Samples | None, cols: Samples | None) -> tuple[object, ...]:
        """What the image holds: the matrix's shape and the samples along each axis."""
        return (spec.values.shape, *(() if a is None else a.key for a in (rows, cols)))

    def colour(
        self,
        spec: HeatmapSpec,
        rows: Samples | None,
        cols: Samples | None,
        changed: Lines | None = None,
    ) -> None:
        """Colour the image of spec for this sampling: only the changed rows and columns
        of the matrix, when given and the image holds the same cells; all of it else."""
        r = None if rows is None else rows.cells
        c = None if cols is None else cols.cells
        key = self.key_of(spec, rows, cols)
        values, kind, levels = spec.values, spec.kind, spec.levels
        if changed is not None and key == self.key:
            at_rows, at_cols = _at(r, changed[0]), _at(c, changed[1])
            if (
                r is None
                and c is None
                and len(at_rows)
                and at_rows[-1] - at_rows[0] + 1 == len(at_rows)
            ):  # one run of whole rows: coloured in place, no copies
                span = slice(at_rows[0], at_rows[-1] + 1)
                colors.argb(values[span], kind, levels, out=self.pixels[span])
            elif len(at_rows):
                src = at_rows if r is None else r[at_rows]
                self.pixels[at_rows] = colors.argb(_taken(values, src, c), kind, levels)
            if len(at_cols):
                src = at_cols if c is None else c[at_cols]
                self.pixels[:, at_cols] = colors.argb(_taken(values, r, src), kind, levels)
            return
        shape = (values.shape[0] if r is None else len(r), values.shape[1] if c is None else len(c))
        if self.pixels.shape != shape:
            self.pixels = np.empty(shape, dtype=np.uint32)
            self.image = (
                image_over(self.pixels, QImage.Format.Format_RGB32) if self.pixels.size else None
            )
        colors.argb(_taken(values, r, c), kind, levels, out=self.pixels)
        self.rows, self.cols, self.key = r, c, key


class CellMarks:
    """Masked cells hatched over their colour (shaded where cells are too small for
    hatching to show), and leaked weight outlined."""

    def __init__(self) -> None:
        self.hatched = np.zeros((0, 0), dtype=bool)
        self.leaked: np.ndarray | None = None
        self.hatch = QBrush(QColor(colors.MASKED_HATCH), Qt.BrushStyle.BDiagPattern)
        self.leak_pen = QPen(QColor(colors.LEAK), 2.5)
        self.leak_pen.setCosmetic(True)
        self._masked: np.ndarray | None = None
        self._just_masked = False  # whether exactly the cells of _masked are hatched
        self._seen = np.zeros((0, 0), dtype=bool)  # scratch: finite or masked, per cell
        self._shade_pixels = np.zeros((0, 0), dtype=np.uint32)
        self.shade: QImage | None = None
        self._version = 0  # counts changes to the shade
        self._sampled = np.zeros((0, 0), dtype=np.uint32)
        self._sampled_shade: QImage | None = None
        self._sampled_key: tuple[object, ...] = ()

    def set_data(self, spec: HeatmapSpec, changed: Lines | None = None) -> None:
        """Marks for spec; changed: the only rows and columns whose values moved, if known."""
        self.leaked = spec.leaked
        if (
            changed is not None
            and spec.masked is self._masked
            and self.hatched.shape == spec.values.shape
        ):
            rows, cols = changed
            for index in ((rows,), (slice(None), cols)):
                hatched = spec.hatched(index)
                if (hatched != self.hatched[index]).any():
                    self.hatched[index] = hatched
                    if self.shade is None:
                        self._new_shade()
                    self._shade_pixels[index] = np.where(hatched, SHADE, np.uint32(0))
                    self._version += 1
                    self._just_masked = False  # (may be again: the long way finds out)
            return
        # Every value the mask leaves finite and the same mask as the cells hatched now:
        # the same cells hatched. (Two plain passes, when the spec does not know; a masked
        # sum takes twice as long.)
        finite = spec.finite
        if not finite:
            if self._seen.shape != spec.values.shape:
                self._seen = np.empty(spec.values.shape, dtype=bool)
            np.isfinite(spec.values, out=self._seen)
            if spec.masked is not None:
                np.logical_or(self._seen, spec.masked, out=self._seen)
            finite = bool(self._seen.all())
        if (
            finite
            and self._just_masked
            and spec.masked is self._masked
            and self.hatched.shape == spec.values.shape
        ):
            return
        self._masked, self._just_masked = spec.masked, finite
        hatched = spec.hatched()
        if hatched.shape == self.hatched.shape and not (hatched != self.hatched).any():
            return  # the same cells masked: the same shade
        self.hatched, self.shade = hatched, None
        if hatched.any():
            self._new_shade()

    def _new_shade(self) -> None:
        self._version += 1
        self._shade_pixels = np.where(self.hatched, SHADE, np.uint32(0))
        self.shade = image_over(self._shade_pixels, QImage.Format.Format_ARGB32_Premultiplied)

    def shade_of(self, image: CellImage) -> QImage | None:
        """The shade of the cells the image holds, pixel for pixel (None: nothing masked)."""
        if self.shade is None or (image.rows is None and image.cols is None):
            return self.shade
        key = (self._version, image.key)
        if key != self._sampled_key:
            self._sampled = _taken(self._shade_pixels, image.rows, image.cols)
            self._sampled_shade = image_over(
                self._sampled, QImage.Format.Format_ARGB32_Premultiplied
            )
            self._sampled_key = key
        return self._sampled_shade

    @staticmethod
    def hatches(cell: float) -> bool:
        """Whether cells whose smaller side is cell pixels are hatched (else shaded)."""
        return cell >= MIN_HATCH_CELL

    def paint(self, painter: QPainter, shown: tuple[int, int, int, int], cell: float) -> None:
        """Hatching and leak outlines of rows r0:r1, columns c0:c1 (shown), in cell units,
        once a cell's smaller side (cell, pixels) is large enough for them."""
        r0, r1, c0, c1 = shown
        if not self.hatches(cell):
            return
        # One run of cells at a time (few cells are this large: plain Python is quickest).
        for i, row in enumerate(self.hatched[r0:r1, c0:c1].tolist(), start=r0):
            j = c0
            for on, run in groupby(row):
                width = sum(1 for _ in run)
                if on:
                    painter.fillRect(QRectF(j, i, width, 1), self.hatch)
                j += width
        if self.leaked is not None:
            painter.setPen(self.leak_pen)
            painter.setBrush(Qt.BrushStyle.NoBrush)
            inset = 2.0 / cell  # two pixels, in cells
            size = 1 - 2 * inset
            for i, j in np.argwhere(self.leaked[r0:r1, c0:c1]):
                painter.drawRect(QRectF(c0 + j + inset, r0 + i + inset, size, size))


class ColorBar:
    """A vertical colour bar with low, middle and high ticks."""

    WIDTH, TEXT = 12.0, 36.0
    ROOM = WIDTH + TEXT + 14  # pixels it takes beside the cells
    PAD = 8.0  # pixels the end ticks' labels stand out above and below the bar

    def __init__(self) -> None:
        self.kind, self.levels = "diverging", (-1.0, 1.0)
        self.ticks: list[tuple[float, str]] = [(0.0, "0")]
        self.font = QFont()
        self.font.setPixelSize(11)
        self._pixmap = QPixmap()
        self._key: tuple[object, ...] = ()

    def pixmap(self, height: float, ratio: float) -> QPixmap:
        """The bar and its ticks, ROOM wide and height + 2 PAD high, on a clear ground:
        drawn again only when the scale or the height changes, not on every edit."""
        key = (self.kind, self.levels, tuple(self.ticks), height, ratio)
        if key != self._key:
            size = QSize(math.ceil(self.ROOM * ratio), math.ceil((height + 2 * self.PAD) * ratio))
            self._pixmap = QPixmap(size)
            self._pixmap.setDevicePixelRatio(ratio)
            self._pixmap.fill(Qt.GlobalColor.transparent)
            painter = QPainter(self._pixmap)
            self.paint(painter, 0.0, self.PAD, height)
            painter.end()
            self._key = key
        return self._pixmap

    def set_scale(
        self, kind: str, levels: tuple[float, float], ticks: list[tuple[float, str]]
    ) -> None:
        self.kind, self.levels, self.ticks = kind, levels, ticks

    def paint(self, painter: QPainter, left: float, top: float, height: float) -> None:
        bar = QRectF(left + 10, top, self.WIDTH, height)
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
    texts: tuple[str, ...] | None = None  # None: each value as bar_text writes it (when
    # rows are tall enough to print them: not made for hundreds of rows that never are)

    def same_as(self, other: RowBars) -> bool:
        """Whether other draws exactly the same bars."""
        return (self.title, self.limit, self.colors, self.texts) == (
            other.title,
            other.limit,
            other.colors,
            other.texts,
        ) and (self.values is other.values or np.array_equal(self.values, other.values))


def bar_text(value: float) -> str:
    """A bar's value as printed on it: two decimals, or in powers of ten when smaller."""
    return f"{value:.2f}" if abs(value) >= 0.005 or value == 0 else f"{value:.0e}"


THIN_ROW = 1.0  # pixels: rows thinner than this get a bar per pixel row (the longest)


class RowStrip:
    """Bars beside a heatmap's rows (e.g. the weight each row leaks), aligned with its cells."""

    COLUMN = 40.0

    def __init__(self) -> None:
        self.columns: list[RowBars] = []
        self.font = QFont()
        self.font.setPixelSize(11)

    def width(self) -> float:
        return self.COLUMN * len(self.columns) + (6 if self.columns else 0)

    def paint(self, painter: QPainter, left: float, top: float, step: float, clip: QRectF) -> None:
        """Row i spans top + i·step to top + (i+1)·step; clip: the cells' area, whose
        height bounds the bars and whose top the titles sit above."""
        if not self.columns:
            return
        rows = len(self.columns[0].values)
        first = max(0, math.floor((clip.top() - top) / step))
        last = min(rows, math.ceil((clip.bottom() - top) / step))
        painter.save()
        painter.setFont(self.font)
        painter.setClipRect(QRectF(left, clip.top() - 18, self.width(), clip.height() + 18))
        pad = min(2.0, step * 0.15)
        for c, column in enumerate(self.columns):
            x = left + 4 + c * self.COLUMN
            width = self.COLUMN - 8
            painter.setPen(QPen(QColor("#222222")))
            painter.drawText(
                QRectF(x, clip.top() - 17, width + 4, 15), Qt.AlignmentFlag.AlignLeft, column.title
            )
            painter.setPen(Qt.PenStyle.NoPen)
            fractions = np.clip(np.abs(column.values) / (column.limit or 1.0), 0, 1)
            if step < THIN_ROW:  # a bar per pixel row: the longest of the rows in it
                drawn = _thin_bars(fractions, column.colors, first, last, top, step, width)
                if drawn is not None:
                    y, pixels = drawn
                    image = image_over(pixels, QImage.Format.Format_ARGB32_Premultiplied)
                    painter.drawImage(QRectF(x, y, width, len(pixels)), image)
                continue
            for i in range(first, last):
                y, height = top + i * step + pad, step - 2 * pad
                painter.fillRect(QRectF(x, y, width, height), QColor(TRACK))
                bar = QColor(column.colors[i])
                bar.setAlpha(BAR_ALPHA)
                painter.fillRect(QRectF(x, y, width * float(fractions[i]), height), bar)
            if step >= 13:
                painter.setPen(QPen(QColor("#000000")))
                for i in range(first, last):
                    painter.drawText(
                        QRectF(x + 2, top + i * step, width, step),
                        Qt.AlignmentFlag.AlignVCenter | Qt.AlignmentFlag.AlignLeft,
                        bar_text(column.values[i]) if column.texts is None else column.texts[i],
                    )
        painter.restore()


def _thin_bars(
    fractions: np.ndarray,
    row_colours: tuple[str, ...],
    first: int,
    last: int,
    top: float,
    step: float,
    width: float,
) -> tuple[float, np.ndarray] | None:
    """The bars of rows first to last, thinner than a pixel, as one image: each pixel row
    a row starts in (from the first one's, its y returned) shows the longest bar of the
    rows starting there (none hidden by a neighbour), in that row's colour, over the
    grey track; as 0xAARRGGBB words, width pixels wide (drawn at once: a pair of
    rectangles a pixel row took 4 ms a view at 512 rows)."""
    if last <= first:  # (zoomed onto the room beside the matrix: no row in sight)
        return None
    f = np.nan_to_num(fractions[first:last])  # (a NaN bar: none, as a NaN-wide rectangle)
    pixel = np.floor(top + np.arange(first, last) * step).astype(np.intp)
    starts = np.flatnonzero(np.r_[True, pixel[1:] != pixel[:-1]])
    longest = np.maximum.reduceat(f, starts)
    hits = np.flatnonzero(f == np.repeat(longest, np.diff(np.r_[starts, len(f)])))
    rows = first + hits[np.searchsorted(hits, starts)]  # the first longest of each
    colours = np.array([_bar_word(row_colours[i]) for i in rows], dtype=np.uint32)
    columns = max(1, round(width))
    lines = pixel[starts] - pixel[0]
    pixels = np.zeros((int(lines[-1]) + 1, columns), dtype=np.uint32)
    inside = np.arange(columns)[None, :] < (longest * columns)[:, None]
    pixels[lines] = np.where(inside, colours[:, None], _word(colors.hex_rgb(TRACK)))
    return float(pixel[0]), pixels


TRACK = "#eeeeee"  # behind each bar
BAR_ALPHA = 150  # of 255: light enough for black text on any bar


def _word(rgb: tuple[int, int, int]) -> int:
    """An opaque colour as a 0xffRRGGBB word."""
    r, g, b = rgb
    return 0xFF000000 | r << 16 | g << 8 | b


@functools.lru_cache(maxsize=64)
def _bar_word(colour: str) -> int:
    """A bar's colour ("#rrggbb") drawn at BAR_ALPHA over the track, as an opaque word."""
    a = BAR_ALPHA / 255
    over = zip(colors.hex_rgb(colour), colors.hex_rgb(TRACK), strict=True)
    r, g, b = (round(c * a + t * (1 - a)) for c, t in over)
    return _word((r, g, b))


def labelled(count: int, low: float, high: float, pixels_per_cell: float, needed: float) -> range:
    """The cells whose labels are shown when low to high (cell units) is on screen: every
    so many (the same ones wherever the view is panned), so that labels needing `needed`
    pixels never overlap, and only cells whose middle is on screen."""
    if not count or pixels_per_cell <= 0 or high <= low:
        return range(0)
    step = max(1, math.ceil(needed / pixels_per_cell))
    first = max(0, math.ceil(low - 0.5))
    first = -(-first // step) * step  # the next multiple of step
    return range(first, min(count, math.floor(high - 0.5) + 1), step)


SAMPLED_ROWS = 16  # every so many rows compared first, for a matrix at least 4 × taller


def changed_cells(old: np.ndarray, new: np.ndarray) -> np.ndarray | None:
    """Where new differs from old, of the same shape (NaN never equals itself); None when
    a sample of the rows shows that no few rows and columns hold the changes (after a
    weight edit, say: every cell, or every cell the mask leaves alone): everything is
    recoloured, without comparing in full."""
    if old is new:
        return np.zeros(new.shape, dtype=bool)
    if len(new) >= 4 * SAMPLED_ROWS and new.size:
        sample = old[::SAMPLED_ROWS] != new[::SAMPLED_ROWS]
        # Estimated as changed_lines does: the rows mostly changed, then the columns of
        # the changes in the others.
        rows = 2 * sample.sum(axis=1) > sample.shape[1]
        if rows.mean() + sample[~rows].any(axis=0).mean() > 0.75:
            return None
    return old != new  # type: ignore[no-any-return]


def changed_lines(changed: np.ndarray) -> Lines | None:
    """Rows and columns that hold every changed cell, covering few cells: the rows where
    most cells changed, then the columns of the changes outside them, or the other way
    round. None when that would be most of the matrix."""
    height, width = changed.shape
    counts = changed.view(np.uint8)
    row_count = counts.sum(axis=1, dtype=np.int32)
    if row_count.sum() > height * width // 2:
        return None
    col_count = counts.sum(axis=0, dtype=np.int32)
    many_rows = np.flatnonzero(row_count > width // 2)
    many_cols = np.flatnonzero(col_count > height // 2)
    by_rows = (many_rows, np.flatnonzero(col_count > counts[many_rows].sum(axis=0)))
    by_cols = (np.flatnonzero(row_count > counts[:, many_cols].sum(axis=1)), many_cols)
    rows, cols = min(by_rows, by_cols, key=lambda rc: len(rc[0]) * width + len(rc[1]) * height)
    if len(rows) * width + len(cols) * height > height * width * 3 // 4:
        return None
    return rows, cols
