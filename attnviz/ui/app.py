"""Start the desktop application."""

from __future__ import annotations

import gc
import sys
from pathlib import Path

from PySide6.QtCore import QSettings, QStandardPaths, QTimer
from PySide6.QtGui import QIcon
from PySide6.QtWidgets import QApplication

from attnviz.assets import APP_ID, ICON_SVG, resource

APP_NAME = "attnviz"


def make_app() -> QApplication:
    """The QApplication, created once, with the names settings and data folders use."""
    app = QApplication.instance()
    if app is None:
        app = QApplication(sys.argv[:1])
    app.setApplicationName(APP_NAME)
    app.setOrganizationName(APP_NAME)
    assert isinstance(app, QApplication)
    app.setDesktopFileName(APP_ID)  # matches packaging/<APP_ID>.desktop
    app.setWindowIcon(QIcon(str(resource(*ICON_SVG))))
    return app


def user_settings() -> QSettings:
    return QSettings(QSettings.Format.IniFormat, QSettings.Scope.UserScope, APP_NAME, APP_NAME)


def data_dir() -> Path:
    return Path(QStandardPaths.writableLocation(QStandardPaths.StandardLocation.AppDataLocation))


def freeze_startup_objects() -> None:
    """Keep what startup made (modules, widgets, caches: alive until the app quits) out of
    every later garbage collection: a full collection walked all of it, ~40 ms in the
    middle of an edit, and each younger one took twice as long."""
    gc.collect()
    gc.freeze()


def run(path: str | None = None) -> int:
    """Open the window (on a file, if given) and run until it closes."""
    app = make_app()
    from attnviz.ui.main_window import MainWindow

    window = MainWindow(user_settings(), data_dir())
    window.show()
    # Work left by a crash is offered first, even when a file is named: opening it then
    # asks before dropping the restored work, where it would otherwise be overwritten.
    restored = window.offer_restore()
    if path is not None:
        window.files.open_path(Path(path), ask=restored)
    QTimer.singleShot(0, freeze_startup_objects)  # once the window is on screen
    return app.exec()
