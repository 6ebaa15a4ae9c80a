"""The spreadsheet view over a MatrixModel: keyboard, clipboard, fill and delete.

Copy writes the selected rectangle as tab-separated text; paste reads spreadsheet
ranges, CSV or NumPy's printed arrays. A single pasted value fills the whole selection.
Every paste, fill or delete is one undoable edit; one that does not fit, or text that is
not a finite number, is refused with a message and changes nothing. An edit that goes
through replaces the message (pastes, fills and deletes say what they did). Text larger
than the room below and right of the selection is refused before it is read; a long
paste is read off the UI thread, so the window never waits on it.

Columns are as wide as the widest number (and label) they show, so no number is cut
off; a grid too narrow for its columns scrolls. Grids stacked in a column (a weight grid
and its bias row) share their column and row-label widths, so their columns line up. A
column the user narrows by hand shows its numbers with fewer significant digits.
"""

from __future__ import annotations

import math

import numpy as np
from PySide6.QtCore import QEvent, QModelIndex, QPersistentModelIndex, QSize, Qt, Signal
from PySide6.QtGui import (
    QAction,
    QFontMetrics,
    QGuiApplication,
    QKeyEvent,
    QKeySequence,
)
from PySide6.QtWidgets import (
    QAbstractItemDelegate,
    QAbstractItemView,
    QHeaderView,
    QStyle,
    QStyledItemDelegate,
    QStyleOptionViewItem,
    QTableView,
    QWidget,
)

from attnviz.core.io.text import TableTooLarge, format_table, most_chars, parse_table
from attnviz.ui.background import Background
from attnviz.ui.matrix_model import MatrixModel

MIN_COLUMN = 32  # px: the least width of a column, so short numbers still read as a table
PAD = 4  # px: room between a number and its column's left edge
EXACT_CELLS = 20_000  # up to this many cells the widest number is found by writing them all
READ_NOW_CHARS = 50_000  # pastes up to this long are read at once (a few ms)

Index = QModelIndex | QPersistentModelIndex


def _read(text: str, room: tuple[int, int]) -> np.ndarray | ValueError:
    """parse_table on a worker: a refusal comes back as a value, to be worded like the rest."""
    try:
        return parse_table(text, room)
    except ValueError as e:
        return e


def number_texts(value: float) -> list[str]:
    """A number written with 4, 3, 2 then 1 significant digits, plain and as a power of 10."""
    texts = []
    for digits in (4, 3, 2, 1):
        mantissa, _, power = f"{value:.{digits - 1}e}".partition("e")
        if "." in mantissa:
            mantissa = mantissa.rstrip("0").rstrip(".")
        plain = f"{value:.{digits}g}"
        exponent = f"{mantissa}e{int(power)}"
        texts += [plain if "e" not in plain else exponent, exponent]
    return list(dict.fromkeys(texts))


def fit_number(value: float, room: int, metrics: QFontMetrics) -> str:
    """The most precise text of value that is at most room pixels wide (else the shortest)."""
    texts = number_texts(value)
    for text in texts:
        if metrics.horizontalAdvance(text) <= room:
            return text
    return min(texts, key=metrics.horizontalAdvance)


def widest_texts(values: np.ndarray) -> set[str]:
    """Texts at least as wide as any number of values shows (the model writes ``.4g``),
    with every digit written as 0.

    Small matrices are written out; a large one by a text per sign it holds and power of
    ten from its smallest to its largest size, with four significant digits (as wide as
    any number of that sign and power).
    """
    if values.size <= EXACT_CELLS:
        return {_digits_as_0(f"{v:.4g}") for v in values.ravel().tolist() if math.isfinite(v)}
    sizes = np.abs(values)
    nonzero = (sizes != 0) & np.isfinite(sizes)
    texts = {"0"} if not nonzero.all() else set()
    if not nonzero.any():
        return texts
    low = np.min(sizes, where=nonzero, initial=np.inf)
    high = np.max(sizes, where=nonzero, initial=0.0)
    signs = [sign for sign, there in ((-1, (values < 0).any()), (1, (values > 0).any())) if there]
    for power in range(int(np.floor(np.log10(low))), int(np.floor(np.log10(high))) + 1):
        texts |= {_digits_as_0(f"{sign * 1.234 * 10.0**power:.4g}") for sign in signs}
    return texts


def _digits_as_0(text: str) -> str:
    return "".join("0" if c.isdigit() else c for c in text)


