"""Training dock: play, pause, step and reset a training run of the scenario; its loss
curves (and a comparison run's), the steps per second, and a slider through its
snapshots. The run itself lives in attnviz.ui.training; this panel draws what it is
given and sends it commands."""

from __future__ import annotations

import math
from html import escape

import numpy as np
from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QSlider,
    QVBoxLayout,
    QWidget,
)

from attnviz.core.figures.chart import PALETTE
from attnviz.core.maths.optimizers import OPTIMIZERS
from attnviz.core.maths.tasks import TASKS
from attnviz.core.maths.training_run import (
    COMPARISON_TITLES,
    COMPARISONS,
    Point,
    Progress,
    RunConfig,
)
from attnviz.ui.panels.common import int_spin
from attnviz.ui.plotting import pg
from attnviz.ui.training import Training
from attnviz.ui.workspace import Workspace

OWN_LOSS = "the scenario's own loss"
NO_COMPARISON = "nothing"
GROUPS = {  # a check box each: what trains
    "W_Q": ("W_Q",),
    "W_K": ("W_K",),
    "W_V": ("W_V",),
    "W_O": ("W_O",),
    "biases": ("b_Q", "b_K", "b_V", "b_O"),
    "norms": ("q_norm", "k_norm"),
    "X": ("X",),
    "E": ("E",),
}
CURVES = (("train", "train", PALETTE[0]), ("held_out", "held-out", PALETTE[2]),
          ("inference", "inference", PALETTE[1]),
          ("seen", "steps, with dropout", PALETTE[3]))  # fmt: skip
FIXED_TIP = (
    "A run keeps the settings it started with: pause to change this (Play then starts a new run)"
)


class LossPlot(pg.PlotWidget):  # type: ignore[misc]  # (pyqtgraph has no types)
    """The loss curves; asks for little height, so that the dock's words (which wrap, and
    so size the panel by its preferred height) never push it past the dock."""

    def sizeHint(self) -> QSize:
        return QSize(300, 120)


