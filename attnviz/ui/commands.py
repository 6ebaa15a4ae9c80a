"""Undoable edits of a Document: every change to the scenario is one of these."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from PySide6.QtGui import QUndoCommand

from attnviz.core.maths.scenario import WEIGHT_NAMES, Scenario

if TYPE_CHECKING:
    from attnviz.ui.document import Document

SET_CELL_ID = 1


class SetCells(QUndoCommand):
    """Set a rectangle of one matrix; repeated edits of the same single cell merge."""

    def __init__(
        self,
        doc: Document,
        name: str,
        head: int | None,
        row: int,
        col: int,
        values: np.ndarray,
        text: str = "",
    ):
        values = np.atleast_2d(np.asarray(values, dtype=np.float64))
        rows, cols = values.shape
        super().__init__(text or _describe(name, head, row, col, rows, cols))
        self.doc, self.name, self.head, self.row, self.col = doc, name, head, row, col
        self.new = values
        self.old = np.array(doc.scenario.matrix(name, head)[row : row + rows, col : col + cols])
        doc.scenario.with_cells(name, head, row, col, values)  # raises now: never a bad command

    def id(self) -> int:
        return SET_CELL_ID

    def mergeWith(self, other: QUndoCommand) -> bool:
        if not isinstance(other, SetCells) or self.new.shape != (1, 1) or other.new.shape != (1, 1):
            return False
        if (self.name, self.head, self.row, self.col) != (
            other.name,
            other.head,
            other.row,
            other.col,
        ):
            return False
        self.new = other.new
        return True

    def redo(self) -> None:
        self.doc.set_cells(self.name, self.head, self.row, self.col, self.new)

    def undo(self) -> None:
        self.doc.set_cells(self.name, self.head, self.row, self.col, self.old)


class ReplaceScenario(QUndoCommand):
    """Any other change (resize, tokens, a setting, a preset, a load): swap whole scenarios.

    Unchanged matrices are shared between the two scenarios, so this stays small.
    """

    def __init__(self, doc: Document, new: Scenario, text: str):
        super().__init__(text)
        self.doc, self.old, self.new = doc, doc.scenario, new

    def redo(self) -> None:
        self.doc.set_scenario(self.new)

    def undo(self) -> None:
        self.doc.set_scenario(self.old)


def matrix_title(name: str, head: int | None) -> str:
    """How the window names a matrix: ``head 2 W_K`` (heads from 1, as on the tabs), ``X``."""
    return f"head {head + 1} {name}" if name in WEIGHT_NAMES and head is not None else name


def _describe(name: str, head: int | None, row: int, col: int, rows: int, cols: int) -> str:
    where = matrix_title(name, head)
    if (rows, cols) == (1, 1):
        return f"Edit {where}[{row + 1},{col + 1}]"
    return f"Edit {rows}×{cols} cells of {where}"


class LoadScenario(QUndoCommand):
    """Open a file (or start a new scenario): the scenario and the file path change together."""

    def __init__(self, doc: Document, new: Scenario, path: Path | None, text: str):
        super().__init__(text)
        self.doc = doc
        self.old, self.old_path = doc.scenario, doc.path
        self.new, self.new_path = new, path

    def redo(self) -> None:
        self.doc.set_scenario(self.new)
        self.doc.set_path(self.new_path, clean=False)

    def undo(self) -> None:
        self.doc.set_scenario(self.old)
        self.doc.set_path(self.old_path, clean=False)
