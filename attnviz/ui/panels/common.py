"""Small widgets the panels share."""

from __future__ import annotations

from PySide6.QtCore import QTimer
from PySide6.QtGui import QShowEvent
from PySide6.QtWidgets import QSpinBox, QWidget

from attnviz.core.maths.engine import Result
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


class ResultPanel(QWidget):
    """A panel drawn from complete results only, and only while it is on screen.

    Subclasses implement ``show_result``; a result that arrives while the panel is hidden
    (a closed dock, a tab behind another) is drawn when the panel is shown again.
    """

    def __init__(self, ws: Workspace, parent: QWidget | None = None):
        super().__init__(parent)
        self.doc, self.view_state, self.compute = ws.doc, ws.view_state, ws.compute
        self._stale = True
        ws.compute.resultChanged.connect(self._on_result)

    def show_result(self, result: Result) -> None:
        raise NotImplementedError

    def redraw(self) -> None:
        """Draw the document's latest result now (if on screen) or when shown."""
        self._stale = True
        if self.isVisible() and self.compute.result.complete:
            self._stale = False
            self.show_result(self.compute.result)

    def _on_result(self, result: Result) -> None:
        if result.complete:
            self.redraw()

    def showEvent(self, event: QShowEvent) -> None:
        super().showEvent(event)
        if self._stale:
            # Later, not now: while the window first lays out its docks, panels bound for
            # a hidden tab are shown for a moment.
            QTimer.singleShot(0, self._redraw_if_stale)

    def _redraw_if_stale(self) -> None:
        if self._stale and self.isVisible():
            self.redraw()
