"""Lesson dock: the brief's seven stages, what current models change, the tiled pass and
four training stages, in order, each setting up its scenario and docks (and the training
stages, the Training dock's run)."""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QComboBox,
    QHBoxLayout,
    QTextBrowser,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from attnviz.core.io.files import file_name_for
from attnviz.core.lessons import STAGES, Stage
from attnviz.core.presets import make_preset
from attnviz.core.session import untitled_name
from attnviz.ui.workspace import Workspace


class LessonPanel(QWidget):
    """Choosing a stage loads its preset (one undoable step) and asks for its docks."""

    showDocks = Signal(tuple)  # dock titles to bring forward, most important first
    showTab = Signal(str, str)  # dock title, tab: a tab to open in a dock that has tabs
    setUpTraining = Signal(object)  # Rehearsal: the run a stage sets the Training dock to

    def __init__(self, ws: Workspace, parent: QWidget | None = None):
        super().__init__(parent)
        self.doc, self.view_state, self.compute = ws.doc, ws.view_state, ws.compute
        self.index = -1
        self.stages = QComboBox()
        self.stages.addItem("Choose a stage…")
        self.stages.addItems([f"{s.number}. {s.title}" for s in STAGES])
        self.stages.setSizeAdjustPolicy(
            QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon
        )
        self.stages.setMinimumContentsLength(8)
        self.stages.activated.connect(self._stage_chosen)
        self.previous, self.next = QToolButton(), QToolButton()
        self.previous.setText("◀")
        self.next.setText("Next ▶")
        self.previous.setToolTip("Previous stage (Alt+Left)")
        self.next.setToolTip("Next stage (Alt+Right)")
        self.previous.clicked.connect(lambda: self.go(self.index - 1))
        self.next.clicked.connect(lambda: self.go(self.index + 1))
        self.text = QTextBrowser()
        row = QHBoxLayout()
        row.addWidget(self.previous)
        row.addWidget(self.stages, 1)
        row.addWidget(self.next)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addLayout(row)
        layout.addWidget(self.text)
        self._show_intro()

    def _show_intro(self) -> None:
        self.text.setHtml(
            "<h3>The attention lesson</h3><p>Thirteen stages, from plain dot products to the "
            "cost of attention over long sequences, what current models change, how a fused "
            "kernel computes it in tiles, and what training does with it: a model that cheats "
            "through the leaky mask, a saturated softmax that stalls, heads that specialise, "
            "dropout. Each stage sets up the example, brings the "
            "relevant panels forward and suggests one thing to try. You can leave the lesson "
            "at any time and keep editing; <b>Ctrl+Z</b> undoes a stage's change.</p>"
            "<p>Press <b>Next</b> to begin.</p>"
        )
        self._sync_buttons()

    def _sync_buttons(self) -> None:
        self.previous.setEnabled(self.index > 0)
        self.next.setEnabled(self.index < len(STAGES) - 1)
        self.stages.setCurrentIndex(self.index + 1)

    def _stage_chosen(self, index: int) -> None:
        if index > 0:  # item 0 is the prompt, not a stage
            self.go(index - 1)

    def go(self, index: int) -> None:
        """Stage index: its scenario (one undoable step), its page and its docks."""
        if not 0 <= index < len(STAGES):
            return
        stage = STAGES[index]
        scenario = make_preset(stage.preset)
        name = untitled_name(file_name_for(f"lesson-{stage.number}", scenario), "lesson")
        self.doc.start_from(scenario, f"Lesson stage {stage.number}", name)
        self.view_state.set_head(0)
        self.show_stage(index)

    def show_stage(self, index: int) -> None:
        """Stage index's page and docks, over the scenario as it is (its example opened)."""
        self.index = index
        stage = STAGES[index]
        self.text.setHtml(self.page(stage))
        self._sync_buttons()
        self.showDocks.emit((*stage.docks, "Lesson"))
        if stage.tab:
            self.showTab.emit(*stage.tab)
        if stage.training:
            self.setUpTraining.emit(stage.training)

    @staticmethod
    def page(stage: Stage) -> str:
        return (
            f"<h3>Stage {stage.number} of {len(STAGES)}: {stage.title}</h3>"
            f"<p>{stage.explanation}</p>"
            f"<p style='background:#eef5ff; padding:6px'><b>Try this:</b> {stage.try_this}</p>"
        )