def text_width(texts: set[str], metrics: QFontMetrics) -> int:
    """The width of the widest of texts, each digit as wide as the widest digit."""
    digit = max(metrics.horizontalAdvance(str(d)) for d in range(10))
    zero = metrics.horizontalAdvance("0")
    return max(
        (metrics.horizontalAdvance(t) + t.count("0") * (digit - zero) for t in texts), default=0
    )


class NumberDelegate(QStyledItemDelegate):
    """Shows each number with as many significant digits as its cell has room for."""

    def initStyleOption(self, option: QStyleOptionViewItem, index: Index) -> None:
        super().initStyleOption(option, index)
        style = option.widget.style() if option.widget else None
        if style is None or option.rect.width() <= 0:
            return  # measuring (sizeHint), not drawing: keep the full text
        margin = style.pixelMetric(QStyle.PixelMetric.PM_FocusFrameHMargin, None, option.widget)
        room = option.rect.width() - 2 * (margin + 1)  # as QCommonStyle lays out item text
        if option.fontMetrics.horizontalAdvance(option.text) > room:
            value = float(index.data(Qt.ItemDataRole.EditRole))
            option.text = fit_number(value, room, option.fontMetrics)


class MatrixGrid(QTableView):
    """A QTableView that behaves like a spreadsheet over one matrix."""

    message = Signal(str)  # refusals and other notes for the status bar
    picked = Signal(int, int)  # the current cell moved here (a click, a key)

    def __init__(self, model: MatrixModel, parent: QWidget | None = None):
        super().__init__(parent)
        self.setModel(model)
        self.setItemDelegate(NumberDelegate(self))
        self.reader = Background(self)  # reads long pastes off the UI thread
        self.reader.done.connect(self._pasted)
        self.reader.failed.connect(self._paste_failed)
        self._target = (0, 0, 1, 1)  # the selection a paste being read goes to
        model.refused.connect(self.message)
        model.edited.connect(lambda: self.message.emit(""))  # clears an earlier refusal
        self.setSelectionMode(QAbstractItemView.SelectionMode.ContiguousSelection)
        self.setEditTriggers(
            QAbstractItemView.EditTrigger.AnyKeyPressed
            | QAbstractItemView.EditTrigger.DoubleClicked
            | QAbstractItemView.EditTrigger.EditKeyPressed
        )
        self.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Interactive)
        self.verticalHeader().setDefaultSectionSize(24)
        self.least_width = MIN_COLUMN
        self.hint_rows: int | None = None  # sizeHint: every column and this many rows
        self._need = 0  # the column width this grid's numbers and labels need
        self._group: list[MatrixGrid] = [self]  # grids whose columns line up with this one's
        model.modelReset.connect(self.fit_columns)
        model.dataChanged.connect(self._data_changed)
        model.headerDataChanged.connect(self.fit_columns)
        self.setContextMenuPolicy(Qt.ContextMenuPolicy.ActionsContextMenu)
        for text, keys, slot in (
            ("Copy", QKeySequence.StandardKey.Copy, self.copy),
            ("Paste", QKeySequence.StandardKey.Paste, self.paste),
            ("Set to zero", QKeySequence.StandardKey.Delete, self.clear),
        ):
            action = QAction(text, self)
            action.setShortcut(keys)
            action.setShortcutContext(Qt.ShortcutContext.WidgetShortcut)
            action.triggered.connect(slot)
            self.addAction(action)
        self.fit_columns()

    def currentChanged(self, current: Index, previous: Index) -> None:
        super().currentChanged(current, previous)
        if current.isValid():
            self.picked.emit(current.row(), current.column())

    def matrix_model(self) -> MatrixModel:
        model = self.model()
        assert isinstance(model, MatrixModel)
        return model

    def shown_text(self, row: int, col: int) -> str:
        """The text a cell shows at its present width."""
        index = self.model().index(row, col)
        option = QStyleOptionViewItem()
        self.initViewItemOption(option)
        option.rect = self.visualRect(index)
        delegate = self.itemDelegate()
        assert isinstance(delegate, NumberDelegate)
        delegate.initStyleOption(option, index)
        return option.text

    # Selection ---------------------------------------------------------------------------

    def selected_rect(self) -> tuple[int, int, int, int]:
        """(row, col, rows, cols) of the selection's bounding box, or of the current cell."""
        selection = self.selectionModel().selection()
        # one range per rectangle, not per cell (PySide6's stubs miss QList's iteration)
        ranges = [r for r in selection if r.isValid()]  # type: ignore[attr-defined]
        if ranges:
            top, left = min(r.top() for r in ranges), min(r.left() for r in ranges)
            bottom, right = max(r.bottom() for r in ranges), max(r.right() for r in ranges)
            return top, left, bottom - top + 1, right - left + 1
        current = self.currentIndex()
        return (current.row(), current.column(), 1, 1) if current.isValid() else (0, 0, 1, 1)

    # Clipboard and bulk edits ----------------------------------------------------------------

    def copy(self) -> None:
        row, col, rows, cols = self.selected_rect()
        block = self.matrix_model().matrix()[row : row + rows, col : col + cols]
        QGuiApplication.clipboard().setText(format_table(block))
        self.message.emit(f"Copied {rows}×{cols} cells")

    def paste(self) -> None:
        self.paste_text(QGuiApplication.clipboard().text())

    def paste_text(self, text: str) -> bool:
        """Paste text at the selection; one undoable edit, or a refusal with a message.

        A long text is read on a worker and pasted when read: True means it is on its way.
        """
        model = self.matrix_model()
        row, col, rows, cols = self.selected_rect()
        room = (model.rowCount() - row, model.columnCount() - col)
        if len(text) <= READ_NOW_CHARS or len(text) > most_chars(*room):
            try:
                values = parse_table(text, room)
            except ValueError as e:
                return self._refuse(e, row, col)
            return self._apply(values, row, col, rows, cols)
        self._target = (row, col, rows, cols)
        self.message.emit(f"Reading {len(text):,} characters of pasted text…")
        self.reader.run(_read, text, room)
        return True

    def _pasted(self, values: object) -> None:
        row, col, rows, cols = self._target
        if isinstance(values, ValueError):
            self._refuse(values, row, col)
        else:
            assert isinstance(values, np.ndarray)
            self._apply(values, row, col, rows, cols)

    def _paste_failed(self, error: str) -> None:
        self.message.emit(f"Paste failed: {error}; nothing was changed")

    def _refuse(self, e: ValueError, row: int, col: int) -> bool:
        model = self.matrix_model()
        if isinstance(e, TableTooLarge):
            where = f"from row {row + 1}, column {col + 1}"
            self.message.emit(
                f"{model.title}: {e} {where}, so the paste does not fit; nothing was changed"
            )
        else:
            self.message.emit(f"Paste refused: {e}; nothing was changed")
        return False

    def _apply(self, values: np.ndarray, row: int, col: int, rows: int, cols: int) -> bool:
        """Write parsed values at (row, col), filling the selection with a single value."""
        model = self.matrix_model()
        if values.shape == (1, 1) and rows * cols > 1:
            values = np.full((rows, cols), values[0, 0])
            text = f"Fill {rows}×{cols} cells of {model.title}"
            done = f"Filled {rows}×{cols} cells of {model.title} with {values[0, 0]:g}"
        else:
            text = f"Paste {values.shape[0]}×{values.shape[1]} into {model.title}"
            done = f"Pasted {values.shape[0]}×{values.shape[1]} into {model.title}"
        if not model.set_block(row, col, values, text):
            return False
        self.message.emit(done)
        return True

    def clear(self) -> None:
        row, col, rows, cols = self.selected_rect()
        model = self.matrix_model()
        if rows * cols > 1:
            where = f"{rows}×{cols} cells of {model.title}"
        else:
            where = f"{model.title}[{row + 1},{col + 1}]"
        if model.set_block(row, col, np.zeros((rows, cols)), f"Set {where} to 0"):
            self.message.emit(f"Set {where} to 0")

    # Column widths -----------------------------------------------------------------------------

    def set_column_width(self, width: int) -> None:
        """The least width of a column; wider numbers or labels widen it."""
        self.least_width = width
        self.fit_columns()

    def fit_columns(self) -> None:
        """Size the columns to the widest number and label (of the whole group)."""
        self._need = self._needed_width(self.matrix_model().matrix())
        self._apply_group()

    def _data_changed(
        self, top_left: QModelIndex, bottom_right: QModelIndex, roles: list[int] | None = None
    ) -> None:
        if roles and Qt.ItemDataRole.DisplayRole not in roles:
            return  # (the colours of the gradients: the numbers are the same)
        model = self.matrix_model()
        rows, cols = model.rowCount(), model.columnCount()
        top, left, bottom, right = (
            top_left.row(),
            top_left.column(),
            bottom_right.row(),
            bottom_right.column(),
        )
        if (top, left, bottom + 1, right + 1) == (0, 0, rows, cols):
            self.fit_columns()  # the whole matrix: columns may narrow too
        else:  # a few cells: widen if they need it, never narrow under the cursor
            block = model.matrix()[top : bottom + 1, left : right + 1]
            need = max(self._need, self._needed_width(block))
            if need != self._need:
                self._need = need
                self._apply_group()

    def _needed_width(self, values: np.ndarray) -> int:
        margin = self.style().pixelMetric(QStyle.PixelMetric.PM_FocusFrameHMargin, None, self)
        numbers = text_width(widest_texts(values), self.fontMetrics()) + 2 * (margin + 1) + PAD
        return max(self.least_width, numbers, self._label_width())

    def _label_width(self) -> int:
        """What the widest column label needs (a token of the custom mask, "h12·64")."""
        header, model = self.horizontalHeader(), self.model()
        if header.isHidden() or model.columnCount() == 0:
            return 0
        metrics = header.fontMetrics()
        labels = [
            str(model.headerData(j, Qt.Orientation.Horizontal) or "")
            for j in range(model.columnCount())
        ]
        widest = max(range(len(labels)), key=lambda j: metrics.horizontalAdvance(labels[j]))
        return header.sectionSizeFromContents(widest).width()

    def _apply_group(self) -> None:
        width = max(g._need for g in self._group)
        labels = max(g.verticalHeader().sizeHint().width() for g in self._group)
        for g in self._group:
            if len(self._group) > 1:
                g.verticalHeader().setFixedWidth(labels)
            if g.horizontalHeader().defaultSectionSize() != width:
                g.horizontalHeader().setDefaultSectionSize(width)
            g.updateGeometries()  # the scrollbars, now
            g.updateGeometry()  # and the layouts that size the grid by its columns

    def content_size(self, rows: int | None = None) -> QSize:
        """The size that shows every column and (at most) rows rows, scrollbars aside."""
        model = self.model()
        shown = model.rowCount() if rows is None else min(rows, model.rowCount())
        header = self.horizontalHeader()
        frame = 2 * self.frameWidth()
        width = frame + self.verticalHeader().width() + header.length()
        top = 0 if header.isHidden() else header.height()
        height = frame + top + shown * self.verticalHeader().defaultSectionSize()
        return QSize(width, height)

    def sizeHint(self) -> QSize:
        if self.hint_rows is None or self.model() is None:  # None: its grid is going too
            return super().sizeHint()
        size = self.content_size(self.hint_rows)
        if self.model().rowCount() > self.hint_rows:
            size.setWidth(size.width() + self.verticalScrollBar().sizeHint().width())
        return size

    def changeEvent(self, event: QEvent) -> None:
        super().changeEvent(event)
        if event.type() in (QEvent.Type.FontChange, QEvent.Type.StyleChange):
            self.fit_columns()

    # Keyboard: Enter moves down, like a spreadsheet ------------------------------------------

    def keyPressEvent(self, event: QKeyEvent) -> None:
        if (
            event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter)
            and self.state() != QAbstractItemView.State.EditingState
        ):
            self._move(1 if not event.modifiers() & Qt.KeyboardModifier.ShiftModifier else -1)
            return
        if event.key() == Qt.Key.Key_Backspace:
            self.clear()
            return
        super().keyPressEvent(event)

    def closeEditor(self, editor: QWidget, hint: QAbstractItemDelegate.EndEditHint) -> None:
        super().closeEditor(editor, hint)
        if hint == QAbstractItemDelegate.EndEditHint.SubmitModelCache:
            self._move(1)

    def _move(self, step: int) -> None:
        current = self.currentIndex()
        if not current.isValid():
            return
        row = min(max(current.row() + step, 0), self.model().rowCount() - 1)
        target: QModelIndex = self.model().index(row, current.column())
        self.setCurrentIndex(target)


def share_columns(grids: list[MatrixGrid]) -> None:
    """Give grids stacked in a column one column width and one row-label width."""
    for grid in grids:
        grid._group = grids
        grid._need = grid._needed_width(grid.matrix_model().matrix())
    grids[0]._apply_group()