class TrainingPanel(QWidget):
    """The Training dock."""

    def __init__(self, ws: Workspace, training: Training, parent: QWidget | None = None):
        super().__init__(parent)
        self.ws, self.training = ws, training
        self._build_controls()
        self.plot = LossPlot()
        self.plot.setLogMode(x=False, y=True)
        self.plot.setLabel("bottom", "step")
        self.plot.setLabel("left", "loss (log scale)")
        self.plot.setMinimumHeight(120)
        self.plot.setMenuEnabled(False)
        self.curves: dict[tuple[str, bool], pg.PlotDataItem] = {}
        for key, _, colour in CURVES:
            for other in (False, True):
                style = Qt.PenStyle.DashLine if other else Qt.PenStyle.SolidLine
                pen = pg.mkPen(colour, width=2, style=style)
                self.curves[key, other] = self.plot.plot([], [], pen=pen)
        self.marker = pg.InfiniteLine(angle=90, pen=pg.mkPen("#888888", width=1))
        self.plot.addItem(self.marker)
        self.legend = QLabel()
        self.legend.setWordWrap(True)
        meaning = (
            "train: the loss of the training pass (one pass over every position, with the "
            "run's mask); held-out: the same on examples never trained on; inference: the "
            "loss when generating token by token, each position seeing only its past (what a "
            "KV cache computes). Under dropout, also the mean loss the training steps saw (their "
            "batches, with dropout). Solid: this run; dashed: the comparison run. Numbers: "
            "the latest evaluation."
        )
        self.legend.setToolTip(meaning)
        self.plot.setToolTip(meaning)
        self.slider = QSlider(Qt.Orientation.Horizontal)
        self.slider.setToolTip("Scrub through the run's snapshots: every view shows that step")
        self.slider.valueChanged.connect(self._scrubbed)
        self.slider_label = QLabel()
        scrub = QHBoxLayout()
        scrub.addWidget(QLabel("snapshot"))
        scrub.addWidget(self.slider, 1)
        scrub.addWidget(self.slider_label)

        layout = QVBoxLayout(self)
        layout.setContentsMargins(6, 6, 6, 6)
        layout.addLayout(self.form)
        layout.addLayout(self.buttons)
        layout.addWidget(self.readout)
        layout.addWidget(self.plot, 1)
        layout.addWidget(self.legend)
        layout.addLayout(scrub)

        training.progressed.connect(self.show_progress)
        training.runningChanged.connect(self._running_changed)
        ws.doc.scenarioChanged.connect(self._sync_trains)
        self._sync_trains()
        self.show_progress(training.progress)
        self._running_changed(training.running)

    # Controls -------------------------------------------------------------------------

    def _build_controls(self) -> None:
        self.task = QComboBox()
        self.task.addItems([OWN_LOSS, *TASKS])
        self.task.setToolTip("What the layer learns: the loss chosen in View → Loss, or a task")
        self.task.currentTextChanged.connect(lambda _: self._sync_trains())
        self.optimizer = QComboBox()
        self.optimizer.addItems(list(OPTIMIZERS))
        self.optimizer.setCurrentText("adam")
        self.lr = self._number(1e-5, 10.0, 0.02, 5, "Learning rate")
        self.clip = self._number(0.0, 1e3, 0.0, 3, "Gradient clipping: the largest gradient norm")
        self.clip.setSpecialValueText("off")
        self.seed = int_spin(0, 2**31 - 1, "Seed: the batches' order and the task's E", 0)
        self.batch = int_spin(1, 256, "Examples per step (tasks)", 8)
        self.compare = QComboBox()
        self.compare.addItem(NO_COMPARISON)
        for key in COMPARISONS:
            self.compare.addItem(COMPARISON_TITLES[key], key)
        self.compare.setToolTip(
            "A second run from the same start and seed with one setting changed, stepped with "
            "this one; its curves are dashed"
        )
        self.trains: dict[str, QCheckBox] = {}
        trains = QGridLayout()
        trains.setHorizontalSpacing(6)
        trains.setVerticalSpacing(2)
        for k, name in enumerate(GROUPS):
            box = QCheckBox(name)
            box.setChecked(name in ("W_Q", "W_K", "W_V", "W_O", "E"))
            box.setToolTip(f"Train {', '.join(GROUPS[name])}")
            self.trains[name] = box
            trains.addWidget(box, k // 4, k % 4)
        self.form = QGridLayout()
        self.form.setHorizontalSpacing(6)
        self.buttons = QHBoxLayout()
        self.readout = QLabel()
        self.steps = int_spin(1, 100_000, "Steps per click of Step", 1)
        rows = (
            (("task", self.task), ("seed", self.seed)),
            (("optimiser", self.optimizer), ("lr", self.lr)),
            (("batch", self.batch), ("clip", self.clip)),
        )
        for r, row in enumerate(rows):
            for c, (label, widget) in enumerate(row):
                self.form.addWidget(QLabel(label), r, 2 * c)
                self.form.addWidget(widget, r, 2 * c + 1)
        self.form.addWidget(QLabel("compare"), 3, 0)
        self.form.addWidget(self.compare, 3, 1, 1, 3)
        self.form.addWidget(QLabel("trains"), 4, 0, Qt.AlignmentFlag.AlignTop)
        self.form.addLayout(trains, 4, 1, 1, 3)
        for combo in (self.task, self.optimizer, self.compare):
            combo.setSizeAdjustPolicy(
                QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon
            )
            combo.setMinimumContentsLength(6)
        self.form.setColumnStretch(1, 2)
        self.form.setColumnStretch(3, 1)
        self.fixed = [self.task, self.optimizer, self.lr, self.clip, self.seed, self.batch,
                      self.compare, *self.trains.values()]  # fmt: skip
        self.tips = [widget.toolTip() for widget in self.fixed]

        self.play_button = QPushButton("Play")
        self.play_button.clicked.connect(self.toggle)
        self.step_button = QPushButton("Step")
        self.step_button.setToolTip("Train this many steps, then pause (.)")
        self.step_button.clicked.connect(self._step_key)
        self.reset_button = QPushButton("Reset")
        self.reset_button.setToolTip(
            "Forget the run: its curves and snapshots (Edit → Undo still goes back)"
        )
        self.reset_button.clicked.connect(self.training.reset)
        for widget in (self.play_button, self.step_button, self.steps, self.reset_button):
            self.buttons.addWidget(widget)
        self.buttons.addStretch(1)
        self.readout.setWordWrap(True)
        for key, slot in (("Space", self.toggle), (".", self._step_key)):
            shortcut = QShortcut(QKeySequence(key), self)
            shortcut.setContext(Qt.ShortcutContext.WidgetWithChildrenShortcut)
            shortcut.activated.connect(slot)

    @staticmethod
    def _number(low: float, high: float, value: float, decimals: int, tip: str) -> QDoubleSpinBox:
        spin = QDoubleSpinBox()
        spin.setRange(low, high)
        spin.setDecimals(decimals)
        spin.setValue(value)
        spin.setSingleStep(10.0 ** (1 - decimals) if decimals > 2 else 0.1)
        spin.setKeyboardTracking(False)
        spin.setToolTip(tip)
        return spin

    def config(self) -> RunConfig:
        """The run the controls describe."""
        task = None if self.task.currentText() == OWN_LOSS else self.task.currentText()
        allowed = {"E"} if task is not None else {"X"}
        trains = tuple(
            name
            for group, box in self.trains.items()
            if box.isChecked() and box.isEnabled() and group not in ({"X", "E"} - allowed)
            for name in GROUPS[group]
        )
        return RunConfig(
            task=task,
            optimizer=self.optimizer.currentText(),
            lr=self.lr.value(),
            clip=self.clip.value() or None,
            seed=self.seed.value(),
            batch=self.batch.value(),
            trains=trains,
            compare=self.compare.currentData(),
        )

    def set_config(self, config: RunConfig) -> None:
        """Show a run's settings in the controls (a lesson stage sets them up)."""
        self.task.setCurrentText(config.task or OWN_LOSS)
        self.optimizer.setCurrentText(config.optimizer)
        self.lr.setValue(config.lr)
        self.clip.setValue(config.clip or 0.0)
        self.seed.setValue(config.seed)
        self.batch.setValue(config.batch)
        index = self.compare.findData(config.compare) if config.compare else 0
        self.compare.setCurrentIndex(max(0, index))
        if config.trains:
            for group, box in self.trains.items():
                box.setChecked(set(GROUPS[group]) <= set(config.trains))

    def start(self, config: RunConfig | None = None, steps: int | None = None) -> None:
        """A new run with these settings (or the controls'), for ``steps`` steps or until
        paused: how a lesson stage or a script drives the dock."""
        if config is not None:
            self.set_config(config)
        self.training.start(config or self.config(), steps)

    def toggle(self) -> None:
        """Play or pause (Space)."""
        if self.training.running:
            self.training.pause()
        else:
            self.training.configure(self.config())
            self.training.play()

    def _step_key(self) -> None:
        if not self.training.running:
            self.training.configure(self.config())
            self.training.step(self.steps.value())

    def _sync_trains(self) -> None:
        """X trains without a task; E (the task's embedding table) with one."""
        task = self.task.currentText() != OWN_LOSS
        self.trains["X"].setEnabled(not task and not self.training.running)
        self.trains["E"].setEnabled(task and not self.training.running)
        self.batch.setEnabled(task and not self.training.running)

    def _running_changed(self, running: bool) -> None:
        self.play_button.setText("Pause" if running else "Play")
        self.play_button.setToolTip(
            "Pause after the step under way (Space)" if running else "Train until paused (Space)"
        )
        for widget, tip in zip(self.fixed, self.tips, strict=True):
            widget.setEnabled(not running)
            widget.setToolTip(FIXED_TIP if running else tip)
        self.step_button.setEnabled(not running)
        self.slider.setEnabled(not running and self.training.progress is not None)
        self._sync_trains()

    # Drawing --------------------------------------------------------------------------

    def show_progress(self, progress: Progress | None) -> None:
        """Draw the run's curves, its steps per second and its snapshots."""
        if progress is None:
            for curve in self.curves.values():
                curve.setData([], [])
            self.plot.getAxis("left").setTicks(None)
            self.readout.setText("No run yet: press Play (Space) or Step.")
            self.legend.setText("")
            self._set_slider(0, 0)
            return
        steps = np.array([p.step for p in progress.points], dtype=float)
        main, other = progress.names
        entries = []
        for key, title, colour in CURVES:
            for is_other, name in ((False, main), (True, other)):
                values = [curve_value(p, key, is_other) for p in progress.points]
                if key == "seen":  # the steps' own losses matter only where dropout differs
                    values = values[1:] if dropout(progress, is_other) else []
                    xs = steps[1:]
                else:
                    xs = steps
                shown = name is not None and all(v is not None for v in values) and values
                ys = np.maximum(np.array(values if shown else [], dtype=float), 1e-12)
                self.curves[key, is_other].setData(xs if shown else [], ys)
                if shown:
                    label = title if not name else f"{title} ({name})"
                    entries.append((f"{label} {values[-1]:.3g}", colour, is_other))
        self.legend.setText(legend(entries))
        drawn = [np.asarray(c.yData) for c in self.curves.values() if c.yData is not None]
        ys = np.concatenate(drawn) if drawn else np.array([])
        ticks = log_ticks(float(ys.min()), float(ys.max())) if ys.size else None
        self.plot.getAxis("left").setTicks(None if ticks is None else [ticks, []])
        rate = f"{progress.steps_per_second:,.0f} steps/s" if progress.steps_per_second else ""
        self.readout.setText(" · ".join(t for t in (f"<b>step {progress.step}</b>", rate) if t))
        self._set_slider(len(progress.snapshots), len(progress.snapshots) - 1)
        self.marker.setValue(progress.step)

    def _set_slider(self, count: int, value: int) -> None:
        self.slider.blockSignals(True)
        self.slider.setRange(0, max(0, count - 1))
        self.slider.setValue(value)
        self.slider.blockSignals(False)
        self.slider.setEnabled(count > 1 and not self.training.running)
        self._label_snapshot(value)

    def _label_snapshot(self, index: int) -> None:
        progress = self.training.progress
        if progress is None or not progress.snapshots:
            self.slider_label.setText("")
            return
        step = progress.snapshots[index][0]
        self.slider_label.setText(f"step {step}")
        self.marker.setValue(step)

    def _scrubbed(self, index: int) -> None:
        self._label_snapshot(index)
        self.training.scrub(index)


def curve_value(point: Point, key: str, other: bool) -> float | None:
    """One curve's value at a point: a loss of the run (or of its twin)."""
    if key == "seen":
        return point.seen[1 if other else 0]
    losses = point.other if other else point.main
    value = None if losses is None else getattr(losses, key)
    return None if value is None else float(value)


def dropout(progress: Progress, other: bool) -> bool:
    """Whether the run (or its twin) trains with attention dropout."""
    on = progress.scenario.settings.dropout > 0
    return not on if other and progress.config.compare == "dropout" else on


def legend(entries: list[tuple[str, str, bool]]) -> str:
    """The curves' legend under the plot: a solid or dashed stroke in each colour, the
    two runs' curves of one loss on one line."""
    lines: dict[str, list[str]] = {}
    for name, colour, dashed in entries:
        stroke = f"<span style='color:{colour}'>{'╍╍' if dashed else '━━'}</span>"
        words = escape(name).replace(" ", "&nbsp;").replace("-", "\u2011")
        lines.setdefault(colour, []).append(f"{stroke}&nbsp;{words}")
    return "<br>".join("&nbsp;&nbsp;&nbsp; ".join(line) for line in lines.values())


def log_ticks(low: float, high: float) -> list[tuple[float, str]]:
    """Labelled ticks of a short log axis (at log10 of each value): 1, 2 and 5 of each
    decade over a narrow range, the decades alone over a wide one, never crowded."""
    first, last = math.floor(math.log10(low)), math.ceil(math.log10(high))
    span = last - first
    steps = (1, 2, 5) if span <= 2 else (1, 3) if span <= 4 else (1,)
    every = 1 if span <= 6 else 2
    values = [m * 10.0**k for k in range(first, last + 1, every) for m in steps]
    inside = [v for v in values if low / 1.2 <= v <= high * 1.2]
    return [(math.log10(v), f"{v:g}") for v in inside]
