"""Two layouts that fit their width instead of widening the dock they are in.

``FlowLayout`` places its items in rows, each at its size hint, and starts a new row
where the next one would not fit (Qt's flow-layout example). ``ColumnsLayout`` puts its
visible items in as many equal columns as fit, one per column of at least min_width,
each as tall as its width times aspect: side by side when wide, stacked when narrow.
Both give their height for a width, which the scroll area of a dock respects.
"""

from __future__ import annotations

from PySide6.QtCore import QPoint, QRect, QSize, Qt
from PySide6.QtWidgets import QLayout, QLayoutItem, QWidget


class ItemList(QLayout):
    """A layout that keeps its items in a list (what QLayout leaves to its subclasses)."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self._items: list[QLayoutItem] = []

    def addItem(self, item: QLayoutItem) -> None:
        self._items.append(item)

    def count(self) -> int:
        return len(self._items)

    def itemAt(self, index: int) -> QLayoutItem | None:
        return self._items[index] if 0 <= index < len(self._items) else None

    def takeAt(self, index: int) -> QLayoutItem | None:
        return self._items.pop(index) if 0 <= index < len(self._items) else None


class _Items(ItemList):
    """Items placed by ``_place``, which also gives the height for a width."""

    def __init__(self, parent: QWidget | None = None, spacing: int = 6):
        super().__init__(parent)
        self.setContentsMargins(0, 0, 0, 0)
        self.setSpacing(spacing)

    def expandingDirections(self) -> Qt.Orientation:
        return Qt.Orientation(0)

    def hasHeightForWidth(self) -> bool:
        return True

    def heightForWidth(self, width: int) -> int:
        return self._place(QRect(0, 0, width, 0), move=False)

    def setGeometry(self, rect: QRect) -> None:
        super().setGeometry(rect)
        self._place(rect, move=True)

    def sizeHint(self) -> QSize:
        return self.minimumSize()

    def _shown(self) -> list[QLayoutItem]:
        return [item for item in self._items if not item.isEmpty()]

    def _place(self, rect: QRect, move: bool) -> int:
        raise NotImplementedError


class FlowLayout(_Items):
    """Items at their size hints, left to right, wrapping onto new rows."""

    def minimumSize(self) -> QSize:
        size = QSize()
        for item in self._shown():
            size = size.expandedTo(item.minimumSize().expandedTo(item.sizeHint()))
        return size

    def _place(self, rect: QRect, move: bool) -> int:
        x, y, row_height, gap = rect.x(), rect.y(), 0, self.spacing()
        for item in self._shown():
            hint = item.sizeHint()
            if x > rect.x() and x + hint.width() > rect.right() + 1:
                x, y, row_height = rect.x(), y + row_height + gap, 0
            if move:
                item.setGeometry(QRect(QPoint(x, y), hint))
            x += hint.width() + gap
            row_height = max(row_height, hint.height())
        return y + row_height - rect.y()


class ColumnsLayout(_Items):
    """Visible items in equal columns of at least min_width (at most max_columns), each
    item aspect times its width tall, between min_height and max_height."""

    def __init__(
        self,
        min_width: int,
        aspect: float,
        min_height: int,
        max_height: int,
        max_columns: int = 3,
        parent: QWidget | None = None,
    ):
        super().__init__(parent)
        self.min_width, self.aspect, self.max_columns = min_width, aspect, max_columns
        self.min_height, self.max_height = min_height, max_height

    def minimumSize(self) -> QSize:
        return QSize(self.min_width, self.min_height)

    def _place(self, rect: QRect, move: bool) -> int:
        items, gap = self._shown(), self.spacing()
        if not items:
            return 0
        columns = max(
            1, min(self.max_columns, len(items), (rect.width() + gap) // (self.min_width + gap))
        )
        width = (rect.width() - gap * (columns - 1)) // columns
        height = max(self.min_height, min(self.max_height, round(width * self.aspect)))
        for k, item in enumerate(items):
            row, col = divmod(k, columns)
            if move:
                x, y = rect.x() + col * (width + gap), rect.y() + row * (height + gap)
                item.setGeometry(QRect(x, y, width, height))
        rows = -(-len(items) // columns)
        return rows * height + (rows - 1) * gap
