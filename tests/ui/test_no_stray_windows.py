"""No view ever shows as a window of its own: a widget made without a parent and shown
before it joins a layout flashes up as a separate window (and takes the keyboard focus
from the main window, so typing goes nowhere). Seen with the Pipeline's RoPE views."""

from __future__ import annotations

import pytest
from PySide6.QtCore import QEvent, QObject
from PySide6.QtWidgets import QApplication, QDialog, QInputDialog, QMenu
from waiting import settle

from attnviz.core.presets import PRESETS


class WindowsShown(QObject):
    """Records every top-level widget shown that is not the main window, a dialog or a
    menu (tool tips and combo box lists are popups, also left out)."""

    def __init__(self, main):
        super().__init__()
        self.main, self.seen = main, []

    def eventFilter(self, obj, event):
        if (
            event.type() == QEvent.Type.Show
            and obj.isWidgetType()
            and obj.isWindow()
            and obj is not self.main
            and not isinstance(obj, (QDialog, QMenu))
            and not obj.windowType() & 0x8  # Qt.Popup and Qt.ToolTip share this bit
        ):
            self.seen.append(f"{type(obj).__name__} {getattr(obj, 'name', '')}".strip())
        return False


@pytest.fixture
def watched(shown_window, qtbot, monkeypatch):
    monkeypatch.setattr(QInputDialog, "getInt", lambda *a, **k: (12, True))
    window = shown_window()
    spy = WindowsShown(window)
    QApplication.instance().installEventFilter(spy)
    yield window, spy
    QApplication.instance().removeEventFilter(spy)


def test_every_preset_in_every_dock_shows_no_window_of_its_own(watched, qtbot):
    window, spy = watched
    for name in PRESETS:
        window.load_preset(name)
        settle(qtbot, window)
        for title in window.docks:
            window.bring_forward((title,))
            settle(qtbot, window)
        window.view_state.set_head(window.compute.result.n_heads - 1)
        settle(qtbot, window)
        assert spy.seen == [], name
    assert QApplication.activeWindow() is window
