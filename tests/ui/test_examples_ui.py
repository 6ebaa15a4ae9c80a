"""File → Open Example…: the gallery, its thumbnails, opening an example untitled, Save
never writing into resources/examples, lesson stages, damaged files and unsaved work.

Expected numbers come from the example files themselves and a few lines of NumPy here."""

from __future__ import annotations

import dataclasses
import json
import threading

import numpy as np
import pytest
from PySide6.QtCore import QSettings
from PySide6.QtWidgets import QDialog, QFileDialog, QMessageBox
from waiting import settle

from attnviz.core.examples import examples, find, folder
from attnviz.core.presets import worked_example
from attnviz.core.session import SetCells
from attnviz.ui import examples_dialog
from attnviz.ui.examples_dialog import NAME, SUMMARY, ExampleGallery, thumbnail_rgb

pytestmark = pytest.mark.usefixtures("answers")  # a message box nobody expects fails
DARKEST, GREY = (0x08, 0x1D, 0x58), (0xC8, 0xC8, 0xC8)  # YlGnBu's 1.0; masked keys


def weights_head_1(path) -> np.ndarray:
    """Head 1's weights from the file's numbers: softmax(X W_Q (X W_K)ᵀ / √d_k), causal."""
    data = json.loads(path.read_text())
    X, head = np.array(data["X"]), data["heads"][0]
    Q, K = X @ np.array(head["W_Q"]), X @ np.array(head["W_K"])
    S = Q @ K.T / np.sqrt(Q.shape[1])
    S[np.triu_indices_from(S, k=1)] = -np.inf
    E = np.exp(S - S.max(axis=1, keepdims=True))
    return E / E.sum(axis=1, keepdims=True)


@pytest.fixture
def window(worked_window):
    return worked_window


@pytest.fixture
def choose(monkeypatch):
    """Make the gallery pick an example and press Open instead of waiting for a user."""
    shown: list[str] = []

    def pick(name: str) -> None:
        def exec_(self):
            shown.append(name)
            self.list.setCurrentItem(self.items[name])
            self.accept()
            return self.result()

        monkeypatch.setattr(ExampleGallery, "exec", exec_)

    pick.shown = shown
    return pick


def test_the_gallery_lists_the_catalogue_by_section_and_remembers_the_last(qtbot, tmp_path):
    settings = QSettings(str(tmp_path / "s.ini"), QSettings.Format.IniFormat)
    gallery = ExampleGallery(settings)
    qtbot.addWidget(gallery)
    rows = [gallery.list.item(i) for i in range(gallery.list.count())]
    expected, section = [], None
    for e in examples():
        if e.section != section:
            section = e.section
            expected.append((section, None, None))
        expected.append((e.title, e.name, e.summary))
    assert [(r.text(), r.data(NAME), r.data(SUMMARY)) for r in rows] == expected
    assert len(examples()) == 22 and sum(r.data(NAME) is None for r in rows) == 4
    assert all(r.flags() == r.flags().NoItemFlags for r in rows if r.data(NAME) is None)
    assert all(r.flags() & r.flags().ItemIsSelectable for r in rows if r.data(NAME))
    assert gallery.chosen() == find("worked-example") and gallery.open_button.isEnabled()
    gallery.list.setCurrentItem(gallery.items["alibi"])
    gallery.accept()
    assert settings.value("examples/last") == "alibi"
    again = ExampleGallery(settings)
    qtbot.addWidget(again)
    assert again.list.currentItem() is again.items["alibi"] and again.chosen() == find("alibi")
    assert again.open_button.isEnabled()
    again.reject()


def test_thumbnails_are_made_off_the_ui_thread_and_show_head_1(qtbot, tmp_path, monkeypatch):
    monkeypatch.setattr(examples_dialog, "_THUMBNAILS", {})  # none cached yet
    threads: set[int] = set()
    original = examples_dialog.thumbnail_rgb

    def recorded(example):
        threads.add(threading.get_ident())
        return original(example)

    monkeypatch.setattr(examples_dialog, "thumbnail_rgb", recorded)
    settings = QSettings(str(tmp_path / "s.ini"), QSettings.Format.IniFormat)
    gallery = ExampleGallery(settings)
    qtbot.addWidget(gallery)
    qtbot.waitUntil(
        lambda: all(not i.icon().isNull() for i in gallery.items.values()), timeout=30000
    )
    gallery.reject()
    assert threads and threading.get_ident() not in threads
    assert set(examples_dialog._THUMBNAILS) == {e.name for e in examples()}

    worked = find("worked-example")
    w = weights_head_1(worked.path)
    assert w[0, 0] == 1.0 and np.allclose(w.sum(axis=1), 1.0)
    rgb = thumbnail_rgb(worked)
    assert rgb.shape == (4, 4, 3) and rgb.dtype == np.uint8
    assert tuple(rgb[0, 0]) == DARKEST
    above = np.triu(np.ones((4, 4), bool), k=1)
    assert (rgb[above] == GREY).all() and not (rgb[~above] == GREY).all(axis=1).any()
    luminance = rgb[~above] @ np.array([0.2126, 0.7152, 0.0722])
    assert (np.diff(luminance[np.argsort(w[~above])]) <= 0).all()  # heavier is darker
    cross = thumbnail_rgb(find("cross-attention"))
    assert cross.shape == (3, 5, 3) and not (cross == GREY).all(axis=2).any()


