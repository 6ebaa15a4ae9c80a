"""The File dialogs and the binary scenario form: Open offers .attn.json and .attn.npz,
Save As writes the form its name (or else the chosen filter) says, and Save keeps the
form of the file that was opened.

The files written are read here with plain ``np.load`` and ``json`` and compared with the
brief's matrices (``reference``); the file opened is built here with ``np.savez`` from the
layout the README documents, not by attnviz.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import reference
from PySide6.QtWidgets import QFileDialog

from attnviz.core.provenance import Provenance
from attnviz.core.session import SetCells
from attnviz.ui.file_controller import JSON_FILTER, NPZ_FILTER

pytestmark = pytest.mark.usefixtures("answers")


def answer_save(monkeypatch, path: Path, chosen: str) -> list[tuple]:
    """Answer Save dialogs with (path, chosen filter); returns the arguments they got."""
    asked: list[tuple] = []

    def dialog(*args, **kwargs):
        asked.append(args)
        return str(path), chosen

    monkeypatch.setattr(QFileDialog, "getSaveFileName", dialog)
    return asked


def read_npz(path: Path) -> tuple[dict, dict[str, np.ndarray]]:
    """The document and arrays of an .attn.npz, read with numpy alone."""
    assert path.read_bytes()[:4] == b"PK\x03\x04"
    with np.load(path, allow_pickle=False) as archive:
        arrays = {name: archive[name] for name in archive.files}
    doc = json.loads(arrays.pop("scenario.json").tobytes().decode("utf-8"))
    return doc, arrays


def test_save_as_with_an_npz_name_writes_the_binary_form(make_window, tmp_path, monkeypatch):
    window = make_window()
    window.doc.push(SetCells(window.doc.session, "X", None, 1, 2, np.array([[0.125]])))
    folder = tmp_path / "out"
    folder.mkdir()
    path = folder / "layer.attn.npz"
    answer_save(monkeypatch, path, JSON_FILTER)  # the typed suffix wins over the filter

    assert window.files.save_as()

    doc, arrays = read_npz(path)
    assert (doc["format"], doc["version"]) == ("attnviz-scenario", 1)
    assert doc["tokens"] == ["she", "saw", "the", "cat"]
    assert doc["heads"] == {"W_Q": "heads.W_Q", "W_K": "heads.W_K", "W_V": "heads.W_V"}
    want_x = reference.X.copy()
    want_x[1, 2] = 0.125
    np.testing.assert_array_equal(arrays[doc["X"]], want_x)
    np.testing.assert_array_equal(arrays["heads.W_Q"], reference.W_Q)
    np.testing.assert_array_equal(arrays["heads.W_K"], reference.W_K)
    np.testing.assert_array_equal(arrays["heads.W_V"], reference.W_V)
    np.testing.assert_array_equal(arrays["W_O"], reference.W_O)
    assert window.doc.path == path.resolve()
    assert not window.isWindowModified()
    assert [p.name for p in folder.iterdir()] == ["layer.attn.npz"]  # no temporary file left


@pytest.mark.parametrize(
    ("chosen", "written"),
    [(NPZ_FILTER, "bare.attn.npz"), (JSON_FILTER, "bare.attn.json")],
)
def test_a_name_without_a_suffix_takes_the_chosen_filters(
    make_window, tmp_path, monkeypatch, chosen, written
):
    window = make_window()
    answer_save(monkeypatch, tmp_path / "bare", chosen)
    assert window.files.save_as()
    path = tmp_path / written
    assert window.doc.path == path.resolve()
    if written.endswith(".npz"):
        np.testing.assert_array_equal(read_npz(path)[1]["X"], reference.X)
    else:
        assert json.loads(path.read_text("utf-8"))["X"] == reference.X.tolist()


def hand_made_npz(path: Path) -> None:
    """The worked example as an .attn.npz, built from the documented layout with numpy."""
    doc = {
        "format": "attnviz-scenario",
        "version": 1,
        "tokens": ["she", "saw", "the", "cat"],
        "X": "X",
        "heads": {"W_Q": "heads.W_Q", "W_K": "heads.W_K", "W_V": "heads.W_V"},
        "W_O": "W_O",
        "settings": {"mask": "none"},
    }
    X = reference.X.copy()
    X[3, 3] = -0.875
    members = {"X": X, "heads.W_Q": reference.W_Q, "heads.W_K": reference.W_K}
    members.update({"heads.W_V": reference.W_V, "W_O": reference.W_O})
    text = np.frombuffer(json.dumps(doc).encode("utf-8"), dtype=np.uint8)
    with open(path, "wb") as f:
        np.savez(f, **{"scenario.json": text}, **members)


def test_open_offers_both_forms_and_save_keeps_the_binary_one(make_window, tmp_path, monkeypatch):
    path = tmp_path / "made.attn.npz"
    hand_made_npz(path)
    window = make_window()
    asked: list[tuple] = []

    def open_dialog(*args, **kwargs):
        asked.append(args)
        return str(path), args[3].split(";;")[0]

    monkeypatch.setattr(QFileDialog, "getOpenFileName", open_dialog)
    window.files.open_dialog()

    offered = asked[0][3].split(";;")
    assert "*.attn.json" in offered[0] and "*.attn.npz" in offered[0]  # both at once
    assert any("*.attn.npz" in f and "*.attn.json" not in f for f in offered)
    s = window.doc.scenario
    assert s.settings.mask == "none" and s.X[3, 3] == -0.875
    np.testing.assert_array_equal(s.W_Q, reference.W_Q)
    assert window.doc.path == path.resolve()

    # Save writes the binary form again, with the edit.
    window.doc.push(SetCells(window.doc.session, "W_O", None, 0, 0, np.array([[-0.5]])))
    assert window.files.save()
    doc, arrays = read_npz(path)
    assert arrays["W_O"][0, 0] == -0.5 and doc["settings"]["mask"] == "none"

    # Save As proposes the binary form for a binary document.
    saved_as = answer_save(monkeypatch, tmp_path / "copy.attn.npz", NPZ_FILTER)
    assert window.files.save_as()
    _, _, proposed, _, selected = saved_as[0]
    assert proposed.endswith("scenario.attn.npz") and selected == NPZ_FILTER
    assert read_npz(tmp_path / "copy.attn.npz")[1]["W_O"][0, 0] == -0.5


def test_a_scenario_the_file_cannot_hold_is_refused_with_a_message(
    make_window, tmp_path, monkeypatch, warnings_shown
):
    from attnviz.core.presets import worked_example

    provenance = Provenance(
        source="gpt2",
        kind="hub",
        model_type="gpt2",
        layer=0,
        layers=12,
        text="caf\udce9",  # a byte that was not UTF-8, as sys.argv keeps it
        token_ids=(1, 2, 3, 4),
        model_weights=np.full((2, 4, 4), 0.25),
        model_output=np.zeros((4, 4)),
    )
    window = make_window(dataclasses.replace(worked_example(), provenance=provenance))
    folder = tmp_path / "out"
    folder.mkdir()
    for name in ("p.attn.npz", "p.attn.json"):
        answer_save(monkeypatch, folder / name, JSON_FILTER)
        assert not window.files.save_as()
        title, text = warnings_shown[-1]
        assert title == "Cannot save"
        assert "provenance.text" in text and "U+DCE9" in text
    assert not list(folder.iterdir())
