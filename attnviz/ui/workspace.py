"""The models a window's panels read: the document, the view state, the results and the
gradients."""

from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtCore import QObject

from attnviz.core.maths.scenario import Scenario
from attnviz.ui.compute import ComputeService
from attnviz.ui.document import Document
from attnviz.ui.gradients import GradientSource
from attnviz.ui.view_state import ViewState


@dataclass(frozen=True)
class Workspace:
    """Edits go to ``doc`` (as commands); what is shown to ``view_state``; results come
    from ``compute``, the gradients (while shown) from ``gradients``. Panels hold these and
    nothing else of the window."""

    doc: Document
    view_state: ViewState
    compute: ComputeService
    gradients: GradientSource

    @classmethod
    def create(cls, scenario: Scenario | None = None, parent: QObject | None = None) -> Workspace:
        doc = Document(scenario, parent)
        view_state = ViewState(lambda: doc.n_heads, parent)
        doc.scenarioChanged.connect(view_state.clamp_head)  # before any view redraws
        compute = ComputeService(doc, view_state, parent)
        return cls(doc, view_state, compute, GradientSource(compute, view_state, parent))

    def close(self) -> None:
        self.compute.close()
