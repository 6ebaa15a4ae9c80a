"""Importing a model layer in the window: the dialog, the stepper, vs model, the overview."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("transformers")

from offline_hub import offline  # noqa: F401  (autouse)
from PySide6.QtCore import QPoint, Qt
from PySide6.QtWidgets import QDialog
from tiny_models import WORDS, save_tiny

from attnviz.core.models.importer import Request
from attnviz.ui import model_import

TEXT = "the big dog ran to the house"


@pytest.fixture(scope="module")
def bert_folder(tmp_path_factory):
    return save_tiny("bert", tmp_path_factory.mktemp("models") / "bert")


def imported(window, qtbot, request, head=None):
    window.models.start(request, head)
    qtbot.waitUntil(lambda: not window.models.busy, timeout=60_000)
    window.compute.wait()


def test_the_dialog_previews_tokens_and_the_menu_imports_one_undoable_step(
    shown_window, qtbot, bert_folder, monkeypatch
):
    window = shown_window()
    dialog = model_import.ImportDialog(window.settings, window)
    qtbot.addWidget(dialog)
    dialog.source.setCurrentText(str(bert_folder))
    dialog.text.setPlainText(TEXT)
    qtbot.waitUntil(lambda: dialog.count.text()[:1].isdigit(), timeout=20_000)
    assert dialog.count.text().startswith("9 tokens, 2 added by the tokenizer")
    shown = dialog.preview.text()
    assert shown.count("<span") == 9 and "[CLS]" in shown and "house" in shown
    assert dialog.layer.maximum() == 2 and "bert" in dialog.layers.text()
    dialog.layer.setValue(2)
    assert dialog.request() == Request(str(bert_folder), TEXT, 2, "float64")
    dialog.reject()

    before = window.doc.scenario

    def answer(dialog):
        dialog.source.setCurrentText(str(bert_folder))
        dialog.text.setPlainText(TEXT)
        dialog.layer.setValue(1)
        return QDialog.DialogCode.Accepted

    monkeypatch.setattr(model_import.ImportDialog, "exec", answer)
    action = next(
        a
        for a in window.findChildren(type(window.menuBar().actions()[0]))
        if "Model Layer" in a.text()
    )
    assert action.shortcut().toString() == "Ctrl+Shift+I"
    action.trigger()
    qtbot.waitUntil(lambda: window.doc.scenario.provenance is not None, timeout=60_000)
    s = window.doc.scenario
    assert s.tokens == ("[CLS]", *TEXT.split(), "[SEP]") and s.provenance.layer == 1
    assert s.provenance.token_ids[1:-1] == tuple(WORDS.index(w) + 3 for w in TEXT.split())
    assert window.docks["Heads"].isVisible() and window.docks["Model"].isVisible()
    window.doc.undo_stack.undo()
    assert window.doc.scenario is before
    window.doc.undo_stack.redo()
    assert window.doc.scenario.provenance.layer == 1


def test_the_stepper_imports_the_neighbouring_layers(make_window, qtbot, bert_folder):
    window = make_window()
    imported(window, qtbot, Request(str(bert_folder), TEXT, 1), head=2)
    assert window.view_state.head == 2
    panel = window.panel("Model")
    panel.next.click()
    qtbot.waitUntil(lambda: window.doc.scenario.provenance.layer == 2, timeout=60_000)
    assert not panel.next.isEnabled() and panel.previous.isEnabled()
    assert window.view_state.head == 2  # the head shown stays
    window.models.step(+1)
    assert window.doc.scenario.provenance.layer == 2
    window.models.step(-1)
    qtbot.waitUntil(lambda: window.doc.scenario.provenance.layer == 1, timeout=60_000)
    assert window.doc.undo_stack.count() == 3  # each import one undoable step


def test_vs_model_moves_with_an_edit_and_returns_on_undo(shown_window, qtbot, bert_folder):
    window = shown_window()
    imported(window, qtbot, Request(str(bert_folder), TEXT, 0))
    window.bring_forward(("Model",))
    panel = window.panel("Model")
    qtbot.waitUntil(lambda: panel.last is not None, timeout=10_000)
    assert panel.last.weights <= 1e-12 and "Matches the model" in panel.verdict.text()

    s = window.doc.scenario
    window.doc.replace(s.with_cells("W_Q", 0, 0, 0, [[s.W_Q[0, 0, 0] + 3.0]]), "edit")
    window.compute.wait()
    qtbot.waitUntil(lambda: panel.last.weights > 1e-6, timeout=10_000)
    # Independently: head 1's weights from the edited W_Q, in a few lines of NumPy.
    e = window.doc.scenario
    q, k = e.X @ e.W_Q[0] + e.b_Q[0], e.X @ e.W_K[0] + e.b_K[0]
    z = q @ k.T / np.sqrt(e.d_k)
    w = np.exp(z - z.max(axis=1, keepdims=True))
    w /= w.sum(axis=1, keepdims=True)
    moved = np.abs(w - e.provenance.model_weights[0]).max(axis=1)
    np.testing.assert_allclose(panel.last.per_row[0], moved, atol=1e-12)
    assert panel.last.per_head[1:].max() <= 1e-12  # only head 1 reads W_Q of head 1
    assert "Moved from the model" in panel.verdict.text()

    window.doc.undo_stack.undo()
    window.compute.wait()
    qtbot.waitUntil(lambda: panel.last.weights <= 1e-12, timeout=10_000)
    assert "Matches the model" in panel.verdict.text()


def test_the_overview_shows_every_layer_and_a_click_loads_one(make_window, qtbot, bert_folder):
    window = make_window()
    imported(window, qtbot, Request(str(bert_folder), TEXT, 2))
    window.bring_forward(("Overview",))
    panel = window.panel("Overview")
    grid = panel.grid
    assert (len(grid.images), len(grid.images[0])) == (3, 4)
    assert grid.current == (2, 0)
    centre = grid._rect(0, 3).center()
    qtbot.mouseClick(grid, Qt.MouseButton.LeftButton, pos=centre)
    qtbot.waitUntil(lambda: window.doc.scenario.provenance.layer == 0, timeout=60_000)
    assert window.view_state.head == 3 and grid.current == (0, 3)
    assert grid.at(QPoint(1, 1)) is None


def test_a_failed_or_cancelled_import_changes_nothing(
    make_window, qtbot, bert_folder, tmp_path, warnings_shown
):
    window = make_window()
    before = window.doc.scenario
    imported(window, qtbot, Request(str(tmp_path / "nowhere"), TEXT, 0))
    assert warnings_shown and "no such folder" in warnings_shown[-1][1]
    assert window.doc.scenario is before and window.doc.undo_stack.count() == 0

    window.models.start(Request(str(bert_folder), TEXT, 0))
    window.models.job.cancel()
    qtbot.waitUntil(lambda: not window.models.busy, timeout=60_000)
    assert window.doc.scenario is before
    assert "cancelled" in window.statusBar().currentMessage()


def test_vs_model_says_when_the_output_can_no_longer_be_compared(make_window, qtbot, bert_folder):
    from attnviz.core.maths.forward import compute
    from attnviz.core.maths.scenario import resized
    from attnviz.core.provenance import vs_model
    from attnviz.ui.panels.model import verdict

    window = make_window()
    imported(window, qtbot, Request(str(bert_folder), TEXT, 0))
    wider = resized(window.doc.scenario, d_model=17)
    r = compute(wider)
    text = verdict(vs_model(wider.provenance, r.weights, r.final))
    assert "Matches" not in text and "cannot be compared" in text
    fewer = resized(window.doc.scenario, n=5)
    r = compute(fewer)
    assert "not comparable" in vs_model(fewer.provenance, r.weights, r.final)


@pytest.mark.parametrize("precision", ["float64", "model"])
def test_the_dialog_imports_every_layer_from_one_run_for_the_stepper(
    make_window, qtbot, bert_folder, monkeypatch, precision
):
    window = make_window()

    def answer(dialog):
        dialog.source.setCurrentText(str(bert_folder))
        dialog.text.setPlainText(TEXT)
        dialog.which.setCurrentIndex(dialog.which.findData("all"))
        assert not dialog.layer.isEnabled()  # every layer: no layer to choose
        dialog.dtype.setCurrentIndex(dialog.dtype.findData(precision))
        return QDialog.DialogCode.Accepted

    monkeypatch.setattr(model_import.ImportDialog, "exec", answer)
    window.models.open_dialog()
    qtbot.waitUntil(lambda: window.doc.scenario.provenance is not None, timeout=60_000)
    qtbot.waitUntil(lambda: not window.models.busy, timeout=60_000)
    assert window.doc.scenario.provenance.layer == 0
    for layer in (1, 2):  # held: each step is there at once, with no run of the model
        window.models.step(+1)
        assert window.doc.scenario.provenance.layer == layer
        assert not window.models.busy
    assert window.doc.scenario.tokens == ("[CLS]", *TEXT.split(), "[SEP]")


def test_the_dialog_imports_attention_weights_only_to_look_at(
    make_window, qtbot, bert_folder, monkeypatch
):
    window = make_window()
    before = window.doc.scenario

    def answer(dialog):
        dialog.source.setCurrentText(str(bert_folder))
        dialog.text.setPlainText(TEXT)
        dialog.which.setCurrentIndex(dialog.which.findData("weights"))
        return QDialog.DialogCode.Accepted

    monkeypatch.setattr(model_import.ImportDialog, "exec", answer)
    window.models.open_dialog()
    qtbot.waitUntil(lambda: window.models.looked is not None, timeout=60_000)
    assert window.doc.scenario is before  # nothing to edit replaced the document
    assert window.models.looked.stored == (0, 1, 2) and window.models.looked.weights_only
