"""Redrawing only what an edit changed: the Pipeline's pictures stay exactly the colour
map of the values (recoloured in part or whole), and a view whose matrix did not change
is not redrawn at all."""

from __future__ import annotations

import math

import numpy as np
import pytest

from attnviz.core.figures import colors
from attnviz.core.presets import small_model


@pytest.fixture
def window(shared_window, qtbot):
    tokens = tuple(f"w{i}" for i in range(48))
    shared_window.doc.reset(small_model(tokens, 8, 2, 4, seed=3), None)
    shared_window.view_state.set_head(0)
    shared_window.compute.wait()
    yield shared_window
    shared_window.doc.undo_stack.setClean()


def by_hand_scores(s, h: int) -> np.ndarray:
    return (s.X @ s.W_Q[h]) @ (s.X @ s.W_K[h]).T


def assert_drawn_as_a_whole(view, where: str) -> None:
    """The view's pixels and masked marks are what drawing its matrix afresh gives: the
    colour map of every value, the cells that are masked or not finite, and their shade."""
    spec, image = view.spec, view.image
    rows = np.arange(spec.values.shape[0]) if image.rows is None else image.rows
    cols = np.arange(spec.values.shape[1]) if image.cols is None else image.cols
    whole = colors.argb(spec.values[np.ix_(rows, cols)], spec.kind, spec.levels)
    np.testing.assert_array_equal(image.pixels, whole, err_msg=where)
    hatched = ~np.isfinite(spec.values)
    if spec.masked is not None:
        hatched |= spec.masked
    np.testing.assert_array_equal(view.marks.hatched, hatched, err_msg=where)
    if hatched.any():
        shade = np.where(hatched, 0x6E3C3C3C, 0).astype(np.uint32)  # the hatch grey at 43 %
        np.testing.assert_array_equal(view.marks._shade_pixels, shade, err_msg=where)


def test_edits_of_x_leave_every_picture_the_colour_map_of_its_values(window, qtbot):
    model = window.inputs.model
    for k, (row, col, value) in enumerate([(5, 2, 0.7), (30, 0, -1.2), (5, 7, 0.05), (47, 3, 2)]):
        assert model.setData(model.index(row, col), str(value))
        window.compute.wait()
        qtbot.wait(1)
        s = window.doc.scenario
        assert s.X[row, col] == value
        views = window.pipeline.views
        np.testing.assert_allclose(views["scores"].spec.values, by_hand_scores(s, 0), atol=1e-12)
        for name in window.pipeline.names:
            assert_drawn_as_a_whole(views[name], f"edit {k}: {name}")


def test_edits_of_x_leave_every_sampled_picture_the_colour_map_of_its_values(window, qtbot):
    """Long enough that each view shows a sample of the rows (cells smaller than
    pixels), with RoPE and two heads sharing keys: after edits of X (of rows the pictures
    show, and of one they do not), each view is what drawing its matrix afresh gives, at
    the rows its image holds."""
    from attnviz.core.maths.scenario import Settings

    tokens = tuple(f"w{i}" for i in range(700))
    s = small_model(tokens, 8, 2, 4, seed=5, kv_heads=1, settings=Settings(positional="rope"))
    window.doc.reset(s, None)
    window.compute.wait()
    qtbot.wait(1)
    views = window.pipeline.views
    shown = views["scores"].image.rows
    assert shown is not None  # sampled
    hidden = sorted(set(range(700)) - set(shown.tolist()))
    model = window.inputs.model
    edits = [(int(shown[3]), 2, 3.0), (hidden[100], 0, -4.0), (int(shown[-2]), 7, 2.5)]
    for k, (row, col, value) in enumerate(edits):
        assert model.setData(model.index(row, col), str(value))
        window.compute.wait()
        qtbot.wait(1)
        for name in window.pipeline.names:
            assert_drawn_as_a_whole(views[name], f"edit {k}: {name}")


def test_changed_cells_are_found_exactly_unless_a_sample_shows_nearly_all_changed():
    from attnviz.ui.heatmap_parts import changed_cells

    rng = np.random.default_rng(0)
    old = rng.standard_normal((96, 80))
    assert not changed_cells(old, old).any()
    new = old.copy()
    new[7] += 1.0  # an edited token's row and column of the scores
    new[:, 7] -= 1.0
    new[90:] = np.nan  # NaN never equals itself: redrawn
    np.testing.assert_array_equal(changed_cells(old, new), old != new)
    assert changed_cells(old, old + 1e-9) is None  # a weight edit changes every cell
    # ... or every cell a causal mask leaves alone (half of them, in most rows and columns)
    seen = np.tril(np.ones((96, 80), bool))
    assert changed_cells(old, np.where(seen, old + 1e-9, old)) is None
    # A whole sampled row and a column changed: compared in full.
    new = old.copy()
    new[48, :70] += 1.0
    new[:, 50] += 1.0
    np.testing.assert_array_equal(changed_cells(old, new), old != new)
    # A short matrix is always compared in full.
    np.testing.assert_array_equal(changed_cells(old[:40], old[:40] + 1), np.ones((40, 80), bool))


