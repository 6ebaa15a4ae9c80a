"""Small widgets the panels share."""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np
from PySide6.QtCore import QTimer
from PySide6.QtGui import QPaintEvent
from PySide6.QtWidgets import QSpinBox, QWidget

from attnviz.core.maths.results import Result
from attnviz.ui.heatmap import on_screen
from attnviz.ui.workspace import Workspace


def int_spin(
    low: int,
    high: int,
    tip: str = "",
    value: int | None = None,
    separators: bool = False,
    commit_only: bool = True,
) -> QSpinBox:
    """The one way a panel asks for a whole number: a spin box limited to low..high (so
    nothing else can be typed), with thousands separators if asked; ``commit_only``
    reports a value once it is committed (Enter, focus out, arrows), not per keystroke."""
    spin = QSpinBox()
    spin.setRange(low, high)
    if value is not None:
        spin.setValue(value)
    spin.setGroupSeparatorShown(separators)
    spin.setKeyboardTracking(not commit_only)
    spin.setToolTip(tip)
    return spin


def set_quietly(spin: QSpinBox, value: int) -> None:
    """Show a value from the document without echoing it back as an edit."""
    spin.blockSignals(True)
    spin.setValue(value)
    spin.blockSignals(False)


class LayerImports(Protocol):
    """What the model panels ask of the window's model imports (attnviz.ui.model_import):
    the layer before or after, another layer, and the overview of every layer's heads."""

    overviewChanged: Any  # a signal, after each import with an overview
    overview: np.ndarray | None  # (layers, heads, n, n)
    overview_source: Any  # what the overview belongs to
    looked: Any  # a file of attention weights only (Layers) shown in the Overview, or None
    looked_name: str  # its file name

    def held(self) -> Any: ...  # the Layers held for the current scenario's run, or None

    def neighbour(self, delta: int) -> int | None: ...

    def step(self, delta: int) -> None: ...

    def load_layer(self, layer: int, head: int | None = None) -> None: ...

    def open_dialog(self) -> None: ...


class ScreenPanel(QWidget):
    """A panel drawn only while it is on screen: what arrives while it is not (a closed
    dock, a tab behind another) is drawn when it is shown again (``shown_again``, when
    its dock's tab is raised, before it paints; else once it paints)."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self._stale = True

    def redraw(self) -> None:
        """Draw the latest now if on screen, else when shown again."""
        raise NotImplementedError

    def shown_again(self) -> None:
        """Draw what arrived while the panel was off screen, if it is on screen now."""
        if self._stale and on_screen(self):
            self.redraw()

    def paintEvent(self, event: QPaintEvent) -> None:
        # Painted, so on screen: however it got there (shown at last, a dock reopened or
        # its tab clicked, a squeezed dock given room again), draw what it missed. Later,
        # not from inside the paint.
        if self._stale:
            QTimer.singleShot(0, self.shown_again)
        super().paintEvent(event)


class ResultPanel(ScreenPanel):
    """A ScreenPanel drawn from complete results (``show_result``, implemented by each)."""

    def __init__(self, ws: Workspace, parent: QWidget | None = None):
        super().__init__(parent)
        self.doc, self.view_state, self.compute = ws.doc, ws.view_state, ws.compute
        ws.compute.resultChanged.connect(lambda _: self.redraw())

    def show_result(self, result: Result) -> None:
        raise NotImplementedError

    def redraw(self) -> None:
        self._stale = not on_screen(self)
        if not self._stale:
            self.show_result(self.compute.result)
