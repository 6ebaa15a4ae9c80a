"""The open document without Qt: a scenario, its file path, and edits as commands.

Every change to the scenario is a command object with ``do`` and ``undo``; the session
applies it and tells its listeners what changed (a ``Change``). The window wraps each
command in a ``QUndoCommand`` (attnviz.ui.commands) and keeps its history on a
``QUndoStack``; a script or a test can replay edits with ``Session.apply``, ``undo``
and ``redo`` and no Qt at all.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from attnviz.core.maths.scenario import HEAD_NAMES, Scenario
from attnviz.core.presets import worked_example


@dataclass(frozen=True)
class Change:
    """What a session change touched: a rectangle of one matrix, the whole scenario, or
    the file path. ``head`` is 0-based (None for X and W_O)."""

    kind: str  # "cells", "scenario" or "path"
    name: str = ""
    head: int | None = None
    row: int = 0
    col: int = 0
    rows: int = 0
    cols: int = 0


class Command:
    """An undoable change of a session; ``text`` names it in Edit → Undo."""

    text = ""

    def do(self, session: Session) -> None:
        raise NotImplementedError

    def undo(self, session: Session) -> None:
        raise NotImplementedError

    def merge(self, other: Command) -> bool:
        """Absorb other, the next command, into this one if they are one edit (typing
        into the same cell again); True when merged."""
        return False


def matrix_title(name: str, head: int | None) -> str:
    """How the window names a matrix: ``head 2 W_K`` (heads from 1, as on the tabs), ``X``."""
    return f"head {head + 1} {name}" if name in HEAD_NAMES and head is not None else name


class SetCells(Command):
    """Set a rectangle of one matrix; repeated edits of the same single cell merge.

    Checked when made: a command that would make an invalid scenario raises
    ScenarioError here, so a bad command never reaches the history.
    """

    def __init__(
        self,
        session: Session,
        name: str,
        head: int | None,
        row: int,
        col: int,
        values: np.ndarray,
        text: str = "",
    ):
        values = np.atleast_2d(np.asarray(values, dtype=np.float64))
        rows, cols = values.shape
        self.name, self.head, self.row, self.col = name, head, row, col
        self.new = values
        current = session.scenario.matrix(name, head)
        self.old = np.array(current[row : row + rows, col : col + cols])
        session.scenario.check_cells(name, head, row, col, values)  # raises if invalid
        where = matrix_title(name, head)
        single = f"Edit {where}[{row + 1},{col + 1}]"
        self.text = text or (
            single if (rows, cols) == (1, 1) else f"Edit {rows}×{cols} cells of {where}"
        )

    def do(self, session: Session) -> None:
        session.set_cells(self.name, self.head, self.row, self.col, self.new)

    def undo(self, session: Session) -> None:
        session.set_cells(self.name, self.head, self.row, self.col, self.old)

    def merge(self, other: Command) -> bool:
        if not isinstance(other, SetCells) or self.new.shape != (1, 1) or other.new.shape != (1, 1):
            return False
        here = (self.name, self.head, self.row, self.col)
        if here != (other.name, other.head, other.row, other.col):
            return False
        self.new = other.new
        return True


class ReplaceScenario(Command):
    """Any other change (resize, tokens, a setting, a preset): swap whole scenarios.

    Unchanged matrices are shared between the two scenarios, so this stays small.
    """

    def __init__(self, session: Session, new: Scenario, text: str):
        self.old, self.new, self.text = session.scenario, new, text

    def do(self, session: Session) -> None:
        session.set_scenario(self.new)

    def undo(self, session: Session) -> None:
        session.set_scenario(self.old)


UNTITLED = "untitled"
_PROPOSED = re.compile(r"(.+\.attn\.(?:json|npz)) \([a-z ]+\)")


def untitled_name(file_name: str, origin: str) -> str:
    """What a document with no path is called: the file name Save As proposes and where
    the scenario came from, e.g. ``lesson-3.attn.json (lesson)``."""
    return f"{file_name} ({origin})"


def proposed_file_name(untitled: str) -> str | None:
    """The file name an ``untitled_name`` proposes; None for a plain "untitled"."""
    match = _PROPOSED.fullmatch(untitled)
    return match.group(1) if match else None


class LoadScenario(Command):
    """Open a file (or start a new scenario): the scenario and the path change together;
    ``untitled`` names a document with no path (an example's name)."""

    def __init__(
        self,
        session: Session,
        new: Scenario,
        path: Path | None,
        text: str,
        untitled: str = UNTITLED,
    ):
        self.old, self.old_path, self.old_untitled = (
            session.scenario,
            session.path,
            session.untitled,
        )
        self.new, self.new_path, self.new_untitled, self.text = new, path, untitled, text

    def do(self, session: Session) -> None:
        session.set_scenario(self.new)
        session.untitled = self.new_untitled
        session.set_path(self.new_path)

    def undo(self, session: Session) -> None:
        session.set_scenario(self.old)
        session.untitled = self.old_untitled
        session.set_path(self.old_path)


class Session:
    """One scenario being edited, the file it belongs to, and (for scripts) its history."""

    def __init__(self, scenario: Scenario | None = None, path: Path | None = None):
        self.scenario = scenario or worked_example()
        self.path = path
        self.untitled = UNTITLED  # what the document is called while it has no path
        self._listeners: list[Callable[[Change], None]] = []
        self._done: list[Command] = []
        self._undone: list[Command] = []

    def subscribe(self, listener: Callable[[Change], None]) -> None:
        """Call listener(change) after every change."""
        self._listeners.append(listener)

    def _tell(self, change: Change) -> None:
        for listener in self._listeners:
            listener(change)

    # What commands call ---------------------------------------------------------------

    def set_cells(
        self, name: str, head: int | None, row: int, col: int, values: np.ndarray
    ) -> None:
        values = np.atleast_2d(values)
        self.scenario = self.scenario.with_cells(name, head, row, col, values)
        self._tell(Change("cells", name, head, row, col, *values.shape))

    def set_scenario(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self._tell(Change("scenario"))

    def set_path(self, path: Path | None) -> None:
        self.path = path
        self._tell(Change("path"))

    # A history without Qt ------------------------------------------------------------

    def apply(self, command: Command) -> None:
        """Do command and record it (merged into the last one when it continues it)."""
        command.do(self)
        if not (self._done and not self._undone and self._done[-1].merge(command)):
            self._done.append(command)
        self._undone.clear()

    def undo(self) -> bool:
        """Undo the last command; False when there is none."""
        if not self._done:
            return False
        command = self._done.pop()
        command.undo(self)
        self._undone.append(command)
        return True

    def redo(self) -> bool:
        """Redo the last undone command; False when there is none."""
        if not self._undone:
            return False
        command = self._undone.pop()
        command.do(self)
        self._done.append(command)
        return True


class SwapScenario(Command):
    """Go from one given scenario to another: a training run, recorded once it has run
    (the session already holds ``new`` then, and doing it again changes nothing)."""

    def __init__(self, old: Scenario, new: Scenario, text: str):
        self.old, self.new, self.text = old, new, text

    def do(self, session: Session) -> None:
        if session.scenario is not self.new:
            session.set_scenario(self.new)

    def undo(self, session: Session) -> None:
        session.set_scenario(self.old)