def covers(lines, changed: np.ndarray) -> bool:
    rows, cols = lines
    covered = np.zeros_like(changed)
    covered[rows] = True
    covered[:, cols] = True
    return bool(covered[changed].all())


def drawn(qtbot, spec, size: tuple[int, int] = (700, 600)):
    """A fresh view of spec on screen, size pixels (by default every cell of a 200² matrix
    is a few pixels: the image holds them all)."""
    from attnviz.ui.heatmap import HeatmapView

    view = HeatmapView("t")
    qtbot.addWidget(view)
    view.resize(*size)
    view.show()
    qtbot.waitExposed(view)
    view.set_spec(spec)
    return view


def test_changed_lines_cover_every_changed_cell_with_few_rows_and_columns():
    from attnviz.ui.heatmap_parts import changed_lines

    changed = np.zeros((60, 50), bool)
    changed[7] = changed[:, 7] = True  # an edited token: its row and column
    rows, cols = changed_lines(changed)
    assert list(rows) == [7] and list(cols) == [7]
    changed[40:, :30] = True  # the rows below an edited key change in most cells
    rows, cols = changed_lines(changed)
    assert list(rows) == [7, *range(40, 60)] and list(cols) == [7]
    assert changed_lines(np.ones((60, 50), bool)) is None  # everything: all recoloured
    no_rows, no_cols = changed_lines(np.zeros((60, 50), bool))
    assert not len(no_rows) and not len(no_cols)
    rng = np.random.default_rng(4)
    partly = 0
    for _ in range(200):
        changed = rng.random((30, 20)) < rng.choice([0.002, 0.02, 0.2])
        changed[rng.integers(30)] |= rng.random(20) < 0.9  # a mostly changed row
        lines = changed_lines(changed)
        if lines is not None:  # None: recoloured whole
            partly += 1
            assert covers(lines, changed)
            assert len(lines[0]) * 20 + len(lines[1]) * 30 <= 30 * 20 * 3 // 4
    assert partly > 100


def test_edits_at_a_size_that_previews_leave_every_picture_its_colour_map(shared_window, qtbot):
    """At 96 tokens the shown head is previewed and pictures are recoloured by rows and
    columns (an edit of X) or whole (a weight edit changes every score): after each, every
    picture is exactly the colour map of its values, and the scores are right."""
    from attnviz.core.presets import random_scenario

    window = shared_window
    window.doc.reset(random_scenario(n=96, d_model=16, heads=12, d_k=4, seed=5), None)
    window.view_state.set_head(2)
    window.compute.wait()
    grids = window.weights.grids
    edits = [
        (window.inputs.model, 10, 3, 1.5),
        (window.inputs.model, 60, 0, -0.4),
        (grids[("W_K", 2)].matrix_model(), 4, 1, 0.9),
        (window.inputs.model, 95, 5, 0.3),
        (grids[("W_Q", 2)].matrix_model(), 0, 3, -1.1),
    ]
    for k, (model, row, col, value) in enumerate(edits):
        assert model.setData(model.index(row, col), str(value))
        window.compute.wait()
        qtbot.wait(1)
        s = window.doc.scenario
        views = window.pipeline.views
        np.testing.assert_allclose(views["scores"].spec.values, by_hand_scores(s, 2), atol=1e-12)
        for name in window.pipeline.names:
            assert_drawn_as_a_whole(views[name], f"edit {k}: {name}")
    window.doc.undo_stack.setClean()


def test_an_edit_of_w_v_redraws_only_v_and_the_output(window, qtbot):
    painted: set[str] = set()
    views = window.pipeline.views
    for view in views.values():
        view.painted.connect(painted.add)
    qtbot.wait(20)
    painted.clear()
    before = {name: views[name].spec for name in window.pipeline.names}
    model = window.weights.grids[("W_V", 0)].matrix_model()
    assert model.setData(model.index(1, 1), "0.9")
    window.compute.wait()
    qtbot.waitUntil(lambda: {"V", "output"} <= painted)
    qtbot.wait(20)
    assert painted == {"V", "output"}
    for name in ("Q", "K", "scores", "scaled", "masked", "weights"):
        assert views[name].spec.values is before[name].values or np.array_equal(
            views[name].spec.values, before[name].values
        )
    s = window.doc.scenario
    weights = views["weights"].spec.values
    np.testing.assert_allclose(views["output"].spec.values, weights @ (s.X @ s.W_V[0]), atol=1e-12)


