"""The spreadsheet view over a MatrixModel: keyboard, clipboard, fill and delete.

Copy writes the selected rectangle as tab-separated text; paste reads spreadsheet
ranges, CSV or NumPy's printed arrays. A single pasted value fills the whole selection.
Every paste, fill or delete is one undoable edit; one that does not fit, or text that is
not a finite number, is refused with a message and changes nothing.
"""

from __future__ import annotations

import numpy as np
from PySide6.QtCore import QModelIndex, Qt, Signal
from PySide6.QtGui import QAction, QGuiApplication, QKeyEvent, QKeySequence
from PySide6.QtWidgets import (
    QAbstractItemDelegate,
    QAbstractItemView,
    QHeaderView,
    QTableView,
    QWidget,
)

from attnviz.core.text import format_table, parse_table
from attnviz.ui.matrix_model import MatrixModel


class MatrixGrid(QTableView):
    """A QTableView that behaves like a spreadsheet over one matrix."""

    message = Signal(str)  # refusals and other notes for the status bar

    def __init__(self, model: MatrixModel, parent: QWidget | None = None):
        super().__init__(parent)
        self.setModel(model)
        model.refused.connect(self.message)
        self.setSelectionMode(QAbstractItemView.SelectionMode.ContiguousSelection)
        self.setEditTriggers(
            QAbstractItemView.EditTrigger.AnyKeyPressed
            | QAbstractItemView.EditTrigger.DoubleClicked
            | QAbstractItemView.EditTrigger.EditKeyPressed
        )
        self.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Interactive)
        self.horizontalHeader().setDefaultSectionSize(56)
        self.verticalHeader().setDefaultSectionSize(24)
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

    def matrix_model(self) -> MatrixModel:
        model = self.model()
        assert isinstance(model, MatrixModel)
        return model

    # Selection ---------------------------------------------------------------------------

    def selected_rect(self) -> tuple[int, int, int, int]:
        """(row, col, rows, cols) of the selection's bounding box, or of the current cell."""
        indexes = self.selectedIndexes() or [self.currentIndex()]
        indexes = [i for i in indexes if i.isValid()]
        if not indexes:
            return 0, 0, 1, 1
        rows = [i.row() for i in indexes]
        cols = [i.column() for i in indexes]
        return min(rows), min(cols), max(rows) - min(rows) + 1, max(cols) - min(cols) + 1

    # Clipboard and bulk edits ----------------------------------------------------------------

    def copy(self) -> None:
        row, col, rows, cols = self.selected_rect()
        block = self.matrix_model().matrix()[row : row + rows, col : col + cols]
        QGuiApplication.clipboard().setText(format_table(block))
        self.message.emit(f"Copied {rows}×{cols} cells")

    def paste(self) -> None:
        self.paste_text(QGuiApplication.clipboard().text())

    def paste_text(self, text: str) -> bool:
        """Paste text at the selection; one undoable edit, or a refusal with a message."""
        model = self.matrix_model()
        try:
            values = parse_table(text)
        except ValueError as e:
            self.message.emit(f"Paste refused: {e}; nothing was changed")
            return False
        row, col, rows, cols = self.selected_rect()
        if values.shape == (1, 1) and rows * cols > 1:
            values = np.full((rows, cols), values[0, 0])
            text = f"Fill {rows}×{cols} cells of {model.label}"
        else:
            text = f"Paste {values.shape[0]}×{values.shape[1]} into {model.label}"
        return model.set_block(row, col, values, text)

    def clear(self) -> None:
        row, col, rows, cols = self.selected_rect()
        self.matrix_model().set_block(row, col, np.zeros((rows, cols)), "Set cells to 0")

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
