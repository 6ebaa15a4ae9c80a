"""QUndoCommand adapters over the session's commands (attnviz.core.session).

The window's history lives on a QUndoStack (for Edit → Undo, the clean state and merged
typing); each entry only forwards to a plain command, which does the work.
"""

from __future__ import annotations

from PySide6.QtGui import QUndoCommand

from attnviz.core.session import Command, Session, SetCells

SET_CELL_ID = 1  # single-cell edits of the same cell merge; whole-scenario swaps never do


class UndoCommand(QUndoCommand):
    """One session command on a QUndoStack."""

    def __init__(self, session: Session, command: Command):
        super().__init__(command.text)
        self.session, self.command = session, command

    def id(self) -> int:
        return SET_CELL_ID if isinstance(self.command, SetCells) else -1

    def mergeWith(self, other: QUndoCommand) -> bool:
        return isinstance(other, UndoCommand) and self.command.merge(other.command)

    def redo(self) -> None:
        self.command.do(self.session)

    def undo(self) -> None:
        self.command.undo(self.session)