def test_masked_marks_follow_edits_in_the_changed_rows_and_columns_only():
    """The hatched cells after edits that turn cells of a row or a column to −∞, NaN or
    back to numbers (under a fixed mask), updated in the changed lines only or as a
    whole, are the hatched cells of the new matrix; and so is their shade."""
    from attnviz.core.figures.figure import HeatmapSpec
    from attnviz.ui.heatmap_parts import CellMarks, changed_cells, changed_lines

    rng = np.random.default_rng(7)
    masked = np.triu(np.ones((40, 40), bool), 1)
    values = rng.standard_normal((40, 40))
    labels = tuple(str(i) for i in range(40))

    def spec(v: np.ndarray) -> HeatmapSpec:
        return HeatmapSpec("t", v, labels, labels, "q", "k", "diverging", (-3, 3), "", masked)

    marks = CellMarks()
    marks.set_data(spec(values))
    partly = wholly_finite = 0
    for _ in range(120):
        new = values.copy()
        line = rng.integers(40)
        cells = new[line] if rng.random() < 0.5 else new[:, line]
        cells[rng.random(40) < 0.3] = rng.choice([-np.inf, np.nan, np.inf, 0.5])
        if rng.random() < 0.3:  # every cell a number again
            new[~np.isfinite(new)] = 1.0
        lines = changed_lines(changed_cells(values, new))
        if rng.random() < 0.3:  # the whole matrix told (a weight edit, say)
            lines = None
            wholly_finite += bool(np.isfinite(new).all())
        partly += lines is not None
        marks.set_data(spec(new), lines)
        hatched = ~np.isfinite(new) | masked
        np.testing.assert_array_equal(marks.hatched, hatched)
        np.testing.assert_array_equal(
            marks._shade_pixels, np.where(hatched, 0x6E3C3C3C, 0).astype(np.uint32)
        )
        values = new
    assert partly > 30 and wholly_finite > 5


@pytest.mark.parametrize("size, partly", [(200, True), (120, False)])  # a pixel a cell
def test_a_large_or_small_picture_after_edits_is_what_a_fresh_view_draws(qtbot, size, partly):
    """A picture of more than WHOLE_UP_TO pixels (recoloured where it changed) or fewer
    (recoloured whole): after edits of rows and columns it is what a fresh view draws, and
    an equal matrix is not redrawn."""
    from dataclasses import replace

    from attnviz.core.figures.figure import HeatmapSpec
    from attnviz.ui import heatmap

    labels = tuple(str(i) for i in range(size))
    values = np.random.default_rng(4).standard_normal((size, size))
    spec = HeatmapSpec("t", values, labels, labels, "q", "k", "diverging", (-6.0, 6.0))

    view = drawn(qtbot, spec)
    assert (math.prod(view.image.pixels.shape) > heatmap.WHOLE_UP_TO) == partly
    for row, col in ((17, 100), (3, 0), (size - 1, 64)):
        new = spec.values.copy()
        new[row] += 0.5
        new[:, col] -= 0.5
        spec = replace(spec, values=new)
        assert view.set_spec(spec)
        np.testing.assert_array_equal(view.image.pixels, drawn(qtbot, spec).image.pixels)
    assert not view.set_spec(replace(spec, values=spec.values.copy()))


def test_a_sampled_picture_is_recoloured_where_it_changed_to_what_a_fresh_view_draws(qtbot):
    """Cells smaller than pixels: the image holds a sample of the rows and columns; the
    changed lines (some shown, some not) are recoloured, and the picture is what a fresh
    view draws."""
    from dataclasses import replace

    from attnviz.core.figures.figure import HeatmapSpec

    small = (400, 350)
    rng = np.random.default_rng(8)
    labels = tuple(str(i) for i in range(900))
    values = rng.standard_normal((900, 900))
    spec = HeatmapSpec("t", values, labels, labels, "q", "k", "diverging", (-6.0, 6.0))

    view = drawn(qtbot, spec, small)
    assert view.image.rows is not None and view.image.cols is not None  # sampled both ways
    shown_rows, shown_cols = set(view.image.rows.tolist()), set(view.image.cols.tolist())
    rows = [r for r in range(900) if r in shown_rows][::40] + [
        r for r in range(900) if r not in shown_rows
    ][:3]
    cols = [c for c in range(900) if c in shown_cols][5:8] + [
        c for c in range(900) if c not in shown_cols
    ][-2:]
    new = values.copy()
    new[rows] += 1.5
    new[:, cols] -= 1.5
    assert view.set_spec(replace(spec, values=new))
    fresh = drawn(qtbot, replace(spec, values=new), small).image.pixels
    np.testing.assert_array_equal(view.image.pixels, fresh)
    # The pixels that changed colour show the changed lines (by hand, which those are).
    moved = np.isin(view.image.rows, rows)[:, None] | np.isin(view.image.cols, cols)[None, :]
    changed = view.image.pixels != drawn(qtbot, spec, small).image.pixels
    assert not (changed & ~moved).any() and changed.sum() > moved.sum() / 2


