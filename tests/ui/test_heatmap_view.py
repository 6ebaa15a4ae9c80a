"""The heatmap widget on its own: zoom about the pointer, pan, back to the whole matrix,
labels that thin out without overlapping, square cells, and a click on a cell."""

from __future__ import annotations

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
