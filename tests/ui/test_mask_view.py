"""The mask comparison and the leak marks, as a learner sees them, against plain NumPy."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import reference as ref
from PySide6.QtGui import QColor

from attnviz.core.figures import colors

pytestmark = pytest.mark.usefixtures("warnings_shown", "answers")
FUTURE = np.triu(np.ones((4, 4), dtype=bool), k=1)


def head1(mask: str) -> tuple[np.ndarray, np.ndarray]:
    """(scores softmax sees, weights) of head 1 of the worked example under mask."""
    S, W, _ = ref.head(ref.X, ref.W_Q[0], ref.W_K[0], ref.W_V[0], mask)
    seen = S.copy()
    if mask == "causal":
        seen[FUTURE] = -np.inf
    elif mask == "causal-zero":
        seen[FUTURE] = 0.0
    return seen, W


def pixels_near(view, row: int, col: int, corner: bool) -> set[int]:
    """Colours around a cell's centre, or just inside its top-left corner."""
    image = view.grab().toImage()
    at = (col + 0.1, row + 0.1) if corner else (col + 0.5, row + 0.5)
    p = view.point_at(*at).toPoint()
    return {
        image.pixel(p.x() + dx, p.y() + dy) & 0xFFFFFF for dx in range(-2, 3) for dy in range(-2, 3)
    }


@pytest.fixture
def window(shown_window, qtbot):
    w = shown_window()
    qtbot.waitUntil(lambda: not w.compute.busy)
    return w


def test_the_pipeline_outlines_weight_that_leaked_to_the_future(window, qtbot):
    window.change_setting(mask="causal-zero")
    view = window.pipeline.views["weights"]
    qtbot.waitUntil(lambda: view.spec.leaked is not None)
    _, W = head1("causal-zero")
    np.testing.assert_array_equal(view.spec.leaked, FUTURE & (W > 0))
    np.testing.assert_array_equal(view.spec.hatched(), FUTURE)
    red = QColor(colors.LEAK).rgb() & 0xFFFFFF
    assert red in pixels_near(view, 0, 3, corner=True)  # a leaked cell: outlined
    assert red not in pixels_near(view, 3, 0, corner=True)  # a past key: not
    window.change_setting(mask="causal")
    qtbot.waitUntil(lambda: view.spec.leaked is None)
    assert red not in pixels_near(view, 0, 3, corner=True)


def test_masks_shows_what_each_strategy_did_to_the_scores_and_the_weights(window, qtbot):
    window.docks["Masks"].raise_()
    masks = window.masks
    qtbot.waitUntil(lambda: masks.comparison is not None, timeout=5000)
    for key, mask in (("A", "causal"), ("B", "causal-zero")):
        seen, W = head1(mask)
        scores, weights = masks.views[f"{key}-scores"].spec, masks.views[key].spec
        np.testing.assert_allclose(scores.values, seen, atol=1e-12)
        np.testing.assert_array_equal(scores.hatched(), FUTURE)  # hatched under both
        np.testing.assert_allclose(weights.values, W, atol=1e-12)
        leaked = weights.leaked if weights.leaked is not None else np.zeros((4, 4), bool)
        np.testing.assert_array_equal(leaked, FUTURE & (W > 0))
        leak = masks.views[key].strip.columns[0]
        np.testing.assert_allclose(leak.values, (W * FUTURE).sum(axis=1), atol=1e-12)
        assert [c == colors.LEAK for c in leak.colors] == list(leak.values > 0)
    assert masks.views["A-scores"].spec.values[0, 3] == -np.inf  # reads −∞ …
    assert masks.views["B-scores"].spec.values[0, 3] == 0.0  # … and 0, as each strategy did
    for key in ("A-scores", "B-scores"):  # one colour scale for both: A's bar is B's
        assert masks.views[key].spec.levels == masks.views["B-scores"].spec.levels


def test_masks_has_square_cells_and_every_token_label(window, qtbot):
    dock = window.docks["Masks"]
    dock.raise_()
    dock.setFloating(True)  # the dock's size as at 1440 × 900, whatever the layout did
    dock.resize(700, 780)
    masks = window.masks
    qtbot.waitUntil(lambda: masks.comparison is not None and masks.isVisible(), timeout=5000)
    for key, view in masks.views.items():
        corner = view.point_at(0, 0)
        right, down = view.point_at(1, 0), view.point_at(0, 1)
        width, height = right.x() - corner.x(), down.y() - corner.y()
        assert width == pytest.approx(height, rel=1e-6), key

        def labelled(view=view) -> int:
            return len(view.labelled()[1])

        with contextlib.suppress(qtbot.TimeoutError):  # the layout settles; then all four
            qtbot.waitUntil(lambda labelled=labelled: labelled() == 4, timeout=10000)
        assert labelled() == 4, (key, view.size().toTuple(), view.view_range())  # keys


def test_the_probe_is_drawn_on_the_heatmaps(window, qtbot):
    window.docks["Masks"].raise_()
    masks = window.masks
    qtbot.waitUntil(lambda: masks.comparison is not None, timeout=5000)
    masks.token.setCurrentIndex(2)  # "the"
    masks.amount.setValue(1.0)
    masks.run_probe()
    qtbot.waitUntil(lambda: masks.probes is not None, timeout=5000)
    for key in ("A-scores", "B-scores", "A", "B"):
        assert masks.views[key].marked_column == 2
    nudged = ref.X.copy()
    nudged[2] += 1.0
    for key, mask in (("A", "causal"), ("B", "causal-zero")):
        before = ref.multi_head(ref.X, ref.W_Q, ref.W_K, ref.W_V, ref.W_O, mask)[2]
        after = ref.multi_head(nudged, ref.W_Q, ref.W_K, ref.W_V, ref.W_O, mask)[2]
        moved = np.abs(after - before).max(axis=1)
        bars = {b.title: b for b in masks.views[key].strip.columns}
        np.testing.assert_allclose(bars["probe"].values, moved, atol=1e-12)
        earlier = [i < 2 and moved[i] > 0 for i in range(4)]
        assert [c == colors.LEAK for c in bars["probe"].colors] == earlier
        assert any(earlier) == (mask == "causal-zero")  # only the leak moves the past
    masks.mask_b.setCurrentText("drop-after-softmax")  # rows summing below 1 get a bar
    qtbot.waitUntil(lambda: masks.comparison.mask_b == "drop-after-softmax", timeout=5000)
    bars = {b.title: b for b in masks.views["B"].strip.columns}
    _, W = head1("drop-after-softmax")
    np.testing.assert_allclose(bars["Σ"].values, W.sum(axis=1), atol=1e-12)
    assert masks.views["B"].marked_column is None  # a new comparison: no probe yet