def test_the_named_lines_are_found_among_the_sampled_ones():
    """_at: the pixels of a sampled image that show one of the named lines, by hand; none
    when nothing is sampled or named; the lines themselves when nothing is sampled away."""
    from attnviz.ui.heatmap_parts import _at

    rng = np.random.default_rng(2)
    for _ in range(50):
        count = int(rng.integers(1, 400))
        sampled = np.sort(rng.integers(0, count, size=int(rng.integers(0, 300))))
        lines = np.unique(rng.integers(0, count, size=int(rng.integers(0, 6))))
        wanted = [i for i, cell in enumerate(sampled.tolist()) if cell in set(lines.tolist())]
        assert _at(sampled, lines).tolist() == wanted
    assert _at(np.empty(0, dtype=np.intp), np.array([1])).tolist() == []  # no pixel
    assert _at(np.array([0, 0, 1]), np.empty(0, dtype=np.intp)).tolist() == []
    assert _at(None, np.array([3, 9])).tolist() == [3, 9]


def test_a_large_matrix_in_a_small_picture_is_what_a_fresh_view_draws(qtbot):
    """A 512 × 768 matrix (a head's contribution in the Mix dock) shown in a picture of
    fewer than WHOLE_UP_TO pixels, changed everywhere: the picture is then what a fresh
    view draws, and an equal matrix is not redrawn."""
    from dataclasses import replace

    from attnviz.core.figures.figure import HeatmapSpec
    from attnviz.ui import heatmap

    rows, cols = tuple(str(i) for i in range(512)), tuple(str(j) for j in range(768))
    values = np.random.default_rng(5).standard_normal((512, 768))
    spec = HeatmapSpec("t", values, rows, cols, "q", "f", "diverging", (-6.0, 6.0))
    view = drawn(qtbot, spec, (220, 180))
    assert math.prod(view.image.pixels.shape) <= heatmap.WHOLE_UP_TO < values.size
    spec = replace(spec, values=values + 0.25)  # every cell changed
    assert view.set_spec(spec)
    np.testing.assert_array_equal(view.image.pixels, drawn(qtbot, spec, (220, 180)).image.pixels)
    assert not view.set_spec(replace(spec, values=spec.values.copy()))


def test_a_view_scrolled_out_of_sight_is_coloured_when_it_comes_into_view(qtbot):
    """A new spec given off screen; scrolled into view, the view paints the colour map of
    its latest values, every cell."""
    from dataclasses import replace

    from PySide6.QtWidgets import QLabel, QScrollArea, QVBoxLayout, QWidget

    from attnviz.core.figures.figure import HeatmapSpec
    from attnviz.ui import heatmap
    from attnviz.ui.heatmap import HeatmapView

    rng = np.random.default_rng(4)
    labels = tuple(str(i) for i in range(300))
    values = rng.standard_normal((300, 300))
    spec = HeatmapSpec("t", values, labels, labels, "q", "k", "diverging", (-4.0, 4.0))
    page = QWidget()
    column = QVBoxLayout(page)
    spacer = QLabel("above")
    spacer.setMinimumHeight(900)
    view = HeatmapView("t")
    view.setMinimumSize(300, 300)
    column.addWidget(spacer)
    column.addWidget(view)
    area = QScrollArea()
    area.setWidgetResizable(True)
    area.setWidget(page)
    area.resize(400, 400)
    qtbot.addWidget(area)
    area.show()
    qtbot.waitExposed(area)
    view.set_spec(spec)
    area.ensureWidgetVisible(view)
    qtbot.waitUntil(lambda: heatmap.on_screen(view), timeout=5000)
    qtbot.wait(20)
    area.verticalScrollBar().setValue(0)
    qtbot.waitUntil(lambda: not heatmap.on_screen(view), timeout=5000)

    new = values.copy()
    new[40:] *= -1.0
    assert view.set_spec(replace(spec, values=new))
    painted = []
    view.painted.connect(painted.append)
    area.ensureWidgetVisible(view)
    qtbot.waitUntil(lambda: bool(painted), timeout=5000)
    assert_drawn_as_a_whole(view, "scrolled into view")
    np.testing.assert_array_equal(view.spec.values[40:], -values[40:])
