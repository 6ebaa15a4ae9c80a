"""Workspaces: named arrangements of the docks, one click (or Ctrl+1 … Ctrl+5) each.

A workspace shows the docks for one kind of work: the inputs on the left, its views as
tabs in the middle, its helpers on the right; the other docks are closed (View menu
opens any of them). Each workspace remembers the user's own changes to it in the
settings, and Reset Workspace puts it back as it was.
"""

from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtCore import QByteArray, QObject, QRect, QSettings, Qt, QTimer
from PySide6.QtGui import QAction, QActionGroup
from PySide6.QtWidgets import (
    QDockWidget,
    QHBoxLayout,
    QLabel,
    QMainWindow,
    QTabBar,
    QToolButton,
    QWidget,
)


@dataclass(frozen=True)
class Plan:
    """One workspace: its name, its views (tabbed in the middle, the first raised) and the
    docks to their right (one cell each, top to bottom; a cell's later docks are tabs)."""

    key: str  # in the settings
    name: str
    summary: str
    centre: tuple[str, ...]
    right: tuple[tuple[str, ...], ...]
    heights: tuple[int, ...] = (330, 470)  # of the cells on the right, in proportion
    right_width: tuple[int, int] = (260, 290)  # of the column on the right: compact, wide

    @property
    def docks(self) -> tuple[str, ...]:
        return (*LEFT, *self.centre, *(title for cell in self.right for title in cell))


LEFT = ("Inputs", "Weights")  # every workspace edits the same matrices
PLANS: tuple[Plan, ...] = (
    Plan(
        "learn",
        "Learn",
        "The pipeline step by step, masks, every head and the W_O mix, with the lesson",
        ("Pipeline", "Masks", "Heads", "Mix", "Experiments", "Cost"),
        (("Lesson",), ("Inspector",)),
    ),
    Plan(
        "current",
        "Current models",
        "What current models change: GQA, RoPE, windows, sinks, soft-capping",
        ("Variants", "RoPE", "Pipeline", "Masks"),
        (("Lesson",), ("Inspector",)),
    ),
    Plan(
        "real",
        "Real models",
        "An imported pretrained layer: every layer and head, lines, and the model itself",
        ("Overview", "Heads", "Lines", "Pipeline"),
        (("Model",), ("Inspector",)),
        (520, 280),  # where the layer came from, and how far an edit moved it
    ),
    Plan(
        "kernels",
        "Kernels",
        "FlashAttention's tiles, kernel timing and the cost of long sequences",
        ("Tiling", "Timing", "Cost"),
        (("Lesson",), ("Inspector",)),
    ),
    Plan(
        "train",
        "Train",
        "Train the layer: loss curves, a comparison run, and the heads as they learn",
        ("Heads", "Pipeline", "Masks"),
        (("Training",), ("Lesson", "Inspector")),
        (600, 200),  # the curves and their controls, then the lesson under them
        (370, 430),  # room for the curves beside the heads
    ),
)
BY_KEY = {plan.key: plan for plan in PLANS}
NOWHERE = QRect(-9999, -9999, 1, 1)  # where no layout puts a tab bar
VERSION = 3  # of the saved arrangements: older ones (another set of docks) are not restored


def needing(titles: tuple[str, ...], current: Plan) -> Plan:
    """The workspace to show these docks in: the current one if it has them all, else the
    first that has them all, else the first with the most important (the first) one."""
    for plan in (current, *PLANS):
        if set(titles) <= set(plan.docks):
            return plan
    return next((p for p in PLANS if titles[0] in p.docks), current)


