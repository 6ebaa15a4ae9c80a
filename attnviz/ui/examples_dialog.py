"""File → Open Example…: the shipped examples in groups, each with a thumbnail of its
first head's weights, its title and what it shows.

Thumbnails are computed off the UI thread the first time the gallery opens and kept
for the session; the list is usable before they arrive.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
from PySide6.QtCore import (
    QModelIndex,
    QObject,
    QPersistentModelIndex,
    QRect,
    QSettings,
    QSize,
    Qt,
    Signal,
)
from PySide6.QtGui import QFont, QFontMetrics, QIcon, QImage, QPainter, QPixmap
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QStyle,
    QStyledItemDelegate,
    QStyleOptionViewItem,
    QVBoxLayout,
    QWidget,
)

from attnviz.core.examples import Example, examples
from attnviz.ui.workers import SerialQueue

THUMB = 64  # pixels, square
NAME = Qt.ItemDataRole.UserRole
SUMMARY = Qt.ItemDataRole.UserRole + 1
_THUMBNAILS: dict[str, QImage] = {}  # by example name, for the session


def thumbnail_rgb(example: Example) -> np.ndarray:
    """(rows, cols, 3) uint8: the first head's weights, keys a mask hides in grey."""
    from attnviz.core.figures import colors
    from attnviz.core.maths.forward import compute

    head = compute(example.load()).heads[0]
    weights = np.where(np.isneginf(head.masked), np.nan, head.weights)
    return np.ascontiguousarray(colors.rgb(weights, "sequential", (0.0, 1.0)))


def thumbnail_image(rgb: np.ndarray) -> QImage:
    """rgb scaled to fit THUMB × THUMB: cells stay sharp when enlarged, averaged when not."""
    h, w, _ = rgb.shape
    image = QImage(rgb.data, w, h, 3 * w, QImage.Format.Format_RGB888).copy()
    enlarge = max(h, w) <= THUMB
    mode = (
        Qt.TransformationMode.FastTransformation
        if enlarge
        else Qt.TransformationMode.SmoothTransformation
    )
    return image.scaled(THUMB, THUMB, Qt.AspectRatioMode.KeepAspectRatio, mode)


class Thumbnails(QObject):
    """Computes the thumbnails one at a time on the shared pool."""

    ready = Signal(str, QImage)

    def __init__(self, parent: QObject | None = None):
        super().__init__(parent)
        self._queue = SerialQueue()

    def start(self, wanted: list[Example]) -> None:
        for example in wanted:
            self._queue.submit(functools.partial(self._make, example))

    def _make(self, example: Example) -> None:
        try:
            image = thumbnail_image(thumbnail_rgb(example))
        except Exception:  # a broken install: the entry keeps its blank square
            return
        self.ready.emit(example.name, image)

    def close(self) -> None:
        self._queue.close()


class _Entry(QStyledItemDelegate):
    """An example as its thumbnail, its title in bold and its summary below, wrapped;
    a group heading as bold text on its own."""

    def _fonts(self, option: QStyleOptionViewItem) -> tuple[QFont, QFont]:
        bold = QFont(option.font)
        bold.setBold(True)
        return bold, QFont(option.font)

    @staticmethod
    def _text_width(width: int) -> int:
        """The room for the words beside the thumbnail in an entry width pixels wide."""
        return max(120, width - THUMB - 24)

    def sizeHint(
        self, option: QStyleOptionViewItem, index: QModelIndex | QPersistentModelIndex
    ) -> QSize:
        bold, plain = self._fonts(option)
        width = option.rect.width() or 480
        if index.data(NAME) is None:  # a group heading
            return QSize(width, QFontMetrics(bold).height() + 12)
        text_w = self._text_width(width)
        flags = int(Qt.TextFlag.TextWordWrap)
        title = QFontMetrics(bold).boundingRect(QRect(0, 0, text_w, 10_000), flags, index.data())
        summary = QFontMetrics(plain).boundingRect(
            QRect(0, 0, text_w, 10_000), flags, index.data(SUMMARY)
        )
        return QSize(width, max(THUMB + 8, title.height() + summary.height() + 14))

    def paint(
        self,
        painter: QPainter,
        option: QStyleOptionViewItem,
        index: QModelIndex | QPersistentModelIndex,
    ) -> None:
        rect: QRect = option.rect
        palette = option.palette
        bold, plain = self._fonts(option)
        painter.save()
        if index.data(NAME) is None:
            painter.setFont(bold)
            painter.setPen(palette.color(palette.ColorRole.PlaceholderText))
            painter.drawText(rect.adjusted(6, 6, -6, 0), Qt.AlignmentFlag.AlignLeft, index.data())
            painter.restore()
            return
        selected = bool(option.state & QStyle.StateFlag.State_Selected)
        if selected:
            painter.fillRect(rect, palette.highlight())
        text_role = palette.ColorRole.HighlightedText if selected else palette.ColorRole.Text
        icon: QIcon = index.data(Qt.ItemDataRole.DecorationRole)
        box = QRect(rect.left() + 6, rect.top() + 4, THUMB, THUMB)
        painter.fillRect(box, palette.alternateBase())
        if icon is not None and not icon.isNull():
            pixmap = icon.pixmap(THUMB, THUMB)
            size = pixmap.deviceIndependentSize().toSize()
            x = box.left() + (THUMB - size.width()) // 2
            y = box.top() + (THUMB - size.height()) // 2
            painter.drawPixmap(x, y, pixmap)
        text = QRect(
            box.right() + 12, rect.top() + 4, self._text_width(rect.width()), rect.height() - 8
        )
        flags = int(Qt.TextFlag.TextWordWrap)
        painter.setPen(palette.color(text_role))
        painter.setFont(bold)
        title = painter.boundingRect(text, flags, index.data())
        painter.drawText(text, flags, index.data())
        painter.setFont(plain)
        painter.drawText(text.adjusted(0, title.height() + 2, 0, 0), flags, index.data(SUMMARY))
        painter.restore()


