"""After any change of shape, every heatmap in every dock shows the whole matrix."""

from __future__ import annotations

import numpy as np
import pytest
from PySide6.QtWidgets import QMessageBox

from attnviz.core.io import files
from attnviz.core.presets import make_preset
from attnviz.ui.heatmap import HeatmapView

pytestmark = pytest.mark.usefixtures("warnings_shown", "answers")
DOCKS = ("Pipeline", "Masks", "Heads", "Mix")
SQUARE = ("scores", "scaled", "masked", "weights")


def expected_shape(view: HeatmapView, s, heads: int) -> tuple[int, int] | None:
    """What the view must show for scenario s, from the scenario's own sizes."""
    n, width = s.n, (s.d_k if s.settings.projections else s.d_model)
    shapes = {"Q": (n, width), "K": (n, width), "V": (n, width), "output": (n, width)}
    shapes |= {name: (n, n) for name in SQUARE}
    shapes |= {"difference": (n, n), "concat": (n, heads * width), "final": (n, s.d_model)}
    shapes |= {"W_O": (s.n_heads * s.d_k, s.d_model), "contribution": (n, s.d_model)}
    return shapes.get(view.name)


def assert_whole_matrices_shown(window, qtbot) -> None:
    s, heads = window.doc.scenario, window.doc.n_heads
    qtbot.waitUntil(lambda: not window.compute.busy, timeout=10000)
    for title in DOCKS:
        window.bring_forward((title,))
        panel = window.panel(title)
        qtbot.waitUntil(panel.isVisible, timeout=5000)

        def shown(panel=panel) -> list[HeatmapView]:
            return [v for v in panel.findChildren(HeatmapView) if v.isVisible()]

        def drawn(title=title) -> bool:
            views = shown()
            if title == "Heads" and len(views) != heads:
                return False
            return bool(views) and all(
                v.spec is not None and v.spec.values.shape == expected_shape(v, s, heads)
                for v in views
            )

        qtbot.waitUntil(drawn, timeout=10000)
        views = shown()
        for view in views:
            rows, cols = view.spec.values.shape
            (x0, x1), (y0, y1) = view.view_range()
            where = f"{title} {view.name} {rows}×{cols}: x {x0:.2f}..{x1:.2f}, y {y0:.2f}..{y1:.2f}"
            assert x0 <= 1e-9 and x1 >= cols - 1e-9, where
            assert y0 <= 1e-9 and y1 >= rows - 1e-9, where
            assert len(view.spec.row_labels) == rows, where
            assert len(view.spec.col_labels) == cols, where
    if s.settings.mask != "none":  # the masked cells are the future keys, and only those
        spec = window.pipeline.views["masked"].spec
        future = np.triu(np.ones((s.n, s.n), dtype=bool), k=1)
        assert np.array_equal(spec.hatched(), future) or s.settings.mask == "drop-after-softmax"


def change_shape(window, qtbot, answers, how: str, tmp_path) -> None:
    doc = window.doc
    if how == "add token":
        window.inputs.add()
    elif how == "remove token":
        window.inputs.remove()
    elif how == "move token":
        window.inputs.grid.setCurrentIndex(window.inputs.model.index(0, 0))
        window.inputs.move_token(+1)
    elif how == "d_model":
        window.inputs.set_d_model(6)
    elif how == "heads":
        window.weights._resize("heads", 3)
    elif how == "d_k":
        window.weights._resize("d_k", 3)
    elif how == "preset":
        window.doc.replace(make_preset("gpt2-small", n=40), "Preset gpt2-small")
    elif how == "lesson stage 1":
        window.lesson.go(0)
    elif how == "open":
        path = tmp_path / "five.attn.json"
        files.save_scenario(path, make_preset("gpt2-small", n=7))
        assert window.files.open_path(path, ask=False)
    elif how == "new":
        window.doc.replace(make_preset("gpt2-small", n=12), "Preset gpt2-small")
        assert_whole_matrices_shown(window, qtbot)
        answers.queue(QMessageBox.StandardButton.Discard)
        window.files.new_document()
    else:
        raise AssertionError(how)
    assert doc.scenario is not None


CHANGES = (
    "add token",
    "remove token",
    "move token",
    "d_model",
    "heads",
    "d_k",
    "preset",
    "lesson stage 1",
    "open",
    "new",
)


@pytest.mark.parametrize("how", CHANGES)
def test_every_heatmap_shows_the_whole_matrix_after_a_change_of_shape(
    shown_window, qtbot, answers, tmp_path, how
):
    window = shown_window()
    assert_whole_matrices_shown(window, qtbot)  # every dock drawn once at the old shape
    before = window.doc.scenario
    change_shape(window, qtbot, answers, how, tmp_path)
    assert_whole_matrices_shown(window, qtbot)
    window.doc.undo_stack.undo()
    assert window.doc.scenario.X.shape == before.X.shape or how == "new"
    assert_whole_matrices_shown(window, qtbot)
    window.doc.undo_stack.redo()
    assert_whole_matrices_shown(window, qtbot)


def test_a_restored_autosave_of_another_shape_is_shown_whole(make_window, qtbot, monkeypatch):
    first = make_window()
    first.show()
    first.doc.replace(make_preset("gpt2-small", n=24), "Preset gpt2-small")
    first.autosave()
    qtbot.waitUntil(first.autosave_path.exists)

    second = make_window(settings_name="second.ini")
    second.show()
    assert_whole_matrices_shown(second, qtbot)
    monkeypatch.setattr(QMessageBox, "question", lambda *a, **k: QMessageBox.StandardButton.Yes)
    assert second.offer_restore()
    assert second.doc.scenario.n == 24
    assert_whole_matrices_shown(second, qtbot)
