"""Workspaces: a few named arrangements of the docks, one click or Ctrl+1…5 each, every view
tab in sight at 1280×720 and 1440×900, the user's changes remembered and resettable."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QAction
from PySide6.QtWidgets import QApplication, QTabBar, QToolButton

from attnviz.core.lessons import STAGES

NAMES = ("Learn", "Current models", "Real models", "Kernels", "Train")
SIZES = ((1280, 720), (1440, 900))


def settle(window) -> None:
    for _ in range(10):
        QApplication.processEvents()
    window.compute.wait()


def button(window, name: str) -> QToolButton:
    """The workspace's button, found by its text where a newcomer sees it."""
    corner = window.menuBar().cornerWidget(Qt.Corner.TopRightCorner)
    found = [b for b in corner.findChildren(QToolButton) if b.text() == name]
    assert len(found) == 1 and found[0].isVisible()
    return found[0]


def shown_docks(window) -> set[str]:
    return {title for title, dock in window.docks.items() if dock.isVisible()}


def dock_tab_titles(window) -> list[tuple[QTabBar, list[str]]]:
    bars = [b for b in window.findChildren(QTabBar) if b.parent() is window and b.isVisible()]
    return [(bar, [bar.tabText(i) for i in range(bar.count())]) for bar in bars]


@pytest.fixture
def sized_window(make_window, qtbot):
    def make(width: int, height: int):
        window = make_window()
        window.resize(width, height)
        window.show()
        qtbot.waitExposed(window)
        settle(window)
        assert width - 10 <= window.width() <= width and height - 10 <= window.height() <= height
        return window

    return make


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_every_workspace_shows_every_view_tab_whole_and_in_sight(sized_window, size):
    window = sized_window(*size)
    assert button(window, "Learn").isChecked()  # a newcomer starts learning
    every: set[str] = set()
    for name in NAMES + NAMES:  # made, then as remembered
        button(window, name).click()
        settle(window)
        assert button(window, name).isChecked()
        assert sum(button(window, other).isChecked() for other in NAMES) == 1
        shown = shown_docks(window)
        assert {"Inputs", "Weights"} <= shown and 6 <= len(shown) <= 10, shown
        titles = [t for _, tabs in dock_tab_titles(window) for t in tabs]
        assert set(titles) <= shown and len(titles) == len(set(titles))  # no stale tab bar
        for bar, tabs in dock_tab_titles(window):
            for i, text in enumerate(tabs):
                rect = bar.tabRect(i)  # whole, inside its bar: no scroll arrows needed
                assert rect.left() >= 0 and rect.right() < bar.width(), (name, text)
                assert bar.fontMetrics().horizontalAdvance(text) < rect.width()
        for title in shown:  # each dock in sight (not behind a tab) inside the window
            dock = window.docks[title]
            if not dock.visibleRegion().isEmpty():
                assert window.rect().contains(dock.geometry()), (name, title)
        every |= shown
    assert every == set(window.docks)  # every dock belongs to a workspace
    assert "Timing" in every


def test_shortcuts_switch_workspaces_and_each_remembers_its_changes(make_window, qtbot):
    window = make_window()
    window.show()
    qtbot.waitExposed(window)
    settle(window)
    learn = shown_docks(window)
    window.docks["Masks"].close()  # the user's own change to Learn
    qtbot.keyClick(window, Qt.Key.Key_4, Qt.KeyboardModifier.ControlModifier)
    settle(window)
    assert button(window, "Kernels").isChecked()
    assert {"Tiling", "Timing"} <= shown_docks(window) and "Masks" not in shown_docks(window)
    qtbot.keyClick(window, Qt.Key.Key_1, Qt.KeyboardModifier.ControlModifier)
    settle(window)
    assert shown_docks(window) == learn - {"Masks"}  # as the user left it
    reset = next(a for a in window.findChildren(QAction) if a.text() == "&Reset Workspace")
    reset.trigger()
    settle(window)
    assert shown_docks(window) == learn


def test_the_workspace_and_its_changes_persist_between_windows(make_window, qtbot):
    first = make_window()
    first.show()
    qtbot.waitExposed(first)
    button(first, "Current models").click()
    first.docks["RoPE"].close()
    changed = shown_docks(first)
    assert first.close()

    second = make_window()  # the same settings file
    second.show()
    qtbot.waitExposed(second)
    settle(second)
    assert button(second, "Current models").isChecked()
    assert shown_docks(second) == changed


@pytest.mark.parametrize(
    "stage", [s for s in STAGES if s.number in (1, 8, 9)], ids=lambda s: str(s.number)
)
def test_a_lesson_stage_switches_to_the_workspace_that_has_its_docks(make_window, qtbot, stage):
    window = make_window()
    window.show()
    qtbot.waitExposed(window)
    button(window, "Real models").click()
    window.lesson.go(stage.number - 1)
    settle(window)
    shown = shown_docks(window)
    assert {*stage.docks, "Lesson"} <= shown
    checked = [name for name in NAMES if button(window, name).isChecked()]
    assert checked == [{1: "Learn", 8: "Current models", 9: "Kernels"}[stage.number]]
    first = window.docks[stage.docks[0]]
    assert not first.visibleRegion().isEmpty()  # raised over its tab neighbours


def test_at_1280x720_the_first_view_shows_all_of_x_and_the_masks_need_no_scrolling(
    sized_window,
):
    window = sized_window(1280, 720)
    grid = window.inputs.grid
    rows = grid.model().rowCount()
    assert rows == 4
    for row in range(rows):  # every row of X whole in its grid
        top = grid.rowViewportPosition(row)
        assert top >= 0 and top + grid.rowHeight(row) <= grid.viewport().height(), row

    window.docks["Masks"].raise_()
    settle(window)
    scroll = window.docks["Masks"].widget()
    assert not scroll.verticalScrollBar().isVisible()
    assert not scroll.horizontalScrollBar().isVisible()
    table = window.masks.table
    for row in range(table.model().rowCount()):  # the summary table's rows in sight
        top = table.rowViewportPosition(row)
        assert top >= 0 and top + table.rowHeight(row) <= table.viewport().height(), row


def test_real_models_without_a_model_offers_the_import(make_window, qtbot, monkeypatch):
    from PySide6.QtWidgets import QDialog, QPushButton

    from attnviz.ui import model_import

    opened: list[str] = []
    monkeypatch.setattr(
        model_import.ImportDialog,
        "exec",
        lambda self: opened.append(self.windowTitle()) or QDialog.DialogCode.Rejected,
    )
    window = make_window()
    window.show()
    qtbot.waitExposed(window)
    button(window, "Real models").click()
    settle(window)
    overview = window.panel("Overview")
    offer = [b for b in overview.findChildren(QPushButton) if b.text() == "Import Model Layer…"]
    assert len(offer) == 1 and offer[0].isVisible()
    offer[0].click()
    assert len(opened) == 1  # the import dialog, cancelled: nothing changed
    assert window.doc.scenario.provenance is None
