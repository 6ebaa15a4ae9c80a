"""Window chrome: it fits the screen it opens on; toolbar and menus speak the user's words."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

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


def test_presets_are_offered_by_their_titles_and_load_by_them(make_window):
    from attnviz.core.presets import PRESETS

    window = make_window()
    menu = next(a.menu() for a in window.menuBar().actions() if a.text() == "&Presets")
    texts = [a.text() for a in menu.actions()]
    assert texts == [p.title for p in PRESETS.values()]
    assert not set(texts) & set(PRESETS)  # no raw ids such as "stage-1-simple"
    box = window.preset_box
    k = [box.itemText(i) for i in range(box.count())].index("Lesson 1: simple self-attention")
    box.activated.emit(k)
    assert window.doc.scenario.settings.projections is False
    assert window.doc.undo_stack.undoText() == "Preset Lesson 1: simple self-attention"
    assert box.currentIndex() == 0


def test_objects_made_at_startup_are_kept_out_of_later_garbage_collections(tmp_path):
    """Once the window is up, run() freezes what startup made: later collections walk
    only what came after (a full one walked everything, ~40 ms in the middle of an edit)."""
    code = textwrap.dedent(
        """
        import gc, os
        os.environ["QT_QPA_PLATFORM"] = "offscreen"
        from PySide6.QtCore import QTimer
        from attnviz.ui.app import make_app, run
        app = make_app()
        def check():
            print("frozen", gc.get_freeze_count(), flush=True)
            for window in app.topLevelWidgets():
                if hasattr(window, "doc"):
                    window.doc.undo_stack.setClean()
            app.quit()
        QTimer.singleShot(1500, check)
        run()
        """
    )
    env = dict(os.environ, HOME=str(tmp_path), XDG_CONFIG_HOME=str(tmp_path / "config"))
    env["XDG_DATA_HOME"] = str(tmp_path / "data")
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env
    )
    frozen = [line for line in done.stdout.splitlines() if line.startswith("frozen")]
    assert frozen, done.stderr[-2000:]
    assert int(frozen[0].split()[1]) > 10_000  # the modules, widgets and caches of startup
