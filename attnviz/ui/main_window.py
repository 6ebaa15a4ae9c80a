"""The main window: docks, menus, toolbar, layout; files and autosave come from their modules."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QByteArray, QSettings, QSize, Qt, QTimer
from PySide6.QtGui import (
    QAction,
    QActionGroup,
    QCloseEvent,
    QDragEnterEvent,
    QDropEvent,
    QGuiApplication,
    QKeySequence,
    QShowEvent,
)
from PySide6.QtWidgets import (
    QApplication,
    QCheckBox,
    QComboBox,
    QDockWidget,
    QFrame,
    QInputDialog,
    QLabel,
    QMainWindow,
    QMenu,
    QMessageBox,
    QScrollArea,
    QTabWidget,
    QWidget,
)
from shiboken6 import isValid

from attnviz.core.figures.figure import HeatmapSpec, spec_for
from attnviz.core.io import files
from attnviz.core.lessons import STAGES, Rehearsal
from attnviz.core.maths.scenario import LIMITS, MASKS, POSITIONALS, Scenario
from attnviz.core.maths.training import DEFAULT_TASK_TRAINS
from attnviz.core.maths.training_run import RunConfig
from attnviz.core.presets import PRESETS, make_preset
from attnviz.core.session import untitled_name
from attnviz.ui.autosave import Autosave
from attnviz.ui.background import Background
from attnviz.ui.file_controller import FileController, Targets
from attnviz.ui.grid import MatrixGrid
from attnviz.ui.heatmap import HeatmapView
from attnviz.ui.model_import import ModelImports
from attnviz.ui.numbers_badge import NumbersBadge
from attnviz.ui.panels.common import ScreenPanel, int_spin, set_quietly
from attnviz.ui.panels.cost import CostPanel
from attnviz.ui.panels.experiments import ExperimentsPanel
from attnviz.ui.panels.heads import HeadsPanel
from attnviz.ui.panels.inputs import InputsPanel
from attnviz.ui.panels.inspector import GRID, InspectorPanel
from attnviz.ui.panels.lesson import LessonPanel
from attnviz.ui.panels.lines import LinesPanel
from attnviz.ui.panels.masks import MasksPanel
from attnviz.ui.panels.mix import MixPanel
from attnviz.ui.panels.model import ModelPanel
from attnviz.ui.panels.overview import OverviewPanel
from attnviz.ui.panels.pipeline import PipelinePanel
from attnviz.ui.panels.rope import RopePanel
from attnviz.ui.panels.tiling import TilingPanel
from attnviz.ui.panels.training import TrainingPanel
from attnviz.ui.panels.variants import VariantsPanel
from attnviz.ui.panels.weights import WeightsPanel
from attnviz.ui.training import Training
from attnviz.ui.view_state import ENGINES, Selection
from attnviz.ui.workspace import Workspace
from attnviz.ui.workspaces import Workspaces

DEFAULT_SIZE = QSize(1400, 860)
BUSY_AFTER_MS = 300  # work shorter than this shows no "computing…"
DOCK_ORDER = (
    "Inputs",
    "Weights",
    "Variants",
    "Pipeline",
    "RoPE",
    "Masks",
    "Heads",
    "Lines",
    "Overview",
    "Mix",
    "Experiments",
    "Tiling",
    "Timing",
    "Lesson",
    "Training",
    "Model",
    "Inspector",
    "Cost",
)


def _bench_panel(_: Workspace) -> QWidget:
    from attnviz.ui.panels.bench import BenchPanel  # loads torch: only once it is opened

    return BenchPanel()


LAZY_PANELS: dict[str, Callable[[Workspace], QWidget]] = {
    "Variants": VariantsPanel,
    "RoPE": RopePanel,
    "Masks": MasksPanel,
    "Heads": HeadsPanel,
    "Lines": LinesPanel,
    "Mix": MixPanel,
    "Experiments": ExperimentsPanel,
    "Tiling": TilingPanel,
    "Timing": _bench_panel,
    "Cost": CostPanel,
}


class MainWindow(QMainWindow):
    """One document in one window."""

    def __init__(self, settings: QSettings, data_dir: Path, scenario: Scenario | None = None):
        super().__init__()
        self.settings, self.data_dir = settings, data_dir
        self.ws = Workspace.create(scenario, self)
        self.doc, self.view_state, self.compute = self.ws.doc, self.ws.view_state, self.ws.compute
        self.setAcceptDrops(True)
        self.setDockNestingEnabled(True)
        self.last_grid: MatrixGrid | None = None
        self.last_heatmap: HeatmapView | None = None

        self.inputs = InputsPanel(self.ws)
        self.weights = WeightsPanel(self.ws)
        self.pipeline = PipelinePanel(self.ws)
        self.lesson = LessonPanel(self.ws)
        self.training = Training(self.doc, self.compute, self.view_state, self)
        self.training.message.connect(self.show_message)
        self.inspector = InspectorPanel(self.ws, self.training.step_of)
        self._panels: dict[str, QWidget] = {
            "Inputs": self.inputs,
            "Weights": self.weights,
            "Pipeline": self.pipeline,
            "Lesson": self.lesson,
            "Inspector": self.inspector,
        }
        self.models = ModelImports(self.ws, settings, self, self.show_message)
        self.models.imported.connect(self._imported)
        self._factories: dict[str, Callable[[Workspace], QWidget]] = {
            **LAZY_PANELS,
            "Model": lambda ws: ModelPanel(ws, self.models),
            "Overview": lambda ws: OverviewPanel(ws, self.models),
            "Training": lambda ws: TrainingPanel(ws, self.training),
        }
        self._dock_shown: dict[str, bool] = {}
        self.docks = {title: self._dock(title) for title in DOCK_ORDER}
        self.workspaces = Workspaces(self, self.docks, settings)
        self.lesson.showDocks.connect(self.bring_forward)
        self.lesson.showTab.connect(self.open_tab)
        self.lesson.setUpTraining.connect(self.set_up_training)

        for panel in (self.inputs, self.weights):
            panel.message.connect(self.show_message)
            panel.cellPicked.connect(self._grid_cell_picked)
        self.training.progressed.connect(lambda _: self._refresh_step())
        self.pipeline.cellClicked.connect(self._cell_clicked)
        self.busy = QLabel()
        self.statusBar().addPermanentWidget(self.busy)
        self.badge = NumbersBadge(self.ws)
        self.statusBar().addPermanentWidget(self.badge)
        self.files = FileController(
            self.ws,
            settings,
            self,
            self.show_message,
            saved=self.clear_autosave,
            targets=Targets(self._target_grid, self._target_figure),
        )
        self.files.open_layers = self.models.open_file
        self.compute.computeFailed.connect(lambda text: self.files.error("Cannot compute", text))
        self.view_state.engineChanged.connect(lambda _: self._sync_toolbar())

        self._build_toolbar()
        self._build_menus()
        QApplication.instance().focusChanged.connect(self._focus_changed)  # type: ignore[union-attr]

        self.doc.undo_stack.cleanChanged.connect(self._update_title)
        self.doc.pathChanged.connect(self._update_title)
        self.doc.scenarioChanged.connect(self._sync_toolbar)
        self.view_state.headChanged.connect(self._sync_toolbar)
        self._busy_timer = QTimer(self)
        self._busy_timer.setSingleShot(True)
        self._busy_timer.timeout.connect(lambda: self.busy.setText("computing…"))
        self.compute.busyChanged.connect(self._busy_changed)
        self._closed = False
        self.autosaver = Autosave(self.doc, data_dir, self)
        self.autosaver.failed.connect(self.show_message)

        self.resize(DEFAULT_SIZE)
        geometry = self.settings.value("window/geometry")
        if isinstance(geometry, QByteArray):
            self.restoreGeometry(geometry)
        self.fit_screen()
        self._sync_toolbar()
        self._update_title()

    # Layout ------------------------------------------------------------------------------

    def fit_screen(self) -> None:
        """Keep the window on the screen it opens on: no larger, and not off its edges."""
        screen = self.screen() or QGuiApplication.primaryScreen()
        if screen is None:
            return
        room = screen.availableGeometry()
        frame = self.frameGeometry().size() - self.size()  # title bar and borders
        width = min(self.width(), room.width() - frame.width())
        height = min(self.height(), room.height() - frame.height())
        if (width, height) != (self.width(), self.height()):
            self.resize(width, height)
        x = min(max(self.x(), room.left()), room.right() + 1 - self.frameGeometry().width())
        y = min(max(self.y(), room.top()), room.bottom() + 1 - self.frameGeometry().height())
        if (x, y) != (self.x(), self.y()):
            self.move(x, y)

    def _dock(self, title: str) -> QDockWidget:
        dock = QDockWidget(title, self)
        dock.setObjectName(f"dock-{title}")
        # In a scroll area, so that a squeezed dock scrolls instead of widening the window.
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QFrame.Shape.NoFrame)
        if title in self._panels:
            scroll.setWidget(self._panels[title])
        else:  # built when first shown: start-up pays only for what is on screen
            dock.visibilityChanged.connect(lambda visible: self._build_if_shown(title, visible))
        # A dock tabbed behind another stays visible to Qt: its tab raised, it is not shown
        # again, and its panels hear of it here (in place by then: drawn before it paints).
        dock.visibilityChanged.connect(lambda visible: self._shown_again(title, visible))
        dock.setWidget(scroll)
        # a dock dropped beside another makes a new tab bar: give it whole titles too
        dock.dockLocationChanged.connect(lambda _: self.workspaces.tidy_later())
        dock.setFeatures(
            QDockWidget.DockWidgetFeature.DockWidgetMovable
            | QDockWidget.DockWidgetFeature.DockWidgetFloatable
            | QDockWidget.DockWidgetFeature.DockWidgetClosable
        )
        return dock

    def _build_if_shown(self, title: str, visible: bool) -> None:
        # Decided after the event, on the latest news: while the window first lays out its
        # docks, docks bound for a tab behind another are visible for a moment.
        self._dock_shown[title] = visible
        QTimer.singleShot(0, lambda: self._build_if_still_shown(title))

    def _build_if_still_shown(self, title: str) -> None:
        if self._dock_shown[title]:
            self.panel(title)

    def _shown_again(self, title: str, visible: bool) -> None:
        """Draw what arrived while a dock's panels were off screen."""
        panel = self._panels.get(title)
        if visible and panel is not None:
            for screen in [panel, *panel.findChildren(ScreenPanel)]:
                if isinstance(screen, ScreenPanel):
                    screen.shown_again()

    def panel(self, title: str) -> QWidget:
        """The panel in a dock, built on first use for the docks that start hidden."""
        if title not in self._panels:
            panel = self._factories[title](self.ws)
            message = getattr(panel, "message", None)
            if message is not None:
                message.connect(self.show_message)
            self._panels[title] = panel
            scroll = self.docks[title].widget()
            assert isinstance(scroll, QScrollArea)
            scroll.setWidget(panel)
        return self._panels[title]

    @property
    def masks(self) -> MasksPanel:
        return self.panel("Masks")  # type: ignore[return-value]

    @property
    def heads(self) -> HeadsPanel:
        return self.panel("Heads")  # type: ignore[return-value]

    @property
    def mix(self) -> MixPanel:
        return self.panel("Mix")  # type: ignore[return-value]

    @property
    def experiments(self) -> ExperimentsPanel:
        return self.panel("Experiments")  # type: ignore[return-value]

    @property
    def cost(self) -> CostPanel:
        return self.panel("Cost")  # type: ignore[return-value]

    @property
    def training_panel(self) -> TrainingPanel:
        return self.panel("Training")  # type: ignore[return-value]

    def set_up_training(self, rehearsal: Rehearsal) -> None:
        """A lesson stage's run in the Training dock: the last run forgotten, the controls
        set to the stage's task, rate, comparison and steps (Step plays them)."""
        self.training.reset()
        trains = DEFAULT_TASK_TRAINS
        config = RunConfig(rehearsal.task, "adam", rehearsal.lr, None, 0, 8, trains,
                           rehearsal.compare or None)  # fmt: skip
        self.training_panel.set_config(config)
        self.training_panel.steps.setValue(rehearsal.steps)
        self.training.configure(config)

    def _grid_cell_picked(self, name: str, head: int | None, row: int, col: int) -> None:
        """A grid's cell clicked while a training run is held: the Inspector writes out
        its latest step (a run trained it); otherwise the Inspector keeps its cell."""
        if self.training.step_of(name, head, row, col) is not None:
            self.view_state.select(Selection(GRID + name, head, row, col))

    def _refresh_step(self) -> None:
        sel = self.view_state.selection
        if sel is not None and sel.view.startswith(GRID):
            self.inspector.refresh()

    def _imported(self, got: object) -> None:
        """An imported layer opens on its heads, with where it came from beside them; a
        file of attention weights only, on the Overview."""
        stack = getattr(got, "layers", got)
        if getattr(stack, "weights_only", False):
            self.bring_forward(("Overview", "Model"))
        else:
            self.bring_forward(("Heads", "Model"))

    def bring_forward(self, titles: tuple[str, ...]) -> None:
        """Show these docks, in the workspace that has them, over their tab neighbours
        (the most important first)."""
        self.workspaces.bring_forward(titles)

    def open_tab(self, title: str, tab: str) -> None:
        """Open a tab (by its label) of the panel in a dock."""
        panel = self.panel(title)
        if isinstance(panel, QTabWidget):
            labels = [panel.tabText(i) for i in range(panel.count())]
            if tab in labels:
                panel.setCurrentIndex(labels.index(tab))

    def showEvent(self, event: QShowEvent) -> None:
        # Docks are arranged once the window is shown: tabifying them earlier leaves
        # stale, visible tab bars behind (a Qt quirk).
        if not self.workspaces.started:
            self.fit_screen()  # the layout is made for the size the window will have
            QTimer.singleShot(0, self.fit_screen)  # and again once its frame is known
            self.workspaces.start()
        super().showEvent(event)

    def save_layout(self) -> None:
        self.settings.setValue("window/geometry", self.saveGeometry())
        self.workspaces.remember()

    # Toolbar: the settings and the selected head ----------------------------------------------

    def _build_toolbar(self) -> None:
        bar = self.addToolBar("Settings")
        bar.setObjectName("toolbar-settings")
        self.act_projections = QAction("Projections", self, checkable=True)
        self.act_projections.setToolTip("Q = X W_Q, K = X W_K, V = X W_V (off: Q = K = V = X)")
        self.act_projections.toggled.connect(lambda on: self.change_setting(projections=on))
        self.act_scale = QAction("Scale ÷√d_k", self, checkable=True)
        self.act_scale.setToolTip("Divide scores by √d_k before softmax")
        self.act_scale.toggled.connect(lambda on: self.change_setting(scale=on))
        # Check boxes, not tool buttons: an unchecked tool button reads as plain text.
        self.toggles: dict[QAction, QCheckBox] = {}
        for action in (self.act_projections, self.act_scale):
            box = QCheckBox(action.text())
            box.setToolTip(action.toolTip())
            box.toggled.connect(action.setChecked)
            action.toggled.connect(box.setChecked)
            bar.addWidget(box)
            self.toggles[action] = box
        bar.addSeparator()
        self.mask_box = self._combo(bar, "Mask", MASKS, lambda m: self.change_setting(mask=m))
        self.window_spin = int_spin(
            1,
            LIMITS.tokens,
            "Sliding window: each query sees itself and the keys before it, this many in all",
        )
        self.window_spin.setPrefix("window ")
        self.window_spin.valueChanged.connect(lambda w: self.change_setting(window=w))
        self.window_action = bar.addWidget(self.window_spin)
        self.pos_box = self._combo(
            bar, "Position", POSITIONALS, lambda p: self.change_setting(positional=p)
        )
        bar.addSeparator()
        bar.addWidget(QLabel(" Head "))
        self.head_spin = int_spin(1, 1, "The head shown in the Pipeline", commit_only=False)
        self.head_spin.valueChanged.connect(lambda h: self.view_state.set_head(h - 1))
        bar.addWidget(self.head_spin)
        bar.addSeparator()
        self.engine_box = self._combo(
            bar, "Engine", tuple(label for _, label in ENGINES.values()), self._choose_engine
        )
        self.engine_box.setToolTip(
            "Which engine the views show: NumPy float64 (the reference) or torch "
            "(on CUDA when present); torch loads when first chosen"
        )
        bar.addSeparator()
        bar.addWidget(QLabel(" Preset "))
        self.preset_box = QComboBox()
        self.preset_box.addItem("choose…")
        for k, preset in enumerate(PRESETS.values(), start=1):
            self.preset_box.addItem(preset.title, preset.name)
            self.preset_box.setItemData(k, preset.summary, Qt.ItemDataRole.ToolTipRole)
        self.preset_box.activated.connect(self._preset_chosen)
        bar.addWidget(self.preset_box)

    def _combo(self, bar, label, items, slot) -> QComboBox:  # type: ignore[no-untyped-def]
        bar.addWidget(QLabel(f" {label} "))
        box = QComboBox()
        box.addItems(list(items))
        box.textActivated.connect(slot)
        bar.addWidget(box)
        return box

    def _choose_engine(self, label: str) -> None:
        engine = next(k for k, (_, shown) in ENGINES.items() if shown == label)
        if engine != "numpy":
            self.show_message("Loading torch…")
        self.view_state.set_engine(engine)

    def _sync_toolbar(self) -> None:
        st = self.doc.scenario.settings
        for action, on in ((self.act_projections, st.projections), (self.act_scale, st.scale)):
            for control in (action, self.toggles[action]):
                control.blockSignals(True)
                control.setChecked(on)
                control.blockSignals(False)
        self.mask_box.setCurrentText(st.mask)
        self.engine_box.setCurrentText(ENGINES[self.view_state.engine][1])
        self.pos_box.setCurrentText(st.positional)
        set_quietly(self.window_spin, st.window)
        self.window_action.setVisible(st.mask == "sliding-window")
        self.head_spin.blockSignals(True)
        self.head_spin.setRange(1, self.doc.n_heads)
        self.head_spin.blockSignals(False)
        set_quietly(self.head_spin, self.view_state.head + 1)

    def change_setting(self, **change: object) -> None:
        s = self.doc.scenario
        if all(getattr(s.settings, k) == v for k, v in change.items()):
            return
        (name, value), *_ = change.items()
        self.doc.replace(s.with_settings(**change), f"Set {name} to {value}")

    def _gradient_menus(self, m: QMenu) -> None:
        """View → Show Gradients (Ctrl+G), and the loss they are of (View → Loss)."""
        shown = self._action(m, "Show &Gradients", self.view_state.set_gradients, "Ctrl+G")
        shown.setCheckable(True)
        shown.setStatusTip("Show the gradient of the loss beside each value in the Pipeline")
        self.view_state.gradientsChanged.connect(shown.setChecked)
        menu = m.addMenu("&Loss")
        group = QActionGroup(self)
        choices = {
            "Target: each row the previous token's X (a previous-token head)": {
                "loss": "target", "loss_target": "previous-token"},
            "Target: each row its own X (copy self)": {
                "loss": "target", "loss_target": "copy-self"},
            "Target: every row the first token's X": {
                "loss": "target", "loss_target": "first-token"},
            "Target: your own grid T (in the Inputs dock)": {
                "loss": "target", "loss_target": "custom"},
            "Next token (cross-entropy through a tied unembedding)": {"loss": "next-token"},
            "One output cell": {"loss": "cell"},
        }  # fmt: skip
        actions = []
        for text, change in choices.items():
            action = self._action(menu, text, lambda _=False, c=change: self._choose_loss(c))
            action.setCheckable(True)
            group.addAction(action)
            actions.append((action, change))

        def mark() -> None:
            st = self.doc.scenario.settings
            for action, change in actions:
                action.setChecked(all(getattr(st, k) == v for k, v in change.items()))
            row, col = self._final_cell() or st.loss_cell
            chosen = " (the selected cell)" if self._final_cell() else ""
            actions[-1][0].setText(f"One output cell: final[{row + 1}, {col + 1}]{chosen}")

        menu.aboutToShow.connect(mark)

    def _final_cell(self) -> tuple[int, int] | None:
        """The selected cell of the final output (the Mix dock), if one is selected."""
        sel = self.view_state.selection
        return (sel.row, sel.col) if sel is not None and sel.view == "final" else None

    def _choose_loss(self, change: dict[str, object]) -> None:
        """View → Loss: the one-cell loss takes the selected cell of final, if any."""
        cell = self._final_cell()
        if change.get("loss") == "cell" and cell is not None:
            change = {**change, "loss_cell": cell}
        self.change_setting(**change)

    def step_head(self, step: int) -> None:
        self.view_state.set_head(self.view_state.head + step)

    def _preset_chosen(self, index: int) -> None:
        if index > 0:  # item 0 is the prompt, not a preset
            self.load_preset(self.preset_box.itemData(index))

    def load_preset(self, name: str) -> None:
        preset, n = PRESETS[name], None
        if preset.sized:
            n, ok = QInputDialog.getInt(self, preset.title, "Number of tokens n:", 64, 1, 2048)
            if not ok:
                self.preset_box.setCurrentIndex(0)
                return
        scenario = make_preset(name, n=n)
        untitled = untitled_name(files.file_name_for(name, scenario), "preset")
        self.doc.start_from(scenario, f"Preset {preset.title}", untitled)
        self.preset_box.setCurrentIndex(0)
        self.show_message(f"Loaded {preset.title}: {preset.summary}")

    # Menus ------------------------------------------------------------------------------------

    def _action(self, menu, text: str, slot, shortcut=None) -> QAction:  # type: ignore[no-untyped-def]
        action = QAction(text, self)
        if shortcut is not None:
            action.setShortcut(shortcut)
        action.triggered.connect(slot)
        menu.addAction(action)
        return action

    def _build_menus(self) -> None:
        keys = QKeySequence.StandardKey
        m = self.menuBar().addMenu("&File")
        f = self.files
        self._action(m, "&New", f.new_document, keys.New)
        self._action(m, "&Open…", f.open_dialog, keys.Open)
        self._action(m, "Open E&xample…", self.open_example, "Ctrl+Shift+O")
        self.recent_menu = m.addMenu("Open &Recent")
        self.recent_menu.aboutToShow.connect(lambda: f.fill_recent(self.recent_menu))
        self._action(m, "&Save", f.save, keys.Save)
        self._action(m, "Save &As…", f.save_as, keys.SaveAs)
        m.addSeparator()
        self._action(m, "&Import Matrix…", f.import_matrix, "Ctrl+I")
        self._action(m, "Import &Model Layer…", self.models.open_dialog, "Ctrl+Shift+I")
        self._action(m, "&Export Matrix…", f.export_matrix, "Ctrl+E")
        self._action(m, "Export &Heatmap…", f.export_heatmap, "Ctrl+Shift+E")
        self._action(m, "Export All &Pipeline Heatmaps…", f.export_all)
        self._action(m, "Export as NumPy Script…", lambda: f.export_code("numpy"))
        self._action(m, "Export as PyTorch Script…", lambda: f.export_code("torch"))
        self._action(m, "Export as Tiled NumPy Script…", lambda: f.export_code("tiled"))
        m.addSeparator()
        self._action(m, "&Quit", self.close, keys.Quit)

        m = self.menuBar().addMenu("&Edit")
        undo = self.doc.undo_stack.createUndoAction(self, "&Undo")
        undo.setShortcut(keys.Undo)
        redo = self.doc.undo_stack.createRedoAction(self, "&Redo")
        # Every platform binding for Redo (Ctrl+Shift+Z, Ctrl+Y, …), each once.
        redo_keys = QKeySequence.keyBindings(keys.Redo)
        if QKeySequence("Ctrl+Y") not in redo_keys:
            redo_keys.append(QKeySequence("Ctrl+Y"))
        if QKeySequence("Ctrl+Shift+Z") not in redo_keys:
            redo_keys.append(QKeySequence("Ctrl+Shift+Z"))
        redo.setShortcuts(redo_keys)
        m.addAction(undo)
        m.addAction(redo)

        m = self.menuBar().addMenu("&View")
        for dock in self.docks.values():
            m.addAction(dock.toggleViewAction())
        m.addSeparator()
        self._action(m, "Previous Head", lambda: self.step_head(-1), "Ctrl+[")
        self._action(m, "Next Head", lambda: self.step_head(+1), "Ctrl+]")
        self._action(
            m, "Previous Layer (imported model)", lambda: self.models.step(-1), "Ctrl+Alt+["
        )
        self._action(m, "Next Layer (imported model)", lambda: self.models.step(+1), "Ctrl+Alt+]")
        m.addSeparator()
        self._gradient_menus(m)
        m.addSeparator()
        for action in self.workspaces.actions.actions():
            m.addAction(action)
        self._action(m, "&Reset Workspace", self.workspaces.reset)

        m = self.menuBar().addMenu("&Presets")
        for preset in PRESETS.values():
            action = self._action(
                m, preset.title, lambda _=False, n=preset.name: self.load_preset(n)
            )
            action.setToolTip(preset.summary)
            action.setStatusTip(preset.summary)

        m = self.menuBar().addMenu("&Lesson")
        self._action(m, "&Next Stage", lambda: self.lesson.go(self.lesson.index + 1), "Alt+Right")
        self._action(
            m, "&Previous Stage", lambda: self.lesson.go(self.lesson.index - 1), "Alt+Left"
        )
        m.addSeparator()
        for k, stage in enumerate(STAGES):
            self._action(
                m, f"{stage.number}. {stage.title}", lambda _=False, k=k: self.lesson.go(k)
            )

        m = self.menuBar().addMenu("&Help")
        self._action(m, "&About attnviz", self.about)
        self.workspace_buttons = self.workspaces.buttons()  # (PySide would drop it otherwise)
        self.menuBar().setCornerWidget(self.workspace_buttons, Qt.Corner.TopRightCorner)

    def open_example(self) -> None:
        """File → Open Example…; a lesson stage's example also shows that stage."""
        example = self.files.open_examples()
        if example is not None and example.stage is not None:
            self.lesson.show_stage(example.stage - 1)

    def about(self) -> None:
        from attnviz import __version__

        QMessageBox.about(
            self,
            "About attnviz",
            f"<b>attnviz {__version__}</b><p>A desktop lab for transformer attention: edit every "
            "matrix, see every intermediate, click any number for its arithmetic.</p>",
        )

    # Messages and title ---------------------------------------------------------------------

    def show_message(self, text: str) -> None:
        self.statusBar().showMessage(text, 8000)

    def _busy_changed(self, busy: bool) -> None:
        """ "computing…" in the status bar only for work that lasts: not flashed (nor the
        status bar laid out again) on every keystroke."""
        if busy:
            self._busy_timer.start(BUSY_AFTER_MS)
        else:
            self._busy_timer.stop()
            if self.busy.text():
                self.busy.setText("")

    def _update_title(self) -> None:
        name = files.printable(self.doc.name)
        self.setWindowTitle(f"{name}[*] — attnviz")
        self.setWindowModified(not self.doc.undo_stack.isClean())

    def _focus_changed(self, _old: QWidget | None, new: QWidget | None) -> None:
        while new is not None and not isinstance(new, (MatrixGrid, HeatmapView)):
            new = new.parentWidget()
        if isinstance(new, MatrixGrid):
            self.last_grid = new
        elif isinstance(new, HeatmapView):
            self.last_heatmap = new

    def _target_grid(self) -> MatrixGrid:
        """The grid that last had focus, unless it has gone (its head was removed)."""
        grid = self.last_grid
        if grid is None or not isValid(grid):
            return self.inputs.grid
        model = grid.matrix_model()
        if model.head is not None and model.head >= self.doc.scenario.n_heads:
            return self.inputs.grid
        return grid

    def _target_figure(self) -> tuple[str, HeatmapSpec]:
        """The heatmap last looked at (the Pipeline's weights at first): a Pipeline view is
        drawn afresh from the latest result; another view's figure is what it shows."""
        view = self.last_heatmap
        if view is None or not isValid(view) or view.spec is None:
            view = self.pipeline.views["weights"]
        if view in self.pipeline.views.values():
            layer = self.compute.complete_result()  # (of what the document holds now)
            return view.name, spec_for(layer, view.name, self.view_state.head)
        assert view.spec is not None
        return view.name, view.spec

    def dragEnterEvent(self, event: QDragEnterEvent) -> None:
        if any(u.isLocalFile() for u in event.mimeData().urls()):
            event.acceptProposedAction()

    def dropEvent(self, event: QDropEvent) -> None:
        urls = [u for u in event.mimeData().urls() if u.isLocalFile()]
        if urls:
            event.acceptProposedAction()
            self.files.open_path(Path(urls[0].toLocalFile()))

    def _cell_clicked(self, view: str, head: int, row: int, col: int) -> None:
        self.last_heatmap = self.pipeline.views[view]
        self.show_message(self.pipeline.views[view].describe(row, col).replace("\n", " · "))

    # Autosave ------------------------------------------------------------------------------

    @property
    def autosave_path(self) -> Path:
        return self.autosaver.path

    def autosave(self) -> None:
        self.autosaver.tick()

    def clear_autosave(self) -> None:
        self.autosaver.clear()

    def offer_restore(self) -> bool:
        """After a crash: offer the autosaved scenario; True if it was restored.

        Whatever the data folder holds, the window starts: a damaged copy is set aside
        (renamed, never deleted) and one dialog says why.
        """
        if not self.autosaver.exists():
            self.clear_autosave()  # a stray autosave.origin, whatever it is
            return False
        try:
            scenario, origin, note = self.autosaver.read()
        except files.FileFormatError as e:
            self.files.error("Cannot restore", f"The unsaved work could not be restored: {e}")
            return False
        text = "attnviz was not closed properly last time. Restore the unsaved scenario?"
        answer = QMessageBox.question(
            self,
            "Restore unsaved work?",
            f"{text}\n\n{note}" if note else text,
            QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.No,
        )
        if answer != QMessageBox.StandardButton.Yes:
            self.clear_autosave()
            return False
        # Undo then goes back to what the file holds (or to the worked example, untitled).
        try:
            saved = files.load_scenario(origin) if origin else None
        except files.FileFormatError:
            saved = None
        if saved is None:
            self.doc.reset(make_preset("worked-example"), None)
        else:
            self.doc.reset(saved, origin)
        self.doc.replace(scenario, "Restore unsaved work")
        return True

    def closeEvent(self, event: QCloseEvent) -> None:
        if self._closed:
            event.accept()
            return
        if not self.files.maybe_save():
            event.ignore()
            return
        self.save_layout()
        self.autosaver.close()
        self.models.close()
        self.training.close()
        self.files.close()
        self.ws.close()
        for worker in self.findChildren(Background):
            worker.close()
        self._closed = True
        event.accept()
