"""Shared test set-up: Qt runs offscreen; windows get throw-away settings and data folders."""

import os
from pathlib import Path

# Offscreen, on a screen of a common laptop size (Qt's own offscreen screen is 800 × 800).
if os.environ.get("QT_QPA_PLATFORM", "offscreen") == "offscreen":
    screen = Path(__file__).with_name("screen-1440x900.json")
    os.environ["QT_QPA_PLATFORM"] = f"offscreen:configfile={screen}"

import pytest


@pytest.fixture
def make_window(qtbot, tmp_path):
    """Build MainWindows with settings and autosave under tmp_path (closed at the end)."""
    from PySide6.QtCore import QSettings

    from attnviz.ui.main_window import MainWindow

    def make(scenario=None, settings_name="settings.ini"):
        settings = QSettings(str(tmp_path / settings_name), QSettings.Format.IniFormat)
        window = MainWindow(settings, tmp_path / "data", scenario)
        # No unsaved-changes prompt when pytest-qt closes the window at teardown.
        qtbot.addWidget(window, before_close_func=lambda w: w.doc.undo_stack.setClean())
        return window

    return make
