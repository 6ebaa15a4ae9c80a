"""Small widgets the panels share."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import QTimer
from PySide6.QtGui import QShowEvent
from PySide6.QtWidgets import QSpinBox, QWidget

from attnviz.core.maths.engine import Result
from attnviz.core.maths.scenario import Scenario, ScenarioError
from attnviz.ui.commands import ReplaceScenario
from attnviz.ui.document import Document


def size_spin(low: int, high: int, tip: str, parent: QWidget | None = None) -> QSpinBox:
    """A spin box that reports a value once it is committed (Enter, focus out, arrows)."""
    spin = QSpinBox(parent)
    spin.setRange(low, high)
    spin.setKeyboardTracking(False)
    spin.setToolTip(tip)
    return spin


def set_quietly(spin: QSpinBox, value: int) -> None:
    """Show a value from the document without echoing it back as an edit."""
    spin.blockSignals(True)
    spin.setValue(value)
    spin.blockSignals(False)


def push_change(doc: Document, make: Callable[[Scenario], Scenario], text: str) -> str:
    """Apply make to the scenario as one undoable step; '' or why it was refused."""
    try:
        new = make(doc.scenario)
    except ScenarioError as e:
        return f"{e}; nothing was changed"
    doc.undo_stack.push(ReplaceScenario(doc, new, text))
    return ""


class ResultPanel(QWidget):
    """A panel drawn from complete results only, and only while it is on screen.

    Subclasses implement ``show_result``; a result that arrives while the panel is hidden
    (a closed dock, a tab behind another) is drawn when the panel is shown again.
    """

    def __init__(self, doc: Document, parent: QWidget | None = None):
        super().__init__(parent)
        self.doc = doc
        self._stale = True
        doc.resultChanged.connect(self._on_result)

    def show_result(self, result: Result) -> None:
        raise NotImplementedError

    def redraw(self) -> None:
        """Draw the document's latest result now (if on screen) or when shown."""
        self._stale = True
        if self.isVisible() and self.doc.result.complete:
            self._stale = False
            self.show_result(self.doc.result)

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
