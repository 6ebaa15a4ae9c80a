"""Shared test set-up: Qt runs offscreen; windows get throw-away settings and data folders."""

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest


@pytest.fixture
def make_window(qtbot, tmp_path):
    """Build MainWindows with settings and autosave under tmp_path (closed at the end)."""
    from PySide6.QtCore import QSettings

    from attnviz.ui.main_window import MainWindow

    def make(doc=None, settings_name="settings.ini"):
        settings = QSettings(str(tmp_path / settings_name), QSettings.Format.IniFormat)
        window = MainWindow(settings, tmp_path / "data", doc)
        # No unsaved-changes prompt when pytest-qt closes the window at teardown.
        qtbot.addWidget(window, before_close_func=lambda w: w.doc.undo_stack.setClean())
        return window

    return make
