"""The window from Python: ``show(scenario)`` from a script (blocks until it closes) or
from IPython and Jupyter with Qt's event loop on (``%gui qt``: returns at once).

Qt is imported when a window or a PNG is asked for, never when attnviz is imported.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from PySide6.QtWidgets import QApplication

    from attnviz.ui.main_window import MainWindow

QT_LOOPS = ("qt", "qt5", "qt6", "pyside6")  # IPython's names for Qt's event loop
_shown: list[Any] = []  # windows shown without blocking: kept alive while they are open


def qt_app() -> QApplication:
    """The process's QApplication, made as the window makes it when there is none. On
    Linux without a display, the offscreen platform (figures render; nothing shows)."""
    from PySide6.QtWidgets import QApplication

    app = QApplication.instance()
    if app is None:
        headless = not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))
        if sys.platform.startswith("linux") and headless:
            os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
        from attnviz.ui.app import make_app

        return make_app()
    if not isinstance(app, QApplication):
        raise RuntimeError(
            f"a {type(app).__name__} is running; attnviz's window needs a QApplication"
        )
    return app


def loop_running() -> bool:
    """Whether Qt's event loop runs already: inside it (a Qt program's callback), or
    IPython's Qt integration (``%gui qt``) drives it between cells."""
    from PySide6.QtCore import QThread

    if QThread.currentThread().loopLevel() > 0:
        return True
    shell = _ipython()
    return shell is not None and str(getattr(shell, "active_eventloop", None)) in QT_LOOPS


def _ipython() -> Any:
    """The running IPython shell, or None (IPython is never imported here)."""
    module = sys.modules.get("IPython")
    get = getattr(module, "get_ipython", None)
    return get() if get is not None else None


def show(source: Any = None, *, block: bool | None = None) -> MainWindow:
    """Open attnviz's window on a scenario (or a Computation, or an imported or captured
    layer; nothing: the worked example) and return it.

    ``block``: run Qt's event loop until the window closes. By default it blocks unless
    the loop runs already (IPython or Jupyter after ``%gui qt``, or a Qt program), where
    the window opens and the call returns at once. The window keeps the user's settings
    and autosave, as ``attnviz`` started from a shell does.
    """
    from attnviz.api.figures import scenario_of

    scenario = None if source is None else scenario_of(source)
    app = qt_app()
    from attnviz.ui.app import data_dir, user_settings
    from attnviz.ui.main_window import MainWindow

    window = MainWindow(user_settings(), data_dir(), scenario)
    window.show()
    window.raise_()
    if block is None:
        block = not loop_running()
    if block:
        app.exec()
    else:
        _shown[:] = [w for w in _shown if _alive(w)] + [window]
    return window


def _alive(window: Any) -> bool:
    from shiboken6 import isValid

    return bool(isValid(window)) and bool(window.isVisible())
