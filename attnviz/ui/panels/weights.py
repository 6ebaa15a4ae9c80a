"""Weights dock: a tab per head with its W_Q, W_K and W_V grids and their biases; W_O and
b_O; the numbers of heads and key/value heads, and d_k."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import QRect, QSize, Qt, Signal
from PySide6.QtWidgets import (
    QApplication,
    QCheckBox,
    QFrame,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLayoutItem,
    QScrollArea,
    QSplitter,
    QStyle,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from attnviz.core.maths.scenario import (
    LIMITS,
    WEIGHT_NAMES,
    Scenario,
    resized,
    with_kv_heads,
)
from attnviz.ui.flow import ItemList
from attnviz.ui.grid import MatrixGrid, share_columns
from attnviz.ui.matrix_model import MatrixModel
from attnviz.ui.panels.common import int_spin, set_quietly
from attnviz.ui.workspace import Workspace


def titled(title: str, widget: QWidget) -> QGroupBox:
    box = QGroupBox(title)
    layout = QVBoxLayout(box)
    layout.setContentsMargins(4, 4, 4, 4)
    layout.addWidget(widget)
    return box


class WeightRows(ItemList):
    """A head's weight boxes in rows of equal widths: all side by side when each then shows
    all its columns, filling the height (``room``: what the scroll area around shows);
    else as many to a row as show their columns (W_Q and W_K, then W_V; or one a row),
    each row as tall as its boxes' sizeHint, the rows scrolling up and down.

    (Three grids squeezed side by side would each show a column or two of their numbers.)
    """

    def __init__(self, room: Callable[[], int], parent: QWidget | None = None):
        super().__init__(parent)
        self._room = room

    def sizeHint(self) -> QSize:
        hints = [item.sizeHint() for item in self._items]
        return self._grow(
            sum(h.width() for h in hints) + self.spacing() * max(len(hints) - 1, 0),
            max((h.height() for h in hints), default=0),
        )

    def minimumSize(self) -> QSize:
        return self._grow(0, 0)

    def _grow(self, width: int, height: int) -> QSize:
        m = self.contentsMargins()
        return QSize(width + m.left() + m.right(), height + m.top() + m.bottom())

    def _share(self, width: int, per_row: int) -> int:
        m = self.contentsMargins()
        return (width - m.left() - m.right() - (per_row - 1) * self.spacing()) // per_row

    def per_row(self, width: int) -> int:
        """How many boxes to a row: the most that each show all their columns."""
        hints = [item.sizeHint() for item in self._items]
        m = self.contentsMargins()
        bar = QApplication.style().pixelMetric(QStyle.PixelMetric.PM_ScrollBarExtent)
        room = self._room() - m.top() - m.bottom()
        if all(
            h.width() + (bar if h.height() > room else 0) <= self._share(width, len(hints))
            for h in hints
        ):
            return max(len(hints), 1)  # side by side, as tall as the room
        for n in range(len(hints) - 1, 1, -1):
            if all(h.width() <= self._share(width, n) for h in hints):
                return n
        return 1

    def _rows(self, per_row: int) -> list[list[QLayoutItem]]:
        return [self._items[i : i + per_row] for i in range(0, len(self._items), per_row)]

    def hasHeightForWidth(self) -> bool:
        return True

    def heightForWidth(self, width: int) -> int:
        n = self.per_row(width)
        if n == len(self._items):
            return self._grow(0, 0).height()  # the room the scroll area shows
        rows = self._rows(n)
        heights = [max(item.sizeHint().height() for item in row) for row in rows]
        return self._grow(0, sum(heights) + self.spacing() * (len(rows) - 1)).height()

    def setGeometry(self, rect: QRect) -> None:
        super().setGeometry(rect)
        if not self._items:
            return
        area, spacing = self.contentsRect(), self.spacing()
        n = self.per_row(rect.width())
        width, y = self._share(rect.width(), n), area.y()
        for row in self._rows(n):
            height = (
                area.height()
                if n == len(self._items)
                else max(item.sizeHint().height() for item in row)
            )
            for i, item in enumerate(row):
                item.setGeometry(QRect(area.x() + i * (width + spacing), y, width, height))
            y += height + spacing


def row_grid(grid: MatrixGrid, above: MatrixGrid) -> MatrixGrid:
    """A one-row grid (a bias or norm weights) under the grid above: no taller than its
    row, scrolling sideways with the grid above (so it needs no scrollbar of its own)."""
    grid.horizontalHeader().hide()
    grid.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
    grid.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
    grid.setFixedHeight(grid.verticalHeader().defaultSectionSize() + 2 * grid.frameWidth())
    above.horizontalScrollBar().valueChanged.connect(grid.horizontalScrollBar().setValue)
    return grid


BIAS_NAMES = ("b_Q", "b_K", "b_V", "b_O")


def has_biases(s: Scenario) -> bool:
    return any(getattr(s, name).any() for name in BIAS_NAMES)


HINT_ROWS = 10  # stacked, a weight grid shows this many rows before it scrolls
W_O_ROWS = 6  # W_O asks for this many rows; the head's grids get the rest


def head_page() -> QScrollArea:
    """A head's tab: its boxes scroll up and down when stacked taller than the tab."""
    page = QScrollArea()
    page.setWidgetResizable(True)
    page.setFrameShape(QFrame.Shape.NoFrame)
    page.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
    return page


