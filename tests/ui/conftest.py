"""Helpers for the window tests: answer modal message boxes, never hang at teardown."""

from __future__ import annotations

import contextlib
import weakref

import pytest

_WINDOWS: weakref.WeakSet = weakref.WeakSet()  # every MainWindow the tests made


@pytest.fixture(autouse=True, scope="session")
def _track_windows():
    """Remember each MainWindow made, so that teardown finds them without wrapping every
    top-level widget Qt has (tooltips, menus, dialogs Qt is deleting)."""
    from attnviz.ui.main_window import MainWindow

    original = MainWindow.__init__

    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        _WINDOWS.add(self)

    MainWindow.__init__ = init
    yield
    MainWindow.__init__ = original


def _main_windows() -> list:
    from shiboken6 import isValid

    return [w for w in list(_WINDOWS) if isValid(w)]


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_teardown(item):
    # pytest-qt closes the widgets a test registered before fixtures are torn down, so
    # make_window's own "mark clean" comes too late: a window with unsaved changes would
    # open the modal unsaved-changes prompt and block forever. Mark them clean first.
    for window in _main_windows():
        with contextlib.suppress(RuntimeError):  # the C++ object may be gone already
            window.doc.undo_stack.setClean()
    return (yield)


class Answers:
    """Click buttons in the next modal QMessageBoxes, in order, and record their texts.

    A box nobody queued an answer for is rejected after a while (and fails the test), so a
    forgotten prompt never blocks the run.
    """

    PATIENCE = 40  # polls of 25 ms

    def __init__(self) -> None:
        from PySide6.QtCore import QTimer

        self.pending: list = []
        self.texts: list[str] = []
        self.unexpected: list[str] = []
        self._waited = 0
        self.timer = QTimer()
        self.timer.setInterval(25)
        self.timer.timeout.connect(self._poll)
        self.timer.start()

    def queue(self, *buttons) -> None:
        self.pending.extend(buttons)

    def _poll(self) -> None:
        from PySide6.QtWidgets import QApplication, QMessageBox

        box = QApplication.activeModalWidget()
        if not isinstance(box, QMessageBox):
            self._waited = 0
            return
        if not self.pending:
            self._waited += 1
            if self._waited > self.PATIENCE:
                self.unexpected.append(box.text())
                box.reject()
            return
        self._waited = 0
        self.texts.append(box.text())
        button = box.button(self.pending.pop(0))
        if button is None:
            self.unexpected.append(f"no such button in: {box.text()}")
            box.reject()
        else:
            button.click()


@pytest.fixture
def answers(qtbot):
    """Answer the modal message boxes a test opens (e.g. the unsaved-changes prompt)."""
    helper = Answers()
    yield helper
    helper.timer.stop()
    assert not helper.unexpected, f"unanswered message boxes: {helper.unexpected}"
    assert not helper.pending, f"no message box came for {helper.pending}"


@pytest.fixture
def warnings_shown(monkeypatch):
    """Record QMessageBox.warning calls instead of showing them (they are modal)."""
    from PySide6.QtWidgets import QMessageBox

    shown: list[tuple[str, str]] = []

    def warning(parent, title, text, *args, **kwargs):
        shown.append((title, text))
        return QMessageBox.StandardButton.Ok

    monkeypatch.setattr(QMessageBox, "warning", warning)
    return shown


@pytest.fixture(scope="module")
def shared_window(qapp, tmp_path_factory):
    """One shown window for a whole test module (building one costs about a second).

    Each module that asks for it gets its own; its tests put it back as they need it
    (``worked_window`` below: worked example, head 1, clean undo history).
    """
    from PySide6.QtCore import QSettings

    from attnviz.ui.main_window import MainWindow

    folder = tmp_path_factory.mktemp("shared-window")
    settings = QSettings(str(folder / "settings.ini"), QSettings.Format.IniFormat)
    window = MainWindow(settings, folder / "data")
    window.show()
    yield window
    window.doc.undo_stack.setClean()
    window.close()
    window.deleteLater()


@pytest.fixture
def worked_window(shared_window):
    """The module's shared window on the worked example (untitled), head 1; left clean."""
    from attnviz.core.presets import worked_example

    shared_window.doc.reset(worked_example(), None)
    shared_window.view_state.set_head(0)
    yield shared_window
    shared_window.doc.undo_stack.setClean()


@pytest.fixture
def shown_window(make_window, qtbot):
    """A MainWindow that is shown and active, so that keys and shortcuts reach it."""

    def make(**kwargs):
        window = make_window(**kwargs)
        window.show()
        qtbot.waitExposed(window)
        with qtbot.waitActive(window):
            window.activateWindow()
        return window

    return make
