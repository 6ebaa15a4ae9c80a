"""The heatmap widget on its own: zoom about the pointer, pan, back to the whole matrix,
labels that thin out without overlapping, square cells, and a click on a cell."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from PySide6.QtCore import QPoint, QPointF, Qt
from PySide6.QtGui import QFontMetricsF, QWheelEvent
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QApplication

from attnviz.core.figures.figure import HeatmapSpec
from attnviz.ui.heatmap import HeatmapView


def spec_of(rows: int, cols: int) -> HeatmapSpec:
    values = np.arange(rows * cols, dtype=float).reshape(rows, cols) / (rows * cols)
    return HeatmapSpec(
        "t",
        values,
        tuple(f"row{i}" for i in range(rows)),
        tuple(f"col{j}" for j in range(cols)),
        "query",
        "key",
        "sequential",
        (0.0, 1.0),
        "caption",
    )


@pytest.fixture
def view(qtbot):
    view = HeatmapView("test")
    qtbot.addWidget(view)
    view.resize(500, 400)
    view.set_spec(spec_of(64, 48))
    view.show()
    qtbot.waitExposed(view)
    return view


def wheel(view: HeatmapView, at: QPointF, clicks: float) -> None:
    event = QWheelEvent(
        at,
        view.mapToGlobal(at),
        QPoint(0, 0),
        QPoint(0, round(120 * clicks)),
        Qt.MouseButton.NoButton,
        Qt.KeyboardModifier.NoModifier,
        Qt.ScrollPhase.NoScrollPhase,
        False,
    )
    QApplication.sendEvent(view, event)


def test_the_wheel_zooms_about_the_pointer_and_no_further_out_than_the_matrix(view):
    assert view.view_range() == ((0, 48), (0, 64))
    at = view.point_at(30.25, 10.5)
    wheel(view, at, 2)  # in: 0.8 × 0.8 of the range
    (x0, x1), (y0, y1) = view.view_range()
    assert (x1 - x0, y1 - y0) == (pytest.approx(48 * 0.64), pytest.approx(64 * 0.64))
    moved = view.point_at(30.25, 10.5)  # the cell under the pointer stays there
    assert (moved.x(), moved.y()) == (pytest.approx(at.x()), pytest.approx(at.y()))
    wheel(view, at, -10)  # far out: the whole matrix, no more
    assert view.view_range() == ((0, 48), (0, 64))
    wheel(view, at, 100)  # far in: one cell at the least
    (x0, x1), (y0, y1) = view.view_range()
    assert min(x1 - x0, y1 - y0) == pytest.approx(1)


def test_a_drag_pans_inside_the_matrix_and_a_double_click_shows_it_whole(view, qtbot):
    wheel(view, view.point_at(24, 32), 5)
    (x0, _), (y0, _) = view.view_range()
    start = view.point_at(x0 + 2, y0 + 2).toPoint()
    cell = view.point_at(1, 1) - view.point_at(0, 0)
    QTest.mousePress(view, Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier, start)
    end = start + QPoint(round(3 * cell.x()), round(2 * cell.y()))  # three cells right, two down
    QTest.mouseMove(view, end)
    QTest.mouseRelease(view, Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier, end)
    (a0, _), (b0, _) = view.view_range()
    assert a0 == pytest.approx(x0 - 3, abs=0.1) and b0 == pytest.approx(y0 - 2, abs=0.1)
    assert view.selected is None  # a drag is not a click
    for _ in range(3):  # dragged far: stops at the matrix's edge
        QTest.mousePress(view, Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier, start)
        QTest.mouseMove(view, start + QPoint(400, 400))
        QTest.mouseRelease(
            view,
            Qt.MouseButton.LeftButton,
            Qt.KeyboardModifier.NoModifier,
            start + QPoint(400, 400),
        )
    (a0, _), (b0, _) = view.view_range()
    assert (a0, b0) == (0, 0)
    QTest.mouseDClick(view, Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier, start)
    assert view.view_range() == ((0, 48), (0, 64))


def test_labels_thin_out_never_overlap_and_fill_in_when_zoomed(view):
    metrics = QFontMetricsF(view.font())
    rows, cols = view.labelled()
    shown_before = len(cols)
    assert 0 < shown_before < 48 and 0 < len(rows) <= 64
    cell = view.point_at(1, 1) - view.point_at(0, 0)
    widest = max(metrics.horizontalAdvance(f"col{j}") for j in range(48))
    assert cols.step * cell.x() >= widest  # side by side without touching
    assert rows.step * cell.y() >= metrics.height()
    wheel(view, view.point_at(24.3, 32.7), 8)
    rows, zoomed = view.labelled()
    assert len(zoomed) > 0 and zoomed.step < cols.step
    (x0, x1), (y0, y1) = view.view_range()
    assert x0 > 0 and y0 > 0  # zoomed into the middle: cells cut at every edge
    # Only labels of cells whose middle is on screen (none above or beside the cells).
    assert all(x0 <= j + 0.5 <= x1 for j in zoomed) and all(y0 <= i + 0.5 <= y1 for i in rows)
    assert zoomed.start % zoomed.step == 0  # the same labels wherever the view is panned


def test_square_cells_stay_square_through_resizes(view, qtbot):
    view.square_cells = True
    view.set_spec(spec_of(6, 6))
    for size in ((500, 400), (300, 500), (640, 260)):
        view.resize(*size)
        qtbot.wait(1)
        step = view.point_at(1, 1) - view.point_at(0, 0)
        assert step.x() == pytest.approx(step.y())
        (x0, x1), (y0, y1) = view.view_range()
        assert x0 == 0 and y0 == 0 and x1 >= 6 and y1 >= 6  # the whole matrix, in the corner


def test_a_click_selects_the_cell_under_the_pointer(view, qtbot):
    with qtbot.waitSignal(view.cellClicked) as clicked:
        QTest.mouseClick(
            view,
            Qt.MouseButton.LeftButton,
            Qt.KeyboardModifier.NoModifier,
            view.point_at(7.5, 40.5).toPoint(),
        )
    assert clicked.args == ["test", 40, 7] and view.selected == (40, 7)


def test_values_are_printed_in_whole_cells_only(view, qtbot):
    """Zoomed so that cells are cut at every edge, only the cells wholly on screen print
    their values (a cut "1.86" would read ".86"); too small to read, none do."""
    view.set_spec(spec_of(10, 10))
    assert view.printed_cells() is None or view.printed_cells() == (0, 10, 0, 10)
    wheel(view, view.point_at(5.3, 4.6), 3)
    (x0, x1), (y0, y1) = view.view_range()
    assert x0 % 1 and y0 % 1  # cut cells at the edges
    rows = [i for i in range(10) if y0 <= i and i + 1 <= y1]
    cols = [j for j in range(10) if x0 <= j and j + 1 <= x1]
    assert view.printed_cells() == (rows[0], rows[-1] + 1, cols[0], cols[-1] + 1)
    view.set_spec(spec_of(300, 300))  # cells of about a pixel: no values
    assert view.printed_cells() is None


def test_samples_are_the_cells_under_the_middles_of_the_pixels():
    from attnviz.ui.heatmap_parts import samples

    assert samples(10, 0.0, 1.0, 0.0, 100.0) is None  # a pixel a cell or more: every cell
    s = samples(1000, 12.3, 0.37, 20.0, 300.0)  # cells from pixel 12.3 on, 0.37 px each
    assert s is not None
    for p in range(int(s.first) - 3, int(s.last) + 3):
        middle = p + 0.5
        on_screen = 20.0 <= middle < 300.0 and 12.3 <= middle < 12.3 + 1000 * 0.37
        assert (s.first <= p < s.last) == on_screen, p
        if on_screen:
            assert s.cells[p - s.first] == math.floor((middle - 12.3) / 0.37)


def test_a_matrix_larger_than_its_view_is_coloured_pixel_for_pixel(view, qtbot):
    """512 × 512 cells in a view a few hundred pixels across: the image holds one cell per
    screen pixel, and every pixel on screen is the colour of the cell under its middle,
    after the view is drawn, after an edit of one row and column, and after a zoom."""
    from attnviz.core.figures import colors

    rng = np.random.default_rng(2)
    spec = spec_of(512, 512)
    values = rng.uniform(0, 1, (512, 512))
    view.set_spec(replace(spec, values=values))

    def under(p: int, origin: float, step: float) -> range:
        """The cells a screen pixel may show along one axis: the one under its middle
        where cells are smaller than pixels (sampled), else any the pixel overlaps (Qt
        scales the image, rounding its own way)."""
        if step < 1:
            middle = math.floor((p + 0.5 - origin) / step)
            return range(middle, middle + 1)
        return range(math.floor((p - origin) / step), math.floor((p + 1 - origin) / step) + 1)

    def check() -> None:
        view.repaint()
        image = view.grab().toImage()
        origin, step = view.point_at(0, 0), view.point_at(1, 1) - view.point_at(0, 0)
        want = colors.argb(view.spec.values, "sequential", (0.0, 1.0)) & 0xFFFFFF
        plot = view._plot
        for py in range(math.ceil(plot.top()), math.floor(plot.bottom()), 7):
            for px in range(math.ceil(plot.left()), math.floor(plot.right()), 5):
                rows = [r for r in under(py, origin.y(), step.y()) if 0 <= r < 512]
                cols = [c for c in under(px, origin.x(), step.x()) if 0 <= c < 512]
                if rows and cols:
                    got = image.pixel(px, py) & 0xFFFFFF
                    assert got in want[np.ix_(rows, cols)], (px, py, rows, cols)

    assert view.image.rows is not None and view.image.cols is not None
    assert view.image.pixels.size < 512 * 512 // 2
    check()
    edited = values.copy()
    edited[100] = rng.uniform(0, 1, 512)
    edited[:, 300] = rng.uniform(0, 1, 512)
    view.set_spec(replace(spec, values=edited))
    check()
    wheel(view, view.point_at(200.3, 150.6), 1)  # still smaller than pixels
    assert view.point_at(1, 1).y() - view.point_at(0, 0).y() < 1
    check()
    wheel(view, view.point_at(200.3, 150.6), 3)  # now larger: every cell, scaled by Qt
    check()
    assert view.image.rows is None and view.image.cols is None  # resampled when painted


def test_bars_of_rows_thinner_than_a_pixel_show_the_longest_of_each_pixel_row(view, qtbot):
    """512 rows in a few hundred pixels: each pixel row of the strip beside them shows a
    bar as long as the longest of the rows that start in it (none hidden by a neighbour
    drawn after it)."""
    from attnviz.ui.heatmap import RowBars

    rng = np.random.default_rng(5)
    values = rng.uniform(0, 1, 512) * (rng.uniform(0, 1, 512) < 0.2)  # mostly zero
    view.set_spec(spec_of(512, 8))
    view.set_row_bars([RowBars("leak", values, 1.0, ("#1f77b4",) * 512, ("",) * 512)])
    view.repaint()
    image = view.grab().toImage()
    top, step = view.point_at(0, 0).y(), view.point_at(0, 1).y() - view.point_at(0, 0).y()
    assert step < 1
    x0 = view.point_at(8, 0).x() + 4  # the strip's first column of bars
    width = view.strip.COLUMN - 8
    grey = 0xEEEEEE
    checked = 0
    for py in range(math.ceil(top) + 1, math.floor(top + 512 * step) - 1):
        rows = [i for i in range(512) if math.floor(top + i * step) == py]
        if not rows:
            continue
        want = width * values[rows].max()
        strip = [image.pixel(x, py) & 0xFFFFFF for x in range(int(x0) - 1, int(x0 + width) + 2)]
        got = sum(colour not in (grey, 0xFFFFFF) for colour in strip)  # the bar's pixels
        assert abs(got - want) <= 1.5, (py, rows, got, want)
        checked += 1
    assert checked > 200


def test_bars_paint_when_zoomed_onto_the_room_below_the_rows(qtbot):
    """Square cells leave room below a tall view's matrix; zoomed onto it no row is in
    sight: the bars beside the rows draw nothing (they raised, and the process died)."""
    from PySide6.QtCore import QRectF

    from attnviz.ui.heatmap import RowBars

    n = 1024
    view = HeatmapView("difference")
    qtbot.addWidget(view)
    view.square_cells = True
    view.resize(300, 900)
    view.show()
    view.set_spec(spec_of(n, n))
    view.fit()
    view.set_row_bars([RowBars("leak", np.linspace(0, 1, n), 1.0, ("#1f77b4",) * n, ("",) * n)])
    limits = view._limits
    view._show(
        QRectF(0, limits.bottom() - limits.height() / 2, limits.width() / 2, limits.height() / 2)
    )
    (_, _), (top, _) = view.view_range()
    assert top >= n  # nothing but the room below the matrix
    view.grab()  # (pytest-qt fails the test on an exception raised while painting)