ROW_TIPS = {
    "b": "Added to every row of the product (BERT, GPT-2 and Qwen2 have these; 0 is none)",
    "q": "QK-norm: each feature of the normalised row is multiplied by its weight",
    "k": "QK-norm: each feature of the normalised row is multiplied by its weight",
}


def heads_of(s: Scenario, kv: int) -> str:
    """The query heads (from 1) that share key/value head kv: "heads 3–4"."""
    group = [h + 1 for h in range(s.n_heads) if s.kv_head_of(h) == kv]
    return f"head {group[0]}" if len(group) == 1 else f"heads {group[0]}–{group[-1]}"


class Grids(dict[tuple[str, int | None], MatrixGrid]):
    """The panel's grids by (matrix, head); asking for one on a head tab not built yet
    builds that tab."""

    def __init__(self, build: Callable[[tuple[str, int | None]], None]):
        super().__init__()
        self._build = build

    def __missing__(self, key: tuple[str, int | None]) -> MatrixGrid:
        if key in self:
            return dict.__getitem__(self, key)
        raise KeyError(key)

    def __contains__(self, key: object) -> bool:
        if not dict.__contains__(self, key) and isinstance(key, tuple) and len(key) == 2:
            self._build(key)
        return dict.__contains__(self, key)


class WeightsPanel(QWidget):
    """Per query head: W_Q, W_K, W_V with a bias row under each (and QK-norm weights when
    on); the key/value heads shared by groups say which; W_O with b_O; H, G and d_k."""

    message = Signal(str)
    cellPicked = Signal(str, object, int, int)  # matrix, head, row, col: a cell clicked

    def __init__(self, ws: Workspace, parent: QWidget | None = None):
        super().__init__(parent)
        self.doc, self.view_state, self.compute = ws.doc, ws.view_state, ws.compute
        self.source = ws.gradients  # each grid tints its cells by their gradients while shown
        self.grids = Grids(self._build_tab_of)
        self._tab_grids: list[MatrixGrid] = []
        self._built: set[int] = set()  # head tabs are built when first shown: a 32-head
        # layer of d_model 4096 would otherwise make 96 grids of 4096 rows at once
        self._layout_key: tuple[object, ...] = ()
        self._had_biases = False  # whether the scenario last shown had biases

        bar = QHBoxLayout()
        bar.addWidget(QLabel("heads"))
        self.heads = int_spin(1, LIMITS.heads, "Number of attention (query) heads")
        self.heads.valueChanged.connect(lambda h: self._resize("heads", h))
        bar.addWidget(self.heads)
        bar.addWidget(QLabel("KV heads"))
        self.kv_heads = int_spin(
            1,
            LIMITS.heads,
            "Key/value heads: fewer than the heads makes groups of query heads share K and V "
            "(GQA; 1 is multi-query attention). Must divide the number of heads.",
        )
        self.kv_heads.valueChanged.connect(self._set_kv_heads)
        bar.addWidget(self.kv_heads)
        bar.addWidget(QLabel("d_k"))
        self.d_k = int_spin(1, LIMITS.d_k, "Width of each head's queries, keys and values")
        self.d_k.valueChanged.connect(lambda d: self._resize("d_k", d))
        bar.addWidget(self.d_k)
        self.biases = QCheckBox("biases")
        self.biases.setToolTip(
            "Show a bias row under each weight grid and under W_O (on by itself when a "
            "scenario has biases, off when a new one has none; zero rows are no bias)"
        )
        self.biases.toggled.connect(lambda _: self.sync())
        bar.addWidget(self.biases)
        bar.addStretch(1)

        self.tabs = QTabWidget()
        self.tabs.setDocumentMode(True)
        self.tabs.currentChanged.connect(self._tab_chosen)
        self.w_o = self._grid("W_O", None)
        self.w_o.hint_rows = W_O_ROWS
        self.b_o = row_grid(self._grid("b_O", None), self.w_o)
        mix = QWidget()
        mix_layout = QVBoxLayout(mix)
        mix_layout.setContentsMargins(0, 0, 0, 0)
        mix_layout.setSpacing(2)
        mix_layout.addWidget(self.w_o)
        self.b_o_label = QLabel("bias b_O")
        mix_layout.addWidget(self.b_o_label)
        mix_layout.addWidget(self.b_o)
        share_columns([self.w_o, self.b_o])
        split = QSplitter(Qt.Orientation.Vertical)
        split.addWidget(self.tabs)
        split.addWidget(titled("W_O: mixes the concatenated heads (h·d_k × d_model)", mix))
        split.setChildrenCollapsible(False)
        split.setStretchFactor(0, 1)  # room to spare goes to the head's grids
        split.setStretchFactor(1, 0)

        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addLayout(bar)
        layout.addWidget(split)
        ws.doc.scenarioChanged.connect(self.sync)
        ws.doc.cellsChanged.connect(self._cells_changed)
        ws.view_state.headChanged.connect(self.tabs.setCurrentIndex)
        self.sync()

    def _cells_changed(self, name: str, *_: object) -> None:
        if name in BIAS_NAMES:
            self._had_biases = has_biases(self.doc.scenario)

    def _tab_chosen(self, index: int) -> None:
        if index >= 0:  # -1 while the tabs are rebuilt
            self._build_tab(index)
            self.view_state.set_head(index)

    def _build_tab(self, head: int) -> None:
        if head not in self._built and 0 <= head < self.tabs.count():
            self._built.add(head)
            tab = self.tabs.widget(head)
            assert tab is not None
            self._fill_head_tab(head, tab)

    def _build_tab_of(self, key: tuple[str, int | None]) -> None:
        """Build the head tab that shows grid ``key`` (a query or key/value head's)."""
        name, index = key
        if index is None:
            return
        s = self.doc.scenario
        if name in ("W_Q", "b_Q", "q_norm"):
            self._build_tab(index)
        else:
            heads = [h for h in range(s.n_heads) if s.kv_head_of(h) == index]
            if heads:
                self._build_tab(heads[0])

    def _grid(self, name: str, head: int | None) -> MatrixGrid:
        grid = MatrixGrid(MatrixModel(self.doc, name, head, self.source))
        grid.message.connect(self.message)
        grid.picked.connect(lambda r, c: self.cellPicked.emit(name, head, r, c))
        grid.setObjectName(f"grid-{name}-{head}")
        return grid

    def _column(self, name: str, index: int, title: str, tip: str) -> QGroupBox:
        """One weight grid with its bias row (and norm weights) under it."""
        box = QGroupBox(title)
        box.setToolTip(tip)
        column = QVBoxLayout(box)
        column.setContentsMargins(4, 4, 4, 4)
        column.setSpacing(2)
        rows = [name, "b" + name[1:]] if self.biases.isChecked() else [name]
        if self.doc.scenario.settings.qk_norm != "none" and name != "W_V":
            rows.append("q_norm" if name == "W_Q" else "k_norm")
        grids: list[MatrixGrid] = []
        for part in rows:
            grid = self._grid(part, index)
            grid.hint_rows = HINT_ROWS
            if part != name:
                caption = "bias" if part.startswith("b_") else "norm weights"
                label = QLabel(f"{caption} {part}")
                label.setToolTip(ROW_TIPS[part[:1]])
                column.addWidget(label)
                row_grid(grid, grids[0])
            column.addWidget(grid)
            self._tab_grids.append(grid)
            self.grids.setdefault((part, index), grid)
            grids.append(grid)
        return box

    def _fill_head_tab(self, head: int, tab: QWidget) -> None:
        s = self.doc.scenario
        assert isinstance(tab, QScrollArea)
        page = QWidget()
        row = WeightRows(lambda: tab.maximumViewportSize().height(), page)
        row.setContentsMargins(0, 4, 0, 0)
        row.setSpacing(6)
        first = len(self._tab_grids)
        kv = s.kv_head_of(head)
        shared = s.kv_heads != s.n_heads
        for name in WEIGHT_NAMES:
            if name == "W_Q" or not shared:
                title, index = name, head
                tip = f"{name} of head {head + 1}: d_model rows × d_k columns; its bias under it"
            else:
                title, index = f"{name} · KV head {kv + 1} ({heads_of(s, kv)})", kv
                tip = (
                    f"{name} of key/value head {kv + 1}, shared by {heads_of(s, kv)}: "
                    "editing it changes every head of the group"
                )
            row.addWidget(self._column(name, index, title, tip))
        grids = self._tab_grids[first:]
        share_columns(grids)  # W_Q, W_K, W_V and their rows: one column width
        off = Qt.ScrollBarPolicy.ScrollBarAlwaysOff
        tall = [g for g in grids if g.verticalScrollBarPolicy() != off]
        for grid in tall:  # the same rows (the features of X): they scroll together
            for other in tall:
                if other is not grid:
                    grid.verticalScrollBar().valueChanged.connect(
                        other.verticalScrollBar().setValue
                    )
        tab.setWidget(page)

    def sync(self) -> None:
        s = self.doc.scenario
        set_quietly(self.heads, s.n_heads)
        self.kv_heads.blockSignals(True)  # a smaller maximum would clamp and emit
        self.kv_heads.setMaximum(s.n_heads)
        self.kv_heads.blockSignals(False)
        set_quietly(self.kv_heads, s.kv_heads)
        set_quietly(self.d_k, s.d_k)
        has = has_biases(s)
        if has or self._had_biases:  # else a tick of the user's own is kept
            self.biases.blockSignals(True)
            self.biases.setChecked(has)
            self.biases.blockSignals(False)
        self._had_biases = has
        key = (s.n_heads, s.kv_heads, s.settings.qk_norm, self.biases.isChecked())
        if key != self._layout_key:
            self._layout_key = key
            self.tabs.blockSignals(True)
            for grid in self._tab_grids:
                grid.model().deleteLater()
            self._tab_grids.clear()
            for k in [k for k in self.grids if k[1] is not None]:
                del self.grids[k]
            self._built.clear()
            while self.tabs.count():
                tab = self.tabs.widget(0)
                self.tabs.removeTab(0)
                if tab is not None:
                    tab.deleteLater()
            for head in range(s.n_heads):
                self.tabs.addTab(head_page(), f"head {head + 1}")
                if s.kv_heads != s.n_heads:
                    self.tabs.setTabToolTip(head, f"reads KV head {s.kv_head_of(head) + 1}")
            current = min(self.view_state.head, s.n_heads - 1)
            self.tabs.setCurrentIndex(current)
            self._build_tab(current)
            self.tabs.blockSignals(False)
        self.grids[("W_O", None)], self.grids[("b_O", None)] = self.w_o, self.b_o
        self.tabs.setEnabled(s.settings.projections)
        self.w_o.setEnabled(s.settings.projections)
        self.b_o.setEnabled(s.settings.projections)
        self.b_o.setVisible(self.biases.isChecked())
        self.b_o_label.setVisible(self.biases.isChecked())

    def _resize(self, what: str, value: int) -> None:
        s = self.doc.scenario
        if value == (s.n_heads if what == "heads" else s.d_k):
            return
        refusal = self.doc.change(lambda s: resized(s, **{what: value}), f"Set {what} to {value}")
        self.message.emit(refusal)  # '' clears an earlier refusal
        if refusal:
            self.sync()

    def _set_kv_heads(self, value: int) -> None:
        s = self.doc.scenario
        if value == s.kv_heads:
            return
        if s.n_heads % value:
            divisors = [g for g in range(1, s.n_heads + 1) if s.n_heads % g == 0]
            self.message.emit(
                f"KV heads: {value} does not divide {s.n_heads} heads; "
                f"choose one of {', '.join(map(str, divisors))}"
            )
            set_quietly(self.kv_heads, s.kv_heads)
            return
        refusal = self.doc.change(lambda s: with_kv_heads(s, value), f"Set KV heads to {value}")
        self.message.emit(refusal)
        if refusal:
            self.sync()
