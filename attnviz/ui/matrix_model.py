"""A table model over one editable matrix of the document (X, X_kv, a head's weights,
biases or norm weights, W_O, b_O, the custom mask).

Edits go through commands on the document's undo stack; the model only reports the
document's changes to its views (one ``dataChanged`` per edited rectangle). While the
gradients are shown, each cell's background is its gradient dL/d(cell) (blue negative,
red positive, white 0, on the matrix's own scale) and its tooltip gives the number.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np
from PySide6.QtCore import (
    QAbstractTableModel,
    QModelIndex,
    QObject,
    QPersistentModelIndex,
    Qt,
    Signal,
)
from PySide6.QtGui import QColor

from attnviz.core.figures.colors import light_tint
from attnviz.core.io.text import parse_number
from attnviz.core.maths.backward import Gradients
from attnviz.core.maths.scenario import KV_HEAD_NAMES, Scenario, ScenarioError, matrix_label
from attnviz.core.session import Command, Session, SetCells, matrix_title

Index = QModelIndex | QPersistentModelIndex
SEEN, HIDDEN = "#9ecae1", "#d9d9d9"  # custom mask cells: may attend (blue), hidden (grey)
_ROLE = Qt.ItemDataRole


class Editable(Protocol):
    """What a matrix model needs of the document (attnviz.ui.document.Document): the
    scenario, its session (commands are made against it), a way to push a command, and
    the two signals of its changes."""

    cellsChanged: Any  # name, head, row, col, rows, cols
    scenarioChanged: Any

    @property
    def scenario(self) -> Scenario: ...

    @property
    def session(self) -> Session: ...

    def push(self, command: Command) -> None: ...


class GradientFeed(Protocol):
    """Where the shown gradients come from (attnviz.ui.gradients.GradientSource): the
    newest (None while off) and a signal with each."""

    gradientsReady: Any  # Gradients or None
    gradients: Gradients | None


class MatrixModel(QAbstractTableModel):
    """Rows and columns of one scenario matrix; typed values become undoable edits."""

    refused = Signal(str)  # a message naming why an edit was refused
    edited = Signal()  # an edit went through (so an earlier refusal no longer applies)

    def __init__(
        self,
        doc: Editable,
        name: str,
        head: int | None = None,
        gradients: GradientFeed | None = None,
    ):
        super().__init__(doc if isinstance(doc, QObject) else None)
        self.doc, self.name, self.head = doc, name, head
        self._shape = self.matrix().shape
        self.gradient: np.ndarray | None = None  # dL/d this matrix, while shown
        self._top = 0.0  # its largest size: the colour scale
        doc.cellsChanged.connect(self._on_cells)
        doc.scenarioChanged.connect(self._on_scenario)
        if gradients is not None:
            gradients.gradientsReady.connect(self.set_gradients)
            self.set_gradients(gradients.gradients)

    @property
    def label(self) -> str:
        """The matrix as files and the core name it: ``heads[2].W_K``."""
        return matrix_label(self.name, self.head)

    @property
    def title(self) -> str:
        """The matrix as the window names it: ``head 2 W_K``."""
        return matrix_title(self.name, self.head)

    def matrix(self) -> np.ndarray:
        return self.doc.scenario.matrix(self.name, self.head)

    # Qt model interface ---------------------------------------------------------------

    def rowCount(self, parent: Index = QModelIndex()) -> int:  # noqa: B008
        return 0 if parent.isValid() else self._shape[0]

    def columnCount(self, parent: Index = QModelIndex()) -> int:  # noqa: B008
        return 0 if parent.isValid() else self._shape[1]

    def data(self, index: Index, role: int = _ROLE.DisplayRole) -> Any:
        if not index.isValid():
            return None
        if role in (_ROLE.DisplayRole, _ROLE.EditRole, _ROLE.ToolTipRole):
            try:
                value = float(self.matrix()[index.row(), index.column()])
            except (ScenarioError, IndexError):
                return None  # the matrix is gone (a paint queued before its grid went)
            if role == _ROLE.DisplayRole:
                return f"{value:.4g}"
            if role == _ROLE.ToolTipRole and self._shown_gradient() is not None:
                return f"{value!r}\n{self.gradient_text(index.row(), index.column())}"
            return repr(value)
        if role == _ROLE.TextAlignmentRole:
            return int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        grad = self._shown_gradient()
        if role == _ROLE.BackgroundRole and grad is not None:
            g = float(grad[index.row(), index.column()])
            return QColor(*light_tint(g / self._top if self._top > 0 else 0.0))
        if role == _ROLE.BackgroundRole and self.name == "mask_matrix":
            try:
                seen = self.matrix()[index.row(), index.column()] != 0
            except (ScenarioError, IndexError):
                return None
            return QColor(SEEN if seen else HIDDEN)
        return None

    # Gradients ---------------------------------------------------------------------------

    def set_gradients(self, g: Gradients | None) -> None:
        """Tint each cell by its gradient in g (None: the plain grid again)."""
        grad = None
        if g is not None:
            try:
                grad = np.asarray(g.matrix(self.name, self.head))
            except (KeyError, IndexError):
                grad = None  # (none for this matrix: the custom mask, projections off)
        self.gradient = grad
        finite = grad[np.isfinite(grad)] if grad is not None else np.zeros(0)
        self._top = float(np.abs(finite).max()) if finite.size else 0.0
        rows, cols = self._shape
        if rows and cols:
            roles = [_ROLE.BackgroundRole, _ROLE.ToolTipRole]
            self.dataChanged.emit(self.index(0, 0), self.index(rows - 1, cols - 1), roles)

    def _shown_gradient(self) -> np.ndarray | None:
        """The gradient, when it is of this matrix's present shape."""
        grad = self.gradient
        return grad if grad is not None and grad.shape == self._shape else None

    def gradient_text(self, row: int, col: int) -> str:
        """ "dL/dW_Q[2,1] = -0.0123456 (head 1)": a cell's gradient (rows and columns
        from 1)."""
        grad = self._shown_gradient()
        if grad is None:
            return ""
        where = ""
        if self.head is not None:
            s = self.doc.scenario
            if self.name in KV_HEAD_NAMES and s.kv_heads != s.n_heads:
                group = [h + 1 for h in range(s.n_heads) if s.kv_head_of(h) == self.head]
                where = f" (KV head {self.head + 1}, shared by heads {group[0]}–{group[-1]})"
            else:
                where = f" (head {self.head + 1})"
        g = float(grad[row, col])
        return f"dL/d{self.name}[{row + 1},{col + 1}] = {g!r}{where}"

    def headerData(
        self, section: int, orientation: Qt.Orientation, role: int = _ROLE.DisplayRole
    ) -> Any:
        if role not in (_ROLE.DisplayRole, _ROLE.ToolTipRole):
            return None
        if orientation == Qt.Orientation.Horizontal:
            keys = self.doc.scenario.key_tokens
            if self.name == "mask_matrix" and section < len(keys):
                return keys[section]
            return str(section + 1)
        if self.name in ("X", "X_kv", "target"):
            s = self.doc.scenario
            tokens = s.key_tokens if self.name == "X_kv" else s.tokens
            return tokens[section] if section < len(tokens) else None
        if self.name == "mask_matrix":
            return self.doc.scenario.tokens[section] if section < self.doc.scenario.n else None
        if self.name in ("b_Q", "b_K", "b_V", "b_O", "q_norm", "k_norm"):
            # named by the caption above the row; a wide label would shift its columns
            return self.title if role == _ROLE.ToolTipRole else ""
        if self.name == "W_O":
            head, k = divmod(section, self.doc.scenario.d_k)
            return f"h{head + 1}·{k + 1}"
        return str(section + 1)

    def flags(self, index: Index) -> Qt.ItemFlag:
        if not index.isValid():
            return Qt.ItemFlag.NoItemFlags
        return Qt.ItemFlag.ItemIsEnabled | Qt.ItemFlag.ItemIsSelectable | Qt.ItemFlag.ItemIsEditable

    def setData(self, index: Index, value: Any, role: int = _ROLE.EditRole) -> bool:
        if role != _ROLE.EditRole or not index.isValid():
            return False
        row, col = index.row(), index.column()
        try:
            number = parse_number(str(value))
        except ValueError as e:
            self.refused.emit(f"{self.title}[{row + 1},{col + 1}]: {e}; the cell keeps its value")
            return False
        if number == float(self.matrix()[row, col]):
            return True
        return self.set_block(row, col, np.array([[number]]))

    # Edits ----------------------------------------------------------------------------

    def set_block(self, row: int, col: int, values: np.ndarray, text: str = "") -> bool:
        """Push one undoable edit of a rectangle; refuse (with a message) if it does not fit."""
        try:
            command = SetCells(self.doc.session, self.name, self.head, row, col, values, text)
        except ScenarioError as e:
            self.refused.emit(f"{str(e).replace(self.label, self.title)}; nothing was changed")
            return False
        self.doc.push(command)
        self.edited.emit()
        return True

    # Document -> views ------------------------------------------------------------------

    def _on_cells(
        self, name: str, head: int | None, row: int, col: int, rows: int, cols: int
    ) -> None:
        if name == self.name and head == self.head:
            self.dataChanged.emit(self.index(row, col), self.index(row + rows - 1, col + cols - 1))

    def _on_scenario(self) -> None:
        try:
            shape = self.matrix().shape
        except ScenarioError:
            return  # this head or matrix is gone; its panel drops the model
        if shape != self._shape:
            self.beginResetModel()
            self._shape = shape
            self.endResetModel()
        else:
            self.dataChanged.emit(self.index(0, 0), self.index(shape[0] - 1, shape[1] - 1))
            self.headerDataChanged.emit(Qt.Orientation.Vertical, 0, shape[0] - 1)
