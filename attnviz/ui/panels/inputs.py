"""Inputs dock: token labels and the X grid; add, remove, move and rename tokens; d_model;
cross-attention's own key/value tokens and X_kv."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QGroupBox,
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
    with_cross_attention,
)
from attnviz.ui.grid import MatrixGrid
from attnviz.ui.matrix_model import MatrixModel
from attnviz.ui.panels.common import int_spin, set_quietly
from attnviz.ui.workspace import Workspace


class InputsPanel(QWidget):
    message = Signal(str)
    cellPicked = Signal(str, object, int, int)  # matrix, head, row, col: a cell clicked

    def __init__(self, ws: Workspace, parent: QWidget | None = None):
        super().__init__(parent)
        self.doc, self.view_state, self.compute = ws.doc, ws.view_state, ws.compute
        self.source = ws.gradients  # the grids tint their cells by their gradients while shown
        self.model = MatrixModel(ws.doc, "X", gradients=ws.gradients)
        self.grid = MatrixGrid(self.model)
        self.grid.message.connect(self.message)
        self.grid.picked.connect(lambda r, c: self.cellPicked.emit("X", None, r, c))
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

        self.cross = QCheckBox("Cross-attention: keys and values from their own tokens")
        self.cross.setToolTip(
            "On: K and V come from X_kv (m tokens of their own, as from an encoder); "
            "Q still comes from X. Off: every token is a query and a key."
        )
        self.cross.toggled.connect(self.set_cross)
        self.kv_box = QGroupBox("Keys and values: X_kv (m × d_model)")
        kv_bar = QHBoxLayout()
        kv_bar.addWidget(QLabel("key tokens m"))
        self.m = int_spin(1, LIMITS.tokens, "How many key/value tokens")
        self.m.valueChanged.connect(self.set_m)
        kv_bar.addWidget(self.m)
        kv_bar.addStretch(1)
        kv_layout = QVBoxLayout(self.kv_box)
        kv_layout.setContentsMargins(4, 4, 4, 4)
        kv_layout.addLayout(kv_bar)
        self.kv_grid: MatrixGrid | None = None
        self.target_box = QGroupBox("Target T of the loss ½‖final − T‖² (n × d_model)")
        self.target_box.setToolTip(
            "The output the loss asks for (View → Loss → Target: your own grid T); it starts "
            "as each row the previous token's row of X"
        )
        QVBoxLayout(self.target_box).setContentsMargins(4, 4, 4, 4)
        self.target_grid: MatrixGrid | None = None

        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addLayout(bar)
        layout.addWidget(self.grid, 2)
        layout.addWidget(self.cross)
        layout.addWidget(self.kv_box, 1)
        layout.addWidget(self.target_box, 1)
        ws.doc.scenarioChanged.connect(self.sync)
        self.sync()

    def sync(self) -> None:
        s = self.doc.scenario
        set_quietly(self.d_model, s.d_model)
        self.cross.blockSignals(True)
        self.cross.setChecked(s.cross)
        self.cross.blockSignals(False)
        self.kv_box.setVisible(s.cross)
        set_quietly(self.m, s.m)
        if s.cross and self.kv_grid is None:
            self.kv_grid = MatrixGrid(MatrixModel(self.doc, "X_kv", gradients=self.source))
            self.kv_grid.setObjectName("grid-X_kv")
            self.kv_grid.message.connect(self.message)
            self.kv_grid.picked.connect(lambda r, c: self.cellPicked.emit("X_kv", None, r, c))
            self.kv_grid.verticalHeader().sectionDoubleClicked.connect(self.rename_key)
            self.kv_grid.verticalHeader().setToolTip("Double-click a key token to rename it")
            layout = self.kv_box.layout()
            assert layout is not None
            layout.addWidget(self.kv_grid)
        elif not s.cross and self.kv_grid is not None:
            _drop(self.kv_grid)
            self.kv_grid = None
        self._sync_target(s)

    def _sync_target(self, s: Scenario) -> None:
        """The target's grid T while the loss is the target with a grid of its own."""
        shown = s.settings.loss == "target" and s.settings.loss_target == "custom"
        self.target_box.setVisible(shown)
        if shown and self.target_grid is None:
            self.target_grid = MatrixGrid(MatrixModel(self.doc, "target"))
            self.target_grid.setObjectName("grid-target")
            self.target_grid.message.connect(self.message)
            layout = self.target_box.layout()
            assert layout is not None
            layout.addWidget(self.target_grid)
        elif not shown and self.target_grid is not None:
            _drop(self.target_grid)
            self.target_grid = None
        # With T below X, the dock scrolls rather than squeeze either grid's rows away.
        for grid in (self.grid, self.target_grid):
            if grid is not None:
                rows = grid.verticalHeader().length() + grid.horizontalHeader().height()
                whole = (
                    rows + 2 * grid.frameWidth() + grid.horizontalScrollBar().sizeHint().height()
                )
                grid.setMinimumHeight(min(whole, 220) if shown else 0)
                grid.setMaximumHeight(whole if shown else 16777215)

    def set_cross(self, on: bool) -> None:
        text = "Cross-attention on" if on else "Cross-attention off"
        self._replace(lambda s: with_cross_attention(s, on), text)

    def set_m(self, value: int) -> None:
        if self.doc.scenario.cross and value != self.doc.scenario.m:
            self._replace(lambda s: resized(s, m=value), f"Set key tokens to {value}")

    def rename_key(self, row: int) -> None:
        s = self.doc.scenario
        keys = list(s.key_tokens)
        if not s.cross or not 0 <= row < len(keys):
            return
        text, ok = QInputDialog.getText(self, "Rename key token", f"Key {row + 1}:", text=keys[row])
        if ok and text != keys[row]:
            keys[row] = text
            self._replace(
                lambda s: dataclasses.replace(s, kv_tokens=tuple(keys)), "Rename key token"
            )

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


def _drop(grid: MatrixGrid) -> None:
    """Take a grid out of its panel, with its model."""
    grid.hide()
    grid.setParent(None)
    grid.model().deleteLater()
    grid.deleteLater()
