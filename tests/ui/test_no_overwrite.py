"""A one-click change that replaces the whole scenario (a lesson stage, a preset, an
example, File → New, an imported layer) never makes Save write over the user's file."""

from __future__ import annotations

import numpy as np
import pytest
from PySide6.QtGui import QAction
from PySide6.QtWidgets import QDialog, QFileDialog

from attnviz.core.io import files
from attnviz.core.presets import make_preset
from attnviz.core.session import SetCells
from attnviz.ui.examples_dialog import ExampleGallery


def _save_action(window):
    return next(a for a in window.findChildren(QAction) if a.text() == "&Save")


def _lesson(window, qtbot):
    window.lesson.next.click()


def _preset(window, qtbot):
    box = window.preset_box
    index = box.findData("llama-style")
    box.setCurrentIndex(index)
    box.activated.emit(index)


def _example(window, qtbot):
    def pick(gallery):
        gallery.list.setCurrentItem(gallery.items["softcap"])
        return QDialog.DialogCode.Accepted

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ExampleGallery, "exec", pick)
        window.open_example()


def _new(window, qtbot):
    window.files.new_document()


def _import(window, qtbot):
    pytest.importorskip("transformers")
    from tiny_models import save_tiny

    from attnviz.core.models.importer import Request

    folder = save_tiny("bert", window.data_dir.parent / "bert")
    window.models.start(Request(str(folder), "the big dog ran", 0))
    qtbot.waitUntil(lambda: not window.models.busy, timeout=60_000)
    assert window.doc.scenario.provenance is not None


PATHS = {
    "lesson": (_lesson, "lesson-1.attn.json"),
    "preset": (_preset, "llama-style.attn.json"),
    "example": (_example, "softcap.attn.json"),
    "new": (_new, "scenario.attn.json"),
    "import": (_import, "bert-layer0.attn.json"),
}

ASKS_FIRST = ("example", "new")  # they offer to save unsaved work before they replace it


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("edited", [False, True], ids=["saved", "unsaved edits"])
def test_save_after_a_whole_scenario_replacement_asks_for_a_new_name(
    make_window, qtbot, tmp_path, monkeypatch, path, edited
):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HOME", str(tmp_path))
    mine = tmp_path / "mine.attn.npz"
    scenario = make_preset("worked-example")
    files.save_scenario(mine, scenario.with_cells("X", None, 0, 0, np.full((4, 4), 0.375)))
    kept = mine.read_bytes()
    window = make_window()
    window.show()
    assert window.files.open_path(mine, ask=False)
    if edited:
        doc = window.doc
        doc.push(SetCells(doc.session, "X", None, 0, 0, np.array([[0.5]])))
        if path in ASKS_FIRST:  # answered "Discard"
            monkeypatch.setattr(window.files, "maybe_save", lambda: True)
    asked: list[str] = []
    monkeypatch.setattr(
        QFileDialog,
        "getSaveFileName",
        lambda parent, caption, proposed, *rest: asked.append(proposed) or ("", ""),
    )
    replace, proposed = PATHS[path]
    replace(window, qtbot)
    assert "mine.attn.npz" not in window.windowTitle()

    _save_action(window).trigger()  # Ctrl+S

    assert mine.read_bytes() == kept  # not a byte changed
    assert asked == [str(tmp_path / proposed)]  # Save asked for a name, proposing a new one
    # Unsaved edits not discarded are still offered for saving on close.
    assert window.isWindowModified() == ((edited and path not in ASKS_FIRST) or path == "import")
    window.doc.undo_stack.undo()
    assert window.doc.path == mine.resolve() and "mine.attn.npz" in window.windowTitle()
