"""Inputs dock: token labels and the X grid; add, remove, move and rename tokens; d_model."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QHBoxLayout,
    QInputDialog,
    QLabel,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from attnviz.core.maths.scenario import (
    LIMITS,
    Scenario,
    insert_token,
    move_token,
    remove_token,
    resized,
)
from attnviz.ui.grid import MatrixGrid
from attnviz.ui.matrix_model import MatrixModel
from attnviz.ui.panels.common import int_spin, set_quietly
from attnviz.ui.workspace import Workspace


class InputsPanel(QWidget):
    message = Signal(str)

    def __init__(self, ws: Workspace, parent: QWidget | None = None):
        super().__init__(parent)
        self.doc, self.view_state, self.compute = ws.doc, ws.view_state, ws.compute
        self.model = MatrixModel(ws.doc, "X")
        self.grid = MatrixGrid(self.model)
        self.grid.message.connect(self.message)
        self.grid.verticalHeader().sectionDoubleClicked.connect(self.rename)
        self.grid.verticalHeader().setToolTip("Double-click a token to rename it")

        bar = QHBoxLayout()
        for text, tip, slot in (
            ("+", "Add a token after the current one", self.add),
            ("−", "Remove the current token", self.remove),
            ("↑", "Move the current token up", lambda: self.move_token(-1)),
            ("↓", "Move the current token down", lambda: self.move_token(1)),
            ("Rename…", "Rename the current token", lambda: self.rename(self._current())),
        ):
            button = QToolButton()
            button.setText(text)
            button.setToolTip(tip)
            button.clicked.connect(slot)
            bar.addWidget(button)
        bar.addStretch(1)
        bar.addWidget(QLabel("d_model"))
        self.d_model = int_spin(1, LIMITS.d_model, "Width of each token vector")
        self.d_model.valueChanged.connect(self.set_d_model)
        bar.addWidget(self.d_model)

        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addLayout(bar)
        layout.addWidget(self.grid)
        ws.doc.scenarioChanged.connect(self.sync)
        self.sync()

    def sync(self) -> None:
        set_quietly(self.d_model, self.doc.scenario.d_model)

    def _current(self) -> int:
        index = self.grid.currentIndex()
        return index.row() if index.isValid() else self.doc.scenario.n - 1

    def _replace(self, make: Callable[[Scenario], Scenario], text: str) -> None:
        self.message.emit(self.doc.change(make, text))  # '' clears an earlier refusal

    def add(self) -> None:
        at = self._current() + 1
        self._replace(lambda s: insert_token(s, at), "Add token")
        self.grid.setCurrentIndex(self.model.index(at, 0))

    def remove(self) -> None:
        at = self._current()
        self._replace(lambda s: remove_token(s, at), "Remove token")

    def move_token(self, step: int) -> None:
        at = self._current()
        to = at + step
        if 0 <= to < self.doc.scenario.n:
            self._replace(lambda s: move_token(s, at, to), "Move token")
            self.grid.setCurrentIndex(
                self.model.index(to, max(0, self.grid.currentIndex().column()))
            )

    def rename(self, row: int) -> None:
        tokens = list(self.doc.scenario.tokens)
        if not 0 <= row < len(tokens):
            return
        text, ok = QInputDialog.getText(self, "Rename token", f"Token {row + 1}:", text=tokens[row])
        if ok and text != tokens[row]:
            tokens[row] = text
            self._replace(lambda s: s.with_tokens(tokens), "Rename token")

    def set_d_model(self, value: int) -> None:
        if value != self.doc.scenario.d_model:
            self._replace(lambda s: resized(s, d_model=value), f"Set d_model to {value}")