def test_an_example_opens_untitled_and_clean_and_undo_brings_back_the_file(window, qtbot, tmp_path):
    before = tmp_path / "before.attn.json"
    before.write_bytes(find("worked-example").path.read_bytes())
    assert window.files.open_path(before, ask=False)
    softcap = find("softcap")
    assert window.files.open_example(softcap)
    settle(qtbot, window)
    doc = window.doc
    assert doc.path is None and doc.undo_stack.isClean() and not window.isWindowModified()
    assert window.windowTitle().startswith("softcap.attn.json (example)")
    assert "untitled: Save asks where" in window.statusBar().currentMessage()
    data = json.loads(softcap.path.read_text())
    np.testing.assert_array_equal(doc.scenario.X, np.array(data["X"]))
    for key, value in data["settings"].items():  # the file's settings, the rest default
        assert getattr(doc.scenario.settings, key) == (
            tuple(value) if isinstance(value, list) else value
        )
    X, head = np.array(data["X"]), data["heads"][0]
    S = (X @ np.array(head["W_Q"])) @ (X @ np.array(head["W_K"])).T / np.sqrt(2)
    capped = 2 * np.tanh(S / 2)
    assert np.abs(S).max() > 2 > np.abs(capped).max()
    np.testing.assert_allclose(window.pipeline.views["scaled"].spec.values, capped, atol=1e-12)

    doc.undo_stack.undo()
    settle(qtbot, window)
    assert doc.path == before.resolve() and window.windowTitle().startswith("before.attn.json")
    np.testing.assert_array_equal(doc.scenario.X, worked_example().X)


def test_save_proposes_the_home_folder_and_never_writes_into_the_examples(
    window, tmp_path, monkeypatch
):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    shipped = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in folder().iterdir()}
    asked: list[tuple[str, str]] = []

    def dialog(parent, caption, proposed, filters, selected):
        asked.append((proposed, selected))
        return (str(tmp_path / "mine.attn.json"), selected) if len(asked) == 1 else ("", "")

    monkeypatch.setattr(QFileDialog, "getSaveFileName", dialog)
    assert window.files.open_example(find("softcap"))
    assert window.files.save()
    assert asked[0][0] == str(home / "softcap.attn.json")
    assert window.doc.path == (tmp_path / "mine.attn.json").resolve()
    saved = json.loads((tmp_path / "mine.attn.json").read_text())
    assert saved["X"] == json.loads(find("softcap").path.read_text())["X"]

    assert window.files.open_example(find("minilm-layer-0"))
    assert not window.files.save_as()  # the dialog is cancelled this time
    assert asked[1][0] == str(home / "minilm-layer-0.attn.npz") and "*.attn.npz" in asked[1][1]
    after = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in folder().iterdir()}
    assert after == shipped


def test_a_lesson_stage_example_shows_its_stage_in_one_undo_step(window, qtbot, choose):
    window.lesson.go(0)  # one step on the undo stack, then saved
    window.doc.undo_stack.setClean()
    window.docks["Masks"].hide()
    steps = window.doc.undo_stack.count()
    choose("stage-5-causal-mask")
    window.open_example()
    settle(qtbot, window)
    assert choose.shown == ["stage-5-causal-mask"]
    assert window.lesson.index == 4 and "The causal mask" in window.lesson.text.toPlainText()
    assert window.docks["Masks"].isVisible()
    stack = window.doc.undo_stack
    assert stack.count() == steps + 1
    assert stack.text(stack.count() - 1) == "Open example Lesson 5: the causal mask"
    assert window.windowTitle().startswith("stage-5-causal-mask.attn.json (example)")


def test_a_damaged_example_is_reported_and_changes_nothing(window, tmp_path, answers):
    softcap = find("softcap")
    bad = tmp_path / softcap.path.name
    bad.write_bytes(softcap.path.read_bytes()[:300])
    answers.queue(QMessageBox.StandardButton.Ok)
    assert not window.files.open_example(dataclasses.replace(softcap, path=bad))
    assert len(answers.texts) == 1 and answers.texts[0].startswith("softcap.attn.json: ")
    np.testing.assert_array_equal(window.doc.scenario.X, worked_example().X)
    assert window.doc.undo_stack.count() == 0 and window.doc.name == "untitled"


def test_the_gallery_comes_first_and_unsaved_work_is_offered_for_saving_once_chosen(
    window, answers, choose, monkeypatch
):
    doc = window.doc
    doc.push(SetCells(doc.session, "X", None, 0, 0, np.array([[0.125]])))
    choose("softcap")
    answers.queue(QMessageBox.StandardButton.Cancel)
    assert window.files.open_examples() is None
    assert choose.shown == ["softcap"]  # the gallery was shown before any question
    assert answers.texts == ["Save the changes to the untitled scenario?"]
    assert doc.scenario.X[0, 0] == 0.125 and doc.name == "untitled"
    assert not doc.undo_stack.isClean()

    monkeypatch.setattr(ExampleGallery, "exec", lambda self: QDialog.DialogCode.Rejected)
    assert window.files.open_examples() is None  # closing the gallery asks nothing
    assert len(answers.texts) == 1 and doc.scenario.X[0, 0] == 0.125
