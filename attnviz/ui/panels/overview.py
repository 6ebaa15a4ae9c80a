"""Overview dock: every layer × every head of the imported model, as small weight maps.

The maps come from the one run of the model made at import (off the UI thread), or from
a file of layers, all on the same 0–1 scale. Clicking one shows that layer (held, or
imported) and that head; the current layer and head are framed. A file of attention
weights only is shown here, to look at: a click enlarges a map, nothing can be edited.
One painted widget, not a widget per map: a 32 × 32 model has 1,024 of them.
"""

from __future__ import annotations

import numpy as np
from PySide6.QtCore import QPoint, QRect, QSize, Qt, Signal
from PySide6.QtGui import QColor, QImage, QMouseEvent, QPainter, QPaintEvent, QPen
from PySide6.QtWidgets import QLabel, QPushButton, QSizePolicy, QVBoxLayout, QWidget

from attnviz.core.figures import colors
from attnviz.core.figures.figure import HeatmapSpec
from attnviz.core.layers import Layers, spans
from attnviz.ui.heatmap import HeatmapView
from attnviz.ui.heatmap_parts import image_over
from attnviz.ui.panels.common import LayerImports
from attnviz.ui.workspace import Workspace

MARGIN_LEFT, MARGIN_TOP, GAP = 46, 22, 4
FRAME = QColor("#ff7f00")


