"""The gradients the views show while View → Show Gradients is on: asked of the scheduler
once per version (off the UI thread) and told to every view that draws them."""

from __future__ import annotations

from PySide6.QtCore import QObject, Signal

from attnviz.core.maths.backward import Gradients
from attnviz.core.maths.scenario import Scenario
from attnviz.core.scheduler import Results
from attnviz.ui.compute import ComputeService
from attnviz.ui.view_state import ViewState

QUERY = "gradients"


def layer_gradients(results: Results) -> Gradients:
    """The gradients of a version's own loss, from its whole layer (in core, off the UI
    thread)."""
    return results.gradients()


class GradientSource(QObject):
    """``gradients``: those of the scenario's own loss for ``scenario`` (the newest version
    they were made for), or None while they are off. ``gradientsReady`` follows each new
    answer, and None when they are switched off."""

    gradientsReady = Signal(object)  # Gradients or None

    def __init__(self, compute: ComputeService, view: ViewState, parent: QObject | None = None):
        super().__init__(parent)
        self.compute, self.view = compute, view
        self.gradients: Gradients | None = None
        self.scenario: Scenario | None = None  # what self.gradients are of
        self._asked: Scenario | None = None
        compute.resultChanged.connect(lambda _: self._ask())
        compute.answered.connect(self._answered)
        view.gradientsChanged.connect(self._switched)

    def _switched(self, on: bool) -> None:
        self._asked = None
        if on:
            self._ask()
        else:
            self.gradients = self.scenario = None
            self.gradientsReady.emit(None)

    def _ask(self) -> None:
        """Ask for the newest version's gradients once its whole layer is made."""
        s = self.compute.scenario
        if self.view.gradients and s is not self._asked:
            self._asked = s
            self.compute.ask(QUERY, layer_gradients, needs_layer=True)

    def _answered(self, name: str, value: object) -> None:
        if name == QUERY and isinstance(value, Gradients) and self.view.gradients:
            self.gradients, self.scenario = value, self.compute.scenario
            self.gradientsReady.emit(value)
