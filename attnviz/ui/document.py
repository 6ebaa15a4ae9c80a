"""The document as the window sees it: the session (attnviz.core.session) with Qt signals
and the window's undo stack.

Every change goes through ``push`` (a session command, wrapped for the QUndoStack);
the session tells the document, which emits ``cellsChanged``, ``scenarioChanged`` or
``pathChanged``. The compute service and the views follow those signals.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QObject, Signal
from PySide6.QtGui import QUndoStack

from attnviz.core.maths.scenario import Scenario, ScenarioError
from attnviz.core.session import (
    UNTITLED,
    Change,
    Command,
    LoadScenario,
    ReplaceScenario,
    Session,
)
from attnviz.ui.commands import UndoCommand


class Document(QObject):
    """One scenario being edited: the session, its undo stack and their signals."""

    scenarioChanged = Signal()  # the shape or anything beyond a few cells changed
    cellsChanged = Signal(str, object, int, int, int, int)  # name, head, row, col, rows, cols
    pathChanged = Signal()

    def __init__(self, scenario: Scenario | None = None, parent: QObject | None = None):
        super().__init__(parent)
        self.session = Session(scenario)
        self.undo_stack = QUndoStack(self)
        self.session.subscribe(self._on_change)
        self._before_edit: list[Callable[[], None]] = []

    def before_edit(self, hook: Callable[[], None]) -> None:
        """Call hook before every edit goes on the undo stack (a training run pauses)."""
        self._before_edit.append(hook)

    @property
    def scenario(self) -> Scenario:
        return self.session.scenario

    @property
    def path(self) -> Path | None:
        return self.session.path

    @property
    def name(self) -> str:
        """The file's name, or what the document is called while it has none."""
        return self.path.name if self.path else self.session.untitled

    @property
    def n_heads(self) -> int:
        """Heads in the result: 1 with projections off."""
        s = self.scenario
        return s.n_heads if s.settings.projections else 1

    def _on_change(self, change: Change) -> None:
        if change.kind == "cells":
            c = change
            self.cellsChanged.emit(c.name, c.head, c.row, c.col, c.rows, c.cols)
        elif change.kind == "scenario":
            self.scenarioChanged.emit()
        else:
            self.pathChanged.emit()

    # Edits ---------------------------------------------------------------------------

    def push(self, command: Command) -> None:
        """Do command as one undoable step."""
        for hook in self._before_edit:
            hook()
        self.undo_stack.push(UndoCommand(self.session, command))

    def change(self, make: Callable[[Scenario], Scenario], text: str) -> str:
        """Replace the scenario by make(scenario) as one undoable step: '' when done, or
        why it was refused (nothing changes then)."""
        try:
            new = make(self.scenario)
        except ScenarioError as e:
            return f"{e}; nothing was changed"
        self.push(ReplaceScenario(self.session, new, text))
        return ""

    def replace(self, new: Scenario, text: str) -> None:
        """Replace the scenario by new as one undoable step."""
        self.push(ReplaceScenario(self.session, new, text))

    def load(
        self, scenario: Scenario, path: Path | None, text: str, untitled: str = UNTITLED
    ) -> None:
        """Open a scenario (from path, or untitled) as one undoable step."""
        self.push(LoadScenario(self.session, scenario, path, text, untitled))

    def start_from(self, scenario: Scenario, text: str, untitled: str) -> None:
        """Replace the whole scenario by one that is not the user's work (a lesson stage, a
        preset) as one undoable step. The document becomes untitled, so Save asks for a
        name and never writes over the file the user's work came from; it stays unsaved
        if it was (closing still offers to save), else it starts clean."""
        was_clean = self.undo_stack.isClean()
        self.load(scenario, None, text, untitled)
        if was_clean:
            self.undo_stack.setClean()

    def reset(self, scenario: Scenario, path: Path | None) -> None:
        """Start over on a scenario with no undo history (restoring autosaved work)."""
        self.undo_stack.clear()
        self.session.set_scenario(scenario)
        self.session.untitled = UNTITLED
        self.session.set_path(path)
        self.undo_stack.setClean()

    def set_path(self, path: Path | None, clean: bool = True) -> None:
        """The file the document is saved in; clean marks the current state as saved."""
        if clean:
            self.undo_stack.setClean()
        self.session.set_path(path)