class OverviewGrid(QWidget):
    """The maps, a row per layer and a column per head; click to pick one."""

    picked = Signal(int, int)  # layer, head

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.images: list[list[QImage]] = []
        self.rows: tuple[int, ...] = ()  # the layer number of each row
        self.current: tuple[int, int] | None = None
        self.cell = 48
        self.setMouseTracking(True)
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Fixed)

    def set_maps(self, maps: np.ndarray | None, rows: tuple[int, ...] | None = None) -> None:
        """maps: (layers, heads, n, n) weights, or None; rows: each row's layer number
        (0, 1, … by default)."""
        self.images = []
        self.rows = tuple(range(len(maps))) if rows is None and maps is not None else rows or ()
        if maps is not None:
            self._pixels = colors.argb(maps, "sequential", (0.0, 1.0))  # the images' memory
            self.images = [
                [image_over(self._pixels[layer, head], RGB32) for head in range(maps.shape[1])]
                for layer in range(maps.shape[0])
            ]
        self.updateGeometry()
        self.update()

    def set_current(self, current: tuple[int, int] | None) -> None:
        self.current = current
        self.update()

    def _shape(self) -> tuple[int, int]:
        return (len(self.images), len(self.images[0])) if self.images else (0, 0)

    def sizeHint(self) -> QSize:
        layers, heads = self._shape()
        step = self.cell + GAP
        return QSize(MARGIN_LEFT + heads * step, MARGIN_TOP + layers * step)

    def resizeEvent(self, event: object) -> None:
        heads = self._shape()[1]
        if heads:
            fit = (self.width() - MARGIN_LEFT) // heads - GAP
            cell = int(np.clip(fit, 12, 96))
            if cell != self.cell:
                self.cell = cell
                self.updateGeometry()
        super().resizeEvent(event)  # type: ignore[arg-type]

    def _rect(self, layer: int, head: int) -> QRect:
        step = self.cell + GAP
        return QRect(MARGIN_LEFT + head * step, MARGIN_TOP + layer * step, self.cell, self.cell)

    def at(self, pos: QPoint) -> tuple[int, int] | None:
        layers, heads = self._shape()
        step = self.cell + GAP
        head, layer = (pos.x() - MARGIN_LEFT) // step, (pos.y() - MARGIN_TOP) // step
        if 0 <= layer < layers and 0 <= head < heads and self._rect(layer, head).contains(pos):
            return layer, head
        return None

    def paintEvent(self, event: QPaintEvent) -> None:
        painter = QPainter(self)
        painter.setRenderHint(QPainter.RenderHint.SmoothPixmapTransform, False)
        painter.setPen(QColor("#222222"))
        layers, heads = self._shape()
        step = self.cell + GAP
        every = max(1, 28 // step + (1 if 28 % step else 0))  # head numbers that fit
        for head in range(0, heads, every):
            box = QRect(MARGIN_LEFT + head * step, 0, self.cell, MARGIN_TOP - 4)
            painter.drawText(
                box, Qt.AlignmentFlag.AlignCenter | Qt.AlignmentFlag.AlignBottom, f"H{head + 1}"
            )
        for layer in range(layers):
            box = QRect(0, MARGIN_TOP + layer * step, MARGIN_LEFT - 6, self.cell)
            painter.drawText(
                box,
                Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter,
                f"L{self.rows[layer]}",
            )
            for head in range(heads):
                painter.drawImage(self._rect(layer, head), self.images[layer][head])
        current = self.current
        if current is not None and current[0] in self.rows and current[1] < heads:
            painter.setPen(QPen(FRAME, 3))
            row = self.rows.index(current[0])
            painter.drawRect(self._rect(row, current[1]).adjusted(-2, -2, 1, 1))
        painter.end()

    def mouseMoveEvent(self, event: QMouseEvent) -> None:
        spot = self.at(event.position().toPoint())
        self.setToolTip(
            f"layer {self.rows[spot[0]]}, head {spot[1] + 1}: click to show it" if spot else ""
        )
        self.setCursor(Qt.CursorShape.PointingHandCursor if spot else Qt.CursorShape.ArrowCursor)

    def mousePressEvent(self, event: QMouseEvent) -> None:
        spot = self.at(event.position().toPoint())
        if spot is not None and event.button() == Qt.MouseButton.LeftButton:
            self.picked.emit(self.rows[spot[0]], spot[1])


RGB32 = QImage.Format.Format_RGB32


class OverviewPanel(QWidget):
    """Every layer and head of the last import; click one to load it."""

    def __init__(self, ws: Workspace, imports: LayerImports, parent: QWidget | None = None):
        super().__init__(parent)
        self.doc, self.view_state, self.imports = ws.doc, ws.view_state, imports
        self.note = QLabel()
        self.note.setWordWrap(True)
        self.grid = OverviewGrid()
        self.grid.picked.connect(self._picked)
        self.import_button = QPushButton("Import Model Layer…")
        self.import_button.setToolTip("File → Import Model Layer… (Ctrl+Shift+I)")
        self.import_button.clicked.connect(imports.open_dialog)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addWidget(self.note)
        layout.addWidget(self.import_button, 0, Qt.AlignmentFlag.AlignLeft)
        layout.addWidget(self.grid)
        self.enlarged = HeatmapView("overview head")  # a weights-only file's picked map
        self.enlarged.setMinimumHeight(260)
        self.enlarged.square_cells = True
        self.enlarged.setVisible(False)
        layout.addWidget(self.enlarged)
        layout.addStretch(1)
        self._maps: np.ndarray | None = None
        self._looking: tuple[int, int] | None = None  # the weights-only map enlarged
        imports.overviewChanged.connect(self._refresh)
        ws.doc.scenarioChanged.connect(self._refresh)
        ws.view_state.headChanged.connect(lambda _: self._mark())
        self._refresh()

    def _refresh(self) -> None:
        stack = self.imports.looked
        if stack is not None and stack.weights_only:
            self._show_weights_only(stack)
            return
        self.enlarged.setVisible(False)
        p = self.doc.scenario.provenance
        same = p is not None and self.imports.overview_source == (p.source, p.text, p.layers)
        maps = self.imports.overview if same else None
        if p is None:
            note = (
                "Import a model layer (File → Import Model Layer…) to see every layer and head "
                "of the model on your text."
            )
        elif maps is None:
            note = (
                "The overview comes from the model's run at import: import a layer of this "
                "model (or step to another layer) to see it."
            )
        else:
            note = (
                f"{p.source} on “{p.text[:80]}”: the attention weights of every layer (rows) "
                f"and head (columns), all on the same 0–1 scale (pale 0, dark blue 1), from the "
                "model's own run. Click a map to show that layer and head (a layer held from the "
                "same run opens at once; another is imported)."
            )
        self.note.setText(note)
        self.import_button.setVisible(maps is None)
        if maps is not self._maps:  # colour the maps once per import, not on every edit
            self._maps = maps
            self.grid.set_maps(maps)
        self._mark()

    def _show_weights_only(self, stack: Layers) -> None:
        run = stack.run
        maps = stack.every_layer()
        rows = None
        if maps is None:  # only some layers, and no overview of the rest
            maps, rows = np.stack([w for w in stack.weights]), stack.stored
        self.note.setText(
            f"{self.imports.looked_name}: the attention weights of layers {spans(stack.stored)} "
            f"of {run.source} ({run.model_type}) on “{run.text[:80]}”, saved without the "
            "layers' matrices (--weights-only): a file to look at, not edit. Click a map to "
            "enlarge it; import the model's layers to edit one."
        )
        self.import_button.setVisible(False)
        if maps is not self._maps:
            self._maps = maps
            self.grid.set_maps(maps.astype(np.float32, copy=False), rows)
            first = (stack.stored[0], 0)
            spots = [(k, h) for k in (rows or range(len(maps))) for h in range(maps.shape[1])]
            self.picked_map(*(self._looking if self._looking in spots else first))
        self.grid.set_current(self._looking)

    def picked_map(self, layer: int, head: int) -> None:
        """Enlarge a weights-only file's map (layer, head)."""
        stack = self.imports.looked
        if stack is None or not stack.weights_only:
            return
        maps = stack.every_layer()
        if maps is not None:  # every layer of the run, the stored ones among them
            weights = maps[layer, head]
        elif layer in stack.stored:
            weights = stack.weights[stack.index(layer)][head]
        else:
            return
        self._looking = (layer, head)
        tokens = stack.run.tokens
        self.enlarged.set_spec(
            HeatmapSpec(
                f"layer {layer}, head {head + 1}: the model's attention weights (float32)",
                weights.astype(np.float64),
                tokens,
                tokens,
                "query",
                "key",
                "sequential",
                (0.0, 1.0),
                caption=f"L{layer} H{head + 1} weights",
            )
        )
        self.enlarged.setVisible(True)
        self.grid.set_current(self._looking)

    def _mark(self) -> None:
        stack = self.imports.looked
        if stack is not None and stack.weights_only:
            self.grid.set_current(self._looking)
            return
        p = self.doc.scenario.provenance
        self.grid.set_current(None if p is None else (p.layer, self.view_state.head))

    def _picked(self, layer: int, head: int) -> None:
        stack = self.imports.looked
        if stack is not None and stack.weights_only:
            self.picked_map(layer, head)
            return
        p = self.doc.scenario.provenance
        if p is not None and layer == p.layer:
            self.view_state.set_head(head)
            return
        self.imports.load_layer(layer, head)