class Workspaces(QObject):
    """Switches, remembers and resets a window's workspaces."""

    def __init__(self, window: QMainWindow, docks: dict[str, QDockWidget], settings: QSettings):
        super().__init__(window)
        self.window, self.docks, self.settings = window, docks, settings
        self.started = False  # the docks are arranged when the window is first shown
        self.current = BY_KEY.get(str(settings.value("workspaces/current", "")), PLANS[0])
        self.actions = QActionGroup(self)
        for k, plan in enumerate(PLANS, start=1):
            action = QAction(plan.name, self, checkable=True)
            action.setShortcut(f"Ctrl+{k}")
            action.setToolTip(f"{plan.summary} (Ctrl+{k})")
            action.setStatusTip(plan.summary)
            action.setChecked(plan is self.current)
            action.triggered.connect(lambda _=False, key=plan.key: self.switch(key))
            self.actions.addAction(action)

    def buttons(self) -> QWidget:
        """The workspaces as a row of buttons, one checked."""
        row = QWidget()
        layout = QHBoxLayout(row)
        layout.setContentsMargins(0, 0, 4, 0)
        layout.setSpacing(2)
        layout.addWidget(QLabel("Workspace:"))
        for action in self.actions.actions():
            button = QToolButton()
            button.setDefaultAction(action)
            button.setAutoRaise(True)
            layout.addWidget(button)
        return row

    def start(self) -> None:
        """Show the workspace the user last had (the first time: Learn)."""
        self.started = True
        self.arrange(self.current)  # a saved state only places docks the window holds
        self._show(self.current)

    def switch(self, key: str) -> None:
        plan = BY_KEY[key]
        if plan is not self.current:
            self.remember()
            self.current = plan
            self._show(plan)

    def reset(self) -> None:
        """The current workspace as it was before the user changed it."""
        self.settings.remove(f"workspace-states/{self.current.key}")
        self.arrange(self.current)

    def remember(self) -> None:
        """Keep the current workspace as the user left it (on a switch and at close; not
        for a window never shown, whose docks were never arranged)."""
        if self.started:
            state = self.window.saveState(VERSION)
            self.settings.setValue(f"workspace-states/{self.current.key}", state)

    def bring_forward(self, titles: tuple[str, ...]) -> None:
        """Show these docks and raise them over their tab neighbours (the most important
        first), in the workspace that has them."""
        self.switch(needing(titles, self.current).key)
        for title in reversed(titles):
            dock = self.docks[title]
            dock.show()
            dock.raise_()

    def _show(self, plan: Plan) -> None:
        state = self.settings.value(f"workspace-states/{plan.key}")
        if not (isinstance(state, QByteArray) and self._restore(state)):
            self.arrange(plan)
        for action in self.actions.actions():
            action.setChecked(action.text() == plan.name)
        self.settings.setValue("workspaces/current", plan.key)
        self._whole_tab_titles()

    def _restore(self, state: QByteArray) -> bool:
        """The window's restoreState, less the tab bars of the arrangement it replaces:
        Qt 6.11 makes new bars for the restored one and leaves the old ones visible. A bar
        the new arrangement uses is placed by its layout; the others are hidden."""
        old = self._tab_bars()
        for bar in old:
            bar.setGeometry(NOWHERE)
        restored = self.window.restoreState(state, VERSION)
        layout = self.window.layout()
        assert layout is not None
        layout.activate()
        for bar in old:
            if bar.geometry() == NOWHERE:
                bar.hide()
        return restored

    def _tab_bars(self) -> list[QTabBar]:
        """The dock areas' tab bars, not the panels' own."""
        return [bar for bar in self.window.findChildren(QTabBar) if bar.parent() is self.window]

    def arrange(self, plan: Plan) -> None:
        """The workspace's own arrangement, sized for the window as it is."""
        w, d = self.window, self.docks
        size = w.size()
        for dock in d.values():  # out of their tab groups: a split would join them
            dock.setFloating(False)
            w.removeDockWidget(dock)
            dock.show()
        w.addDockWidget(Qt.DockWidgetArea.LeftDockWidgetArea, d["Inputs"])
        w.splitDockWidget(d["Inputs"], d["Weights"], Qt.Orientation.Vertical)
        first = d[plan.centre[0]]
        w.addDockWidget(Qt.DockWidgetArea.RightDockWidgetArea, first)
        # Split before tabifying: a dock split from one in a tab group would join it.
        above = first
        for k, cell in enumerate(plan.right):
            beside = Qt.Orientation.Vertical if k else Qt.Orientation.Horizontal
            w.splitDockWidget(above, d[cell[0]], beside)
            above = d[cell[0]]
        for cell in (plan.centre, *plan.right):
            for title in cell[1:]:
                w.tabifyDockWidget(d[cell[0]], d[title])
        shown = set(plan.docks)
        for title, dock in d.items():
            if title not in shown:  # closed; View → its name opens it beside the views
                w.tabifyDockWidget(first, dock)
            dock.setVisible(title in shown)
        for title in (plan.centre[0], *(cell[0] for cell in plan.right)):
            d[title].raise_()
        w.resize(size)
        self._size(plan)
        self._whole_tab_titles()

    def _size(self, plan: Plan) -> None:
        w, d = self.window, self.docks
        compact = w.width() < 1400
        left, right = (380, plan.right_width[0]) if compact else (400, plan.right_width[1])
        centre, top = d[plan.centre[0]], d[plan.right[0][0]]
        middle = max(400, w.width() - left - right)
        w.resizeDocks([d["Inputs"], centre, top], [left, middle, right], Qt.Orientation.Horizontal)
        inputs = 250 if compact else 300
        w.resizeDocks([d["Inputs"], d["Weights"]], [inputs, 500], Qt.Orientation.Vertical)
        if len(plan.right) > 1:
            cells = [d[cell[0]] for cell in plan.right]
            w.resizeDocks(cells, list(plan.heights[: len(cells)]), Qt.Orientation.Vertical)

    def _whole_tab_titles(self) -> None:
        """Dock tabs show their whole titles (Qt would cut them down to "Pipel…", "He…");
        a dock dropped beside another makes a new tab bar, hence also after a move."""
        for bar in self._tab_bars():
            bar.setElideMode(Qt.TextElideMode.ElideNone)
            bar.setUsesScrollButtons(True)

    def tidy_later(self) -> None:
        QTimer.singleShot(0, self._whole_tab_titles)
