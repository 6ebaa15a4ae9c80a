"""A file of several model layers in the window: the stepper moves between the stored
layers without the model (its folder is gone), the overview comes from the file, and a
file of attention weights only is shown to look at, not edit."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

pytest.importorskip("transformers")

from offline_hub import offline  # noqa: F401  (autouse)
from PySide6.QtCore import Qt
from tiny_models import save_tiny

from attnviz.core.io.layers_files import save_layers
from attnviz.core.maths.forward import compute
from attnviz.core.models.importer import Request, import_model_layers

TEXT = "the big dog ran to the house"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A file of layers 0-2 and a weights-only file of layers 1-2 of a tiny BERT whose
    folder is then deleted: nothing can run the model afterwards."""
    root = tmp_path_factory.mktemp("layers")
    folder = save_tiny("bert", root / "bert")
    full = import_model_layers(Request(str(folder), TEXT), "all").layers
    weights = import_model_layers(Request(str(folder), TEXT), "1-2", weights_only=True).layers
    save_layers(root / "all.attn.npz", full)
    save_layers(root / "w.attn.npz", weights)
    shutil.rmtree(folder)
    return root


def test_the_stepper_moves_between_stored_layers_without_the_model(make_window, qtbot, files):
    window = make_window()
    assert window.files.open_path(files / "all.attn.npz", ask=False)
    window.compute.wait()
    p = window.doc.scenario.provenance
    assert p.layer == 0 and p.layers == 3
    assert window.doc.path is None  # a save never writes one layer over the file of layers
    panel = window.panel("Model")
    assert "held: 0-2" in panel.where.text() and not panel.previous.isEnabled()

    window.models.view_state.set_head(2)
    panel.next.click()  # the model's folder is gone: only the file can give layer 1
    assert not window.models.busy
    s = window.doc.scenario
    assert s.provenance.layer == 1 and window.view_state.head == 2
    r = compute(s)
    np.testing.assert_allclose(r.weights, s.provenance.model_weights, rtol=0, atol=1e-12)
    window.models.step(+1)
    assert window.doc.scenario.provenance.layer == 2 and not panel.next.isEnabled()
    window.models.step(+1)
    assert "holds layers 0-2" in window.statusBar().currentMessage()
    window.doc.undo_stack.undo()
    assert window.doc.scenario.provenance.layer == 1


def test_the_overview_comes_from_the_file_and_a_click_shows_a_stored_layer(
    make_window, qtbot, files
):
    window = make_window()
    window.files.open_path(files / "all.attn.npz", ask=False)
    window.bring_forward(("Overview",))
    grid = window.panel("Overview").grid
    assert (len(grid.images), len(grid.images[0])) == (3, 4) and grid.rows == (0, 1, 2)
    qtbot.mouseClick(grid, Qt.MouseButton.LeftButton, pos=grid._rect(2, 1).center())
    assert not window.models.busy
    assert window.doc.scenario.provenance.layer == 2 and window.view_state.head == 1


def test_a_weights_only_file_is_shown_to_look_at_and_changes_no_document(make_window, qtbot, files):
    window = make_window()
    before = window.doc.scenario
    assert window.files.open_path(files / "w.attn.npz", ask=False)
    assert window.doc.scenario is before and window.doc.undo_stack.count() == 0
    window.bring_forward(("Overview",))
    panel = window.panel("Overview")
    assert "not edit" in panel.note.text() and "layers 1-2" in panel.note.text()
    assert "layer 1, head 1" in panel.enlarged.spec.title  # the first stored layer's first
    # the overview of every layer of the run is kept with the stored ones
    assert panel.grid.rows == (0, 1, 2) and len(panel.grid.images[0]) == 4
    qtbot.mouseClick(panel.grid, Qt.MouseButton.LeftButton, pos=panel.grid._rect(2, 3).center())
    shown = panel.enlarged.spec
    assert "layer 2, head 4" in shown.title
    with np.load(files / "w.attn.npz") as archive:  # the file itself, read by NumPy
        np.testing.assert_array_equal(shown.values, archive["layers.2.weights"][3])


def test_layers_held_stay_held_while_a_weights_only_file_is_looked_at(make_window, files):
    window = make_window()
    window.files.open_path(files / "all.attn.npz", ask=False)
    window.files.open_path(files / "w.attn.npz", ask=False)
    assert window.doc.scenario.provenance.layer == 0
    window.models.step(+1)  # the model's folder is gone: layer 1 comes from all.attn.npz
    assert not window.models.busy and window.doc.scenario.provenance.layer == 1
