"""What the views show, apart from the scenario: the head, the selected cell, the engine."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from PySide6.QtCore import QObject, Signal

# The engines the views can show: name -> (torch dtype, or "" for NumPy; label).
ENGINES = {
    "numpy": ("", "NumPy float64"),
    "torch-float64": ("float64", "torch float64"),
    "torch-float32": ("float32", "torch float32"),
}


@dataclass(frozen=True)
class Selection:
    """The cell the user picked in some view; the Inspector explains it.

    ``mask`` is set when the view shows the scenario under another mask strategy than
    its own (the Masks comparison); heads are 0-based, None for layer-wide matrices.
    """

    view: str
    head: int | None
    row: int
    col: int
    mask: str | None = None

    def cell_in(
        self, view: str, head: int | None, mask: str | None = None
    ) -> tuple[int, int] | None:
        """(row, col) when this is a cell of that view, head and mask strategy, else None:
        the one rule for which heatmap outlines the selection."""
        if (self.view, self.head, self.mask) == (view, head, mask):
            return self.row, self.col
        return None


class ViewState(QObject):
    """The shown head (0-based), the selection and the engine, each with its signal.

    ``heads()`` gives how many heads there are now; the head is kept within them.
    """

    headChanged = Signal(int)
    selectionChanged = Signal(object)  # Selection or None
    engineChanged = Signal(str)
    gradientsChanged = Signal(bool)

    def __init__(self, heads: Callable[[], int], parent: QObject | None = None):
        super().__init__(parent)
        self._heads = heads
        self.head = 0
        self.selection: Selection | None = None
        self.engine = "numpy"
        self.gradients = False  # the views show each gradient beside its value

    def set_head(self, head: int) -> None:
        head = max(0, min(head, self._heads() - 1))
        if head != self.head:
            self.head = head
            self.headChanged.emit(head)

    def clamp_head(self) -> None:
        """Keep the head within the heads there are (after the scenario changed)."""
        self.set_head(self.head)

    def select(self, selection: Selection | None) -> None:
        self.selection = selection
        self.selectionChanged.emit(selection)

    def set_engine(self, engine: str) -> None:
        """ "numpy" (float64, the reference) or "torch-float64" / "torch-float32" (on CUDA
        when present); torch loads on first use."""
        if engine not in ENGINES:
            raise ValueError(f"engine {engine!r}: expected one of {', '.join(ENGINES)}")
        if engine != self.engine:
            self.engine = engine
            self.engineChanged.emit(engine)

    def set_gradients(self, on: bool) -> None:
        """Show the gradient of the scenario's loss beside each value (or not)."""
        if on != self.gradients:
            self.gradients = on
            self.gradientsChanged.emit(on)
