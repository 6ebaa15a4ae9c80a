"""The window fits the screen it opens on, whatever size it remembers."""

from __future__ import annotations

import pytest
from PySide6.QtCore import QRect

pytestmark = pytest.mark.usefixtures("warnings_shown", "answers")


def room(window) -> QRect:
    return window.screen().availableGeometry()


def shown(window, qtbot) -> None:
    window.show()
    qtbot.waitExposed(window)
    qtbot.waitUntil(lambda: room(window).contains(window.frameGeometry()))


def test_a_new_window_fits_the_screen_and_every_dock_is_inside_it(make_window, qtbot):
    window = make_window()
    shown(window, qtbot)
    screen = room(window)
    assert window.frameGeometry().width() <= screen.width()
    assert window.frameGeometry().height() <= screen.height()
    inside = window.rect()
    for title in ("Inputs", "Weights", "Pipeline", "Lesson", "Inspector"):
        dock = window.docks[title]
        assert dock.isVisible(), title
        box = dock.geometry()
        assert inside.contains(box), (title, box, inside)
    assert inside.contains(window.statusBar().geometry())


def test_a_remembered_geometry_larger_than_the_screen_is_clamped(make_window, qtbot):
    first = make_window()
    first.show()
    qtbot.waitExposed(first)
    screen = room(first)
    first.setGeometry(screen.x() + 500, screen.y() + 400, screen.width() * 2, screen.height() * 2)
    first.save_layout()
    first.close()

    second = make_window()  # same settings file
    shown(second, qtbot)
    frame = second.frameGeometry()
    assert frame.width() <= screen.width() and frame.height() <= screen.height()
    assert screen.contains(frame), (frame, screen)


def test_the_default_size_fills_a_large_screen_no_more_than_asked(make_window):
    window = make_window()
    screen = room(window)
    assert window.width() == min(
        1400, screen.width() - (window.frameGeometry().width() - window.width())
    )


def test_the_toolbar_toggles_are_check_boxes_that_follow_the_settings(make_window, qtbot):
    window = make_window()
    projections, scale = (window.toggles[a] for a in (window.act_projections, window.act_scale))
    assert projections.isChecked() and scale.isChecked()
    scale.click()
    assert window.doc.scenario.settings.scale is False and not scale.isChecked()
    window.doc.undo_stack.undo()
    assert window.doc.scenario.settings.scale is True and scale.isChecked()
    window.lesson.go(0)  # stage 1: no projections, no scaling
    assert not projections.isChecked() and not scale.isChecked()
