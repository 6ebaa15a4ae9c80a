"""The compute service in the window: what a user sees after edits, undo and exports is
always the scenario the document holds (or, while it is being computed, the one before,
whole), never a mix; and the Qt adapter delivers the scheduler's events in order."""

from __future__ import annotations

import numpy as np
import pytest
from PySide6.QtWidgets import QApplication
from test_export import check_cells, svg_root

from attnviz.core.maths.forward import compute
from attnviz.core.maths.results import HEAD_MATRICES, HeadResult, Result
from attnviz.core.presets import random_scenario
from attnviz.ui.heatmap import on_screen

pytestmark = pytest.mark.usefixtures("warnings_shown", "answers")


@pytest.fixture
def window_of(shown_window):
    """A shown window on a scenario."""
    return lambda s=None: shown_window(scenario=s)


def worker_sized(n: int = 64, heads: int = 20, seed: int = 0):
    """Computed on the worker (too many score cells for the UI thread), yet small enough
    for exported SVGs to hold every value (64 × 64 cells)."""
    return random_scenario(n=n, d_model=48, heads=heads, d_k=8, seed=seed)


def close(a: np.ndarray, b: np.ndarray) -> None:
    np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


def test_published_results_follow_the_newest_version_in_order(window_of, qtbot):
    window = window_of(worker_sized())
    results: list[Result] = []
    firsts: list[HeadResult] = []
    window.compute.resultChanged.connect(results.append)
    window.compute.headReady.connect(firsts.append)
    s = window.doc.scenario
    for k in range(6):
        window.doc.replace(s.with_cells("X", None, k, 0, np.array([[k + 1.0]])), "edit")
        s = window.doc.scenario
    window.compute.wait()
    assert isinstance(results[-1], Result)
    close(results[-1].final, compute(s).final)
    close(window.compute.result.final, compute(s).final)
    assert all(isinstance(first, HeadResult) for first in firsts)


def test_the_masks_comparison_after_edits_is_of_the_edited_scenario(window_of, qtbot):
    """Under sinusoidal positions, edit after edit of X: the other mask's head is that of
    the scenario now, never of an earlier one (results were once keyed by the id() of
    arrays no longer alive, and a later scenario's arrays took those ids)."""
    s = worker_sized(seed=1).with_settings(positional="sinusoidal")
    window = window_of(s)
    window.bring_forward(("Masks",))
    masks = window.panel("Masks")
    qtbot.waitUntil(lambda: on_screen(masks))
    window.view_state.set_head(3)
    rng = np.random.default_rng(2)
    for _ in range(20):
        row = int(rng.integers(s.n))
        s = s.with_cells("X", None, row, 0, rng.normal(size=(1, 4)))
        window.doc.replace(s, "edit")
        window.compute.wait()
        c = masks.comparison
        assert c is not None and c.head == 3, masks.verdict.text()
        other = compute(s.with_settings(mask="causal-zero")).heads[3]
        close(c.weights_b, other.weights)
        close(c.weights_a, compute(s).heads[3].weights)


def test_an_export_while_computing_writes_the_scenario_the_document_holds(
    window_of, qtbot, tmp_path
):
    """Export every view of a head just after an edit, before it is computed, with
    another head shown than the one computed first."""
    s = worker_sized(seed=3)
    window = window_of(s)
    edited = s.with_cells("X", None, 5, 0, np.full((1, 48), 2.0))
    window.doc.replace(edited, "edit")
    window.view_state.set_head(7)
    assert window.compute.busy
    written = window.files.export_all_to(tmp_path)
    window.files.image_export.wait()
    window.compute.wait()
    assert len(written) == 2 * len(HEAD_MATRICES)
    want = compute(edited).heads[7]
    tokens = edited.tokens
    check_cells(svg_root(tmp_path / "head8-weights.svg"), tokens, tokens, want.weights)
    features = tuple(str(j + 1) for j in range(8))
    check_cells(svg_root(tmp_path / "head8-Q.svg"), tokens, features, want.Q)


def test_undo_held_down_shows_one_version_at_a_time(window_of, qtbot):
    """Holding Ctrl+Z through 12 edits: at every moment the Pipeline shows one version
    whole, the newest or one before it, and in the end the first."""
    s = worker_sized(seed=4)
    window = window_of(s)
    versions = [s]
    for k in range(12):
        s = s.with_cells("W_Q", 0, k, 0, np.array([[1.0 + k]]))
        window.doc.replace(s, f"edit {k}")
        versions.append(s)
    window.compute.wait()
    weights = {id(v): compute(v).heads[0] for v in versions}
    pipeline = window.pipeline
    assert on_screen(pipeline)

    def shown_version() -> int:
        """The one version whose head 1 every Pipeline view shows."""
        matches = None
        for name in ("Q", "scores", "weights", "output"):
            drawn = pipeline.views[name].spec.values
            here = {
                k
                for k, v in enumerate(versions)
                if np.allclose(drawn, getattr(weights[id(v)], name), rtol=1e-12, atol=1e-12)
            }
            matches = here if matches is None else matches & here
        assert matches, "the Pipeline shows a mix of versions"
        return max(matches)

    seen = []
    while window.doc.undo_stack.canUndo():
        window.doc.undo_stack.undo()
        for _ in range(3):
            QApplication.processEvents()
            seen.append(shown_version())
    window.compute.wait()
    QApplication.processEvents()
    assert shown_version() == 0 and seen


def test_the_complete_result_is_that_of_the_document_even_while_busy(window_of):
    s = worker_sized(seed=5)
    window = window_of(s)
    edited = s.with_cells("W_O", None, 0, 0, np.array([[3.0]]))
    window.doc.replace(edited, "edit")
    assert window.compute.busy
    close(window.compute.complete_result().final, compute(edited).final)
    window.compute.wait()


def test_a_failed_computation_is_said_and_the_window_goes_on(window_of, qtbot, monkeypatch):
    from attnviz.core.maths import torch_engine

    def out_of_memory(*args, **kwargs):
        raise MemoryError("the GPU is full")

    monkeypatch.setattr(torch_engine, "compute_torch", out_of_memory)
    window = window_of()
    failures: list[str] = []
    window.compute.computeFailed.connect(failures.append)
    window.view_state.set_engine("torch-float64")
    window.compute.wait()
    assert failures == ["MemoryError: the GPU is full; showing the NumPy engine instead"]
    assert window.view_state.engine == "numpy"
    close(window.compute.result.final, compute(window.doc.scenario).final)
