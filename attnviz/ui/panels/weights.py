"""Weights dock: a tab per head with its W_Q, W_K and W_V grids; the W_O grid; h and d_k."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import QRect, QSize, Qt, Signal
from PySide6.QtWidgets import (
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLayout,
    QLayoutItem,
    QSplitter,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from attnviz.core.maths.scenario import LIMITS, WEIGHT_NAMES, resized
from attnviz.ui.grid import MatrixGrid
from attnviz.ui.matrix_model import MatrixModel
from attnviz.ui.panels.common import int_spin, set_quietly
from attnviz.ui.workspace import Workspace


def titled(title: str, widget: QWidget) -> QGroupBox:
    box = QGroupBox(title)
    layout = QVBoxLayout(box)
    layout.setContentsMargins(4, 4, 4, 4)
    layout.addWidget(widget)
    return box


class EvenRow(QLayout):
    """Widgets side by side in exactly equal widths, so that equal grids scroll alike.

    (A QHBoxLayout hands spare pixels to some widgets only: one grid of three could be a
    pixel narrower than its content and show a scrollbar the others lack.)
    """

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

    def sizeHint(self) -> QSize:
        return self._total(lambda item: item.sizeHint())

    def minimumSize(self) -> QSize:
        return self._total(lambda item: item.minimumSize())

    def _total(self, size_of: Callable[[QLayoutItem], QSize]) -> QSize:
        sizes = [size_of(item) for item in self._items]
        n = len(sizes)
        margins = self.contentsMargins()
        width = n * max((s.width() for s in sizes), default=0) + max(n - 1, 0) * self.spacing()
        height = max((s.height() for s in sizes), default=0)
        return QSize(
            width + margins.left() + margins.right(), height + margins.top() + margins.bottom()
        )

    def setGeometry(self, rect: QRect) -> None:
        super().setGeometry(rect)
        if not self._items:
            return
        area = self.contentsRect()
        n, spacing = len(self._items), self.spacing()
        width = (area.width() - (n - 1) * spacing) // n
        for i, item in enumerate(self._items):
            item.setGeometry(
                QRect(area.x() + i * (width + spacing), area.y(), width, area.height())
            )


class WeightsPanel(QWidget):
    message = Signal(str)

    def __init__(self, ws: Workspace, parent: QWidget | None = None):
        super().__init__(parent)
        self.doc, self.view_state, self.compute = ws.doc, ws.view_state, ws.compute
        self.grids: dict[tuple[str, int | None], MatrixGrid] = {}

        bar = QHBoxLayout()
        bar.addWidget(QLabel("heads"))
        self.heads = int_spin(1, LIMITS.heads, "Number of attention heads")
        self.heads.valueChanged.connect(lambda h: self._resize("heads", h))
        bar.addWidget(self.heads)
        bar.addWidget(QLabel("d_k"))
        self.d_k = int_spin(1, LIMITS.d_k, "Width of each head's queries, keys and values")
        self.d_k.valueChanged.connect(lambda d: self._resize("d_k", d))
        bar.addWidget(self.d_k)
        bar.addStretch(1)

        self.tabs = QTabWidget()
        self.tabs.setDocumentMode(True)
        self.tabs.currentChanged.connect(self._tab_chosen)
        self.w_o = self._grid("W_O", None)
        split = QSplitter(Qt.Orientation.Vertical)
        split.addWidget(self.tabs)
        split.addWidget(titled("W_O: mixes the concatenated heads (h·d_k × d_model)", self.w_o))
        split.setChildrenCollapsible(False)

        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addLayout(bar)
        layout.addWidget(split)
        ws.doc.scenarioChanged.connect(self.sync)
        ws.view_state.headChanged.connect(self.tabs.setCurrentIndex)
        self.sync()

    def _tab_chosen(self, index: int) -> None:
        if index >= 0:  # -1 while the tabs are rebuilt
            self.view_state.set_head(index)

    def _grid(self, name: str, head: int | None) -> MatrixGrid:
        grid = MatrixGrid(MatrixModel(self.doc, name, head))
        grid.message.connect(self.message)
        grid.setObjectName(f"grid-{name}-{head}")
        self.grids[(name, head)] = grid
        return grid

    def _head_tab(self, head: int) -> QWidget:
        tab = QWidget()
        row = EvenRow(tab)
        row.setContentsMargins(0, 4, 0, 0)
        row.setSpacing(6)
        for name in WEIGHT_NAMES:
            grid = self._grid(name, head)
            grid.set_column_width(48)
            box = titled(name, grid)
            box.setToolTip(f"{name} of head {head + 1}: d_model rows × d_k columns")
            row.addWidget(box)
        return tab

    def sync(self) -> None:
        s = self.doc.scenario
        set_quietly(self.heads, s.n_heads)
        set_quietly(self.d_k, s.d_k)
        if self.tabs.count() != s.n_heads:
            self.tabs.blockSignals(True)
            while self.tabs.count() > s.n_heads:
                gone = self.tabs.count() - 1
                for name in WEIGHT_NAMES:
                    self.grids.pop((name, gone)).model().deleteLater()
                tab = self.tabs.widget(gone)
                if tab is not None:
                    tab.deleteLater()
                self.tabs.removeTab(gone)
            for head in range(self.tabs.count(), s.n_heads):
                self.tabs.addTab(self._head_tab(head), f"head {head + 1}")
            self.tabs.setCurrentIndex(min(self.view_state.head, s.n_heads - 1))
            self.tabs.blockSignals(False)
        self.tabs.setEnabled(s.settings.projections)
        self.w_o.setEnabled(s.settings.projections)

    def _resize(self, what: str, value: int) -> None:
        s = self.doc.scenario
        if value == (s.n_heads if what == "heads" else s.d_k):
            return
        refusal = self.doc.change(lambda s: resized(s, **{what: value}), f"Set {what} to {value}")
        self.message.emit(refusal)  # '' clears an earlier refusal
        if refusal:
            self.sync()
