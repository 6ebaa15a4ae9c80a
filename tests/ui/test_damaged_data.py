"""Whatever the data folder holds, the window starts; nothing the user made is lost.

Each test damages the autosave in a temporary data folder, then starts a window on it as
the app does after a crash (MainWindow, then offer_restore): one dialog says why, damaged
files are renamed aside (never deleted), and nothing blocks (SIGALRM fails a hang).
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
from hang_guard import within
from PySide6.QtCore import QSettings
from PySide6.QtWidgets import QApplication, QMessageBox

from attnviz.core.io import files
from attnviz.core.presets import worked_example
from attnviz.core.session import SetCells

pytestmark = [
    pytest.mark.skipif(os.name != "posix", reason="named pipes and signals: POSIX"),
    pytest.mark.usefixtures("answers"),
]
Button = QMessageBox.StandardButton
UNDECODABLE = os.fsdecode(b"caf\xe9 \xff.attn.json")
SHOWN = "caf\ufffd \ufffd.attn.json"


@pytest.fixture
def questions(monkeypatch):
    """Record "Restore unsaved work?" questions and answer them with answer[0]."""
    asked: list[str] = []
    answer = [Button.Yes]

    def question(parent, title, text, *args, **kwargs):
        asked.append(text)
        return answer[0]

    monkeypatch.setattr(QMessageBox, "question", question)
    return asked, answer


@pytest.fixture
def data(tmp_path) -> Path:
    folder = tmp_path / "data"
    folder.mkdir()
    return folder


def good_snapshot(data: Path) -> None:
    s = worked_example().with_cells("X", None, 0, 0, np.array([[0.125]]))
    files.save_snapshot(data / "autosave.npz", s)


def edit(doc, value: float) -> None:
    doc.push(SetCells(doc.session, "X", None, 0, 0, np.array([[value]])))


def start(make_window, settings_name: str = "settings.ini"):
    """A window as the app starts it after a crash; what offer_restore returned."""
    with within(10):
        window = make_window(settings_name=settings_name)
        window.show()
        restored = window.offer_restore()
    return window, restored


def aside(data: Path, name: str) -> list[Path]:
    return sorted(data.glob(f"{name}.damaged-*"))


def is_worked_example(window) -> bool:
    return window.doc.scenario.X.tobytes() == worked_example().X.tobytes()


# A damaged snapshot: one warning, the files set aside, a clean start ------------------------


def damage(kind: str, path: Path) -> None:
    if kind == "random bytes":
        path.write_bytes(os.urandom(2048))
    elif kind == "pickle":
        path.write_bytes(b"\x80\x04\x95" + os.urandom(64))
    elif kind == "directory":
        path.mkdir()
        (path / "inside.txt").write_text("keep me", "utf-8")
    elif kind == "named pipe":
        os.mkfifo(path)
    elif kind == "zip bomb":  # X unpacks to 128 MiB of zeros: refused before it is read
        files.save_snapshot(path, worked_example())
        with zipfile.ZipFile(path) as z:
            names = {i.filename: z.read(i) for i in z.infolist()}
        with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as z:
            for name, member in names.items():
                if name != "X.npy":
                    z.writestr(name, member)
            with z.open("X.npy", "w", force_zip64=True) as x:
                header = {"descr": "<f8", "fortran_order": False, "shape": (4097, 4096)}
                np.lib.format.write_array_header_1_0(x, header)
                for _ in range(4097 * 4096 * 8 // 2**20):
                    x.write(bytes(2**20))
                x.write(bytes(4097 * 4096 * 8 % 2**20))


NPZ_DAMAGE = {
    "random bytes": "not an attnviz snapshot",
    "pickle": "not an attnviz snapshot",
    "directory": "a directory, not a regular file",
    "named pipe": "a named pipe, not a regular file",
    "zip bomb": "member 'X': 4097×4096; expected matrices of at most 16777216 cells",
}


@pytest.mark.parametrize("kind", NPZ_DAMAGE)
@pytest.mark.parametrize("origin", ["good", "named pipe", "directory"])
def test_a_damaged_snapshot_is_set_aside_and_the_window_starts_clean(
    make_window, data, tmp_path, questions, warnings_shown, kind, origin
):
    damage(kind, data / "autosave.npz")
    if origin == "good":
        (data / "autosave.origin").write_bytes(os.fsencode(tmp_path / "mine.attn.json"))
    else:
        damage(origin, data / "autosave.origin")
    window, restored = start(make_window)

    assert not restored and window.isVisible()
    assert questions[0] == []  # nothing to restore, so nothing to ask
    assert len(warnings_shown) == 1
    title, text = warnings_shown[0]
    assert title == "Cannot restore"
    assert "autosave.npz" in text and NPZ_DAMAGE[kind] in text
    assert "allow_pickle" not in text and "pickle=" not in text
    kept = aside(data, "autosave.npz") + aside(data, "autosave.origin")
    assert len(kept) == 2 and all(p.name in text for p in kept)
    assert not os.path.lexists(data / "autosave.npz")
    assert not os.path.lexists(data / "autosave.origin")
    if kind == "directory":
        assert (kept[0] / "inside.txt").read_text("utf-8") == "keep me"
    assert is_worked_example(window) and window.doc.path is None

    window.close()
    _, restored = start(make_window, "second.ini")  # the next start: nothing offered
    assert not restored and len(warnings_shown) == 1 and questions[0] == []


def test_a_snapshot_that_cannot_be_moved_aside_is_still_no_crash(
    make_window, data, questions, warnings_shown, monkeypatch
):
    damage("random bytes", data / "autosave.npz")

    def refuse(self, target):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "rename", refuse)
    window, restored = start(make_window)
    assert not restored and window.isVisible() and len(warnings_shown) == 1
    assert "could not be moved aside: Permission denied" in warnings_shown[0][1]


# A damaged origin: the work is still offered, and the question says what was lost -----------


@pytest.mark.parametrize("kind", ["named pipe", "directory"])
def test_a_damaged_origin_is_set_aside_and_the_work_restored_untitled(
    make_window, data, questions, warnings_shown, kind
):
    good_snapshot(data)
    damage(kind, data / "autosave.origin")
    window, restored = start(make_window)

    assert restored and window.isVisible() and warnings_shown == []
    assert len(questions[0]) == 1
    assert "autosave.origin" in questions[0][0] and f"a {kind}" in questions[0][0]
    kept = aside(data, "autosave.origin")
    assert len(kept) == 1 and kept[0].name in questions[0][0]
    assert window.doc.scenario.X[0, 0] == 0.125 and window.doc.path is None
    assert window.isWindowModified()


def test_declining_a_restore_with_a_damaged_origin_keeps_it_aside(
    make_window, data, questions, warnings_shown
):
    good_snapshot(data)
    damage("directory", data / "autosave.origin")
    questions[1][0] = Button.No
    _, restored = start(make_window)
    assert not restored and warnings_shown == []
    assert not os.path.lexists(data / "autosave.npz")  # declined: the copy is dropped
    assert len(aside(data, "autosave.origin")) == 1  # but not what we never wrote


@pytest.mark.parametrize("content", [b"relative/name.attn.json", b"/a\0b", b"\x8f\xff\x00junk"])
def test_an_origin_that_is_no_file_path_is_set_aside(
    make_window, data, questions, warnings_shown, content
):
    good_snapshot(data)
    (data / "autosave.origin").write_bytes(content)
    window, restored = start(make_window)
    assert restored and window.doc.path is None and warnings_shown == []
    assert len(aside(data, "autosave.origin")) == 1


def test_an_origin_not_utf8_is_a_file_name_and_restores_exactly(
    make_window, data, tmp_path, questions, warnings_shown
):
    path = tmp_path / UNDECODABLE
    files.save_scenario(path, worked_example())
    good_snapshot(data)
    (data / "autosave.origin").write_bytes(os.fsencode(path))
    window, restored = start(make_window)

    assert restored and warnings_shown == [] and len(questions[0]) == 1
    assert window.doc.path == path
    assert window.windowTitle() == f"{SHOWN}[*] — attnviz"
    assert window.doc.scenario.X[0, 0] == 0.125
    window.doc.undo_stack.undo()  # back to what the file holds
    assert is_worked_example(window) and not window.isWindowModified()


def test_a_stray_origin_without_a_snapshot_is_cleared(make_window, data, questions, qtbot):
    damage("directory", data / "autosave.origin")
    window, restored = start(make_window)
    assert not restored and questions[0] == []
    assert len(aside(data, "autosave.origin")) == 1
    edit(window.doc, 0.5)
    window.autosave()
    qtbot.waitUntil(lambda: (data / "autosave.origin").is_file())  # autosave works again


# Names that are not UTF-8: title, recent files, autosave ----------------------------------


def test_a_file_named_in_bytes_that_are_not_utf8_works_everywhere(
    make_window, tmp_path, data, qtbot, questions, warnings_shown
):
    path = tmp_path / UNDECODABLE
    files.save_scenario(path, worked_example())
    first = make_window()
    first.show()
    assert first.files.open_path(path)
    assert first.windowTitle() == f"{SHOWN}[*] — attnviz"
    assert first.statusBar().currentMessage() == f"Opened {SHOWN}"
    assert first.files.recent_files()[0] == str(path)
    first.recent_menu.aboutToShow.emit()
    assert first.recent_menu.actions()[0].text() == str(path.parent / SHOWN)

    edit(first.doc, 0.5)
    first.autosave()
    qtbot.waitUntil(lambda: (data / "autosave.origin").exists())
    qtbot.waitUntil(lambda: (data / "autosave.origin").read_bytes() == os.fsencode(path))

    second = make_window(settings_name="settings.ini")  # same settings: the recent list
    second.show()
    assert second.offer_restore()
    assert second.doc.path == path and second.doc.scenario.X[0, 0] == 0.5
    assert second.files.recent_files()[0] == str(path)
    second.recent_menu.aboutToShow.emit()
    second.doc.undo_stack.setClean()
    second.recent_menu.actions()[0].trigger()
    assert second.doc.path == path and is_worked_example(second)
    assert warnings_shown == []


def test_recent_files_keep_valid_names_as_text(make_window, tmp_path):
    window = make_window()
    window.files._add_recent(tmp_path / "plain.attn.json")
    window.files._add_recent(tmp_path / UNDECODABLE)
    raw = QSettings(str(tmp_path / "settings.ini"), QSettings.Format.IniFormat)
    window.settings.sync()
    value = raw.value("recent")
    assert value[1] == str(tmp_path / "plain.attn.json")
    assert window.files.recent_files() == [
        str(tmp_path / UNDECODABLE),
        str(tmp_path / "plain.attn.json"),
    ]


# Autosave failures: reported once, never swallowed ------------------------------------------


def test_an_autosave_failure_is_reported_once_then_again_after_a_success(make_window, data, qtbot):
    window = make_window()
    window.show()
    (data / "autosave.npz").mkdir()
    reports: list[str] = []
    window.autosaver.failed.connect(reports.append)
    for value in (0.5, 0.25, 0.75):
        edit(window.doc, value)
        window.autosave()
    qtbot.waitUntil(lambda: len(reports) == 1)
    window.autosaver.clear()  # waits for the writer; the directory is set aside
    qtbot.wait(50)
    assert reports == [f"Autosave failed: {data / 'autosave.npz'}: a directory, not a regular file"]
    assert window.statusBar().currentMessage() == reports[0]
    assert len(aside(data, "autosave.npz")) == 1

    edit(window.doc, 0.125)
    window.autosave()
    qtbot.waitUntil(lambda: (data / "autosave.origin").is_file())  # written after the .npz
    (data / "autosave.origin").unlink()
    (data / "autosave.origin").mkdir()
    edit(window.doc, 0.0625)
    window.autosave()
    qtbot.waitUntil(lambda: len(reports) == 2)  # a new failure after a success: reported
    assert "autosave.origin: a directory, not a regular file" in reports[1]


def test_an_origin_that_cannot_be_encoded_is_no_longer_skipped(make_window, data, tmp_path, qtbot):
    window = make_window()
    path = tmp_path / UNDECODABLE
    files.save_scenario(path, worked_example())
    assert window.files.open_path(path)
    reports: list[str] = []
    window.autosaver.failed.connect(reports.append)
    edit(window.doc, 0.5)
    window.autosave()
    qtbot.waitUntil(lambda: (data / "autosave.origin").exists())
    window.autosaver.clear()
    assert reports == []


# Temporary files of killed autosaves ---------------------------------------------------------


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_stale_autosave_temp_files_are_removed_on_start(make_window, data):
    gone = dead_pid()
    stale = [
        f".autosave.npz.attnviz-{gone}-abcd1234.tmp",
        f".autosave.origin.attnviz-{gone}-x1y2z3w4.tmp",
    ]
    kept = [
        f".autosave.npz.attnviz-{os.getpid()}-abcd1234.tmp",  # ours, in progress
        f".other.npz.attnviz-{gone}-abcd1234.tmp",
        "notes.txt",
    ]
    for name in stale + kept:
        (data / name).write_bytes(b"x" * 1000)
    window = make_window()
    assert sorted(os.listdir(data)) == sorted(kept)
    assert not window.offer_restore()


# The app: a named file still gets the crash's work offered first -----------------------------


def test_starting_on_a_file_offers_the_autosave_first(
    monkeypatch, tmp_path, data, questions, answers, warnings_shown
):
    from attnviz.ui import app as app_module
    from attnviz.ui.main_window import MainWindow

    good_snapshot(data)
    path = tmp_path / "other.attn.json"
    files.save_scenario(path, worked_example())
    monkeypatch.setattr(
        app_module,
        "user_settings",
        lambda: QSettings(str(tmp_path / "app.ini"), QSettings.Format.IniFormat),
    )
    monkeypatch.setattr(app_module, "data_dir", lambda: data)
    monkeypatch.setattr(QApplication, "exec", lambda self: 0)
    answers.queue(Button.Cancel)  # keep the restored work rather than open the file
    before = set(QApplication.topLevelWidgets())
    try:
        with within(20):
            assert app_module.run(str(path)) == 0
        window = next(
            w
            for w in QApplication.topLevelWidgets()
            if isinstance(w, MainWindow) and w not in before
        )
        assert len(questions[0]) == 1
        assert answers.texts == ["Save the changes to the untitled scenario?"]
        assert window.doc.scenario.X[0, 0] == 0.125 and window.isWindowModified()
    finally:
        for w in set(QApplication.topLevelWidgets()) - before:
            if isinstance(w, MainWindow):
                w.doc.undo_stack.setClean()
                w.close()
                w.deleteLater()


# Open, Import and Save on what is not a regular file ---------------------------------------


def test_open_import_and_save_refuse_a_named_pipe_at_once(
    make_window, tmp_path, warnings_shown, monkeypatch
):
    window = make_window()
    for name in ("p.attn.json", "p.csv"):
        os.mkfifo(tmp_path / name)
    with within(10):
        assert not window.files.open_path(tmp_path / "p.attn.json")
        assert not window.files.import_matrix_from(window.inputs.grid, tmp_path / "p.csv")
        monkeypatch.setattr(
            "PySide6.QtWidgets.QFileDialog.getSaveFileName",
            lambda *a, **k: (str(tmp_path / "p.attn.json"), ""),
        )
        assert not window.files.save_as()
    pipe = "a named pipe, not a regular file"
    assert warnings_shown == [
        ("Cannot open the file", f"{tmp_path / 'p.attn.json'}: cannot read: {pipe}"),
        ("Cannot import the matrix", f"{tmp_path / 'p.csv'}: cannot read: {pipe}"),
        ("Cannot save", f"{tmp_path / 'p.attn.json'}: {pipe}"),
    ]
    assert is_worked_example(window) and window.doc.path is None
