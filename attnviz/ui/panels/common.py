"""Small widgets the panels share."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtWidgets import QSpinBox, QWidget

from attnviz.core.scenario import Scenario, ScenarioError
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