class ExampleGallery(QDialog):
    """Choose an example: Enter or a double click opens it."""

    def __init__(self, settings: QSettings, parent: QWidget | None = None):
        super().__init__(parent)
        self.settings = settings
        self.setWindowTitle("Open Example")
        self.items: dict[str, QListWidgetItem] = {}
        self.list = QListWidget()
        self.list.setItemDelegate(_Entry(self.list))
        self.list.setVerticalScrollMode(QListWidget.ScrollMode.ScrollPerPixel)
        self.list.setResizeMode(QListWidget.ResizeMode.Adjust)
        self.list.setUniformItemSizes(False)
        section = ""
        for example in examples():
            if example.section != section:
                section = example.section
                heading = QListWidgetItem(section)
                heading.setFlags(Qt.ItemFlag.NoItemFlags)
                self.list.addItem(heading)
            item = QListWidgetItem(example.title)
            item.setData(NAME, example.name)
            item.setData(SUMMARY, example.summary)
            item.setToolTip(f"{example.path.name}: {example.summary}")
            if example.name in _THUMBNAILS:
                item.setIcon(QIcon(QPixmap.fromImage(_THUMBNAILS[example.name])))
            self.list.addItem(item)
            self.items[example.name] = item
        self.list.itemActivated.connect(lambda _item: self.accept())
        note = QLabel(
            "An example opens untitled: Save asks where to keep your copy. Thumbnails show "
            "the first head's attention weights (grey: keys the mask hides)."
        )
        note.setWordWrap(True)
        buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Open | QDialogButtonBox.StandardButton.Cancel
        )
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        self.open_button = buttons.button(QDialogButtonBox.StandardButton.Open)
        self.list.currentItemChanged.connect(
            lambda item, _old: self.open_button.setEnabled(item is not None)
        )
        layout = QVBoxLayout(self)
        layout.addWidget(self.list, 1)
        layout.addWidget(note)
        layout.addWidget(buttons)
        self._select(str(settings.value("examples/last", "worked-example")))
        geometry = settings.value("examples/geometry")
        if geometry is None or not self.restoreGeometry(geometry):
            self.resize(620, 560)
        self.thumbnails = Thumbnails(self)
        self.thumbnails.ready.connect(self._thumbnail)
        self.thumbnails.start([e for e in examples() if e.name not in _THUMBNAILS])

    def _select(self, name: str) -> None:
        item = self.items.get(name) or next(iter(self.items.values()), None)
        if item is not None:
            self.list.setCurrentItem(item)
            self.list.scrollToItem(item)

    def _thumbnail(self, name: str, image: QImage) -> None:
        _THUMBNAILS[name] = image
        if name in self.items:
            self.items[name].setIcon(QIcon(QPixmap.fromImage(image)))

    def chosen(self) -> Example | None:
        item = self.list.currentItem()
        name: Any = item.data(NAME) if item is not None else None
        return next((e for e in examples() if e.name == name), None)

    def done(self, result: int) -> None:
        self.thumbnails.close()
        self.settings.setValue("examples/geometry", self.saveGeometry())
        chosen = self.chosen()
        if result == QDialog.DialogCode.Accepted and chosen is not None:
            self.settings.setValue("examples/last", chosen.name)
        super().done(result)
