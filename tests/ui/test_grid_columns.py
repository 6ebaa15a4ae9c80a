"""Columns sized to their numbers, weight grids that show their columns, and the Inputs and
Weights docks following every replacement of the scenario.

A cell must show its whole number as the model writes it (four significant digits, ``.4g``,
worked out here from the scenario's matrices), never a shortened or cut-off one.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from PySide6.QtWidgets import QApplication, QScrollArea, QStyle

from attnviz.core.maths.scenario import Scenario, resized
from attnviz.core.presets import make_preset, random_scenario
from attnviz.ui.grid import MatrixGrid
from attnviz.ui.panels.weights import WeightsPanel
from attnviz.ui.workspace import Workspace

pytestmark = pytest.mark.usefixtures("warnings_shown", "answers")

SIZES = [(1280, 720), (1440, 900)]
HEADS = ("W_Q", "W_K", "W_V")


def settle(qtbot) -> None:
    for _ in range(3):
        QApplication.processEvents()
        qtbot.wait(10)


def text_room(grid: MatrixGrid, col: int) -> int:
    """The pixels a cell's text may take in a column (as QCommonStyle lays out item text)."""
    margin = grid.style().pixelMetric(QStyle.PixelMetric.PM_FocusFrameHMargin, None, grid)
    return grid.columnWidth(col) - 2 * (margin + 1)


def in_view(grid: MatrixGrid, count: int, at, size: int) -> range:
    """The rows or columns (at most 12) the grid's viewport shows, wholly or in part."""
    first = max(at(0), 0)
    last = at(size - 1)
    return range(first, min(count if last < 0 else last + 1, first + 12))


def assert_whole_numbers(grid: MatrixGrid, matrix: np.ndarray) -> int:
    """Every cell in view shows its whole number, which fits its column; how many cells."""
    metrics, viewport = grid.fontMetrics(), grid.viewport()
    rows = in_view(grid, matrix.shape[0], grid.rowAt, viewport.height())
    cols = in_view(grid, matrix.shape[1], grid.columnAt, viewport.width())
    for row in rows:
        for col in cols:
            whole = f"{float(matrix[row, col]):.4g}"
            shown = grid.shown_text(row, col)
            where = (grid.objectName(), row, col, grid.columnWidth(col))
            assert shown == whole, where
            assert metrics.horizontalAdvance(whole) <= text_room(grid, col), where
    return len(rows) * len(cols)


def big_with_biases() -> Scenario:
    """A MiniLM-sized layer with biases, as an import of a model layer makes."""
    s = random_scenario(n=8, d_model=384, heads=12, d_k=32)
    rng = np.random.default_rng(2)
    return dataclasses.replace(
        s,
        b_Q=rng.normal(size=(12, 1, 32)),
        b_K=rng.normal(size=(12, 1, 32)),
        b_V=rng.normal(size=(12, 1, 32)),
        b_O=rng.normal(size=(1, 384)),
    )


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("preset", ["worked-example", "sliding-window", "alibi", "llama-style"])
def test_every_number_in_view_is_whole_at_laptop_sizes(make_window, qtbot, preset, size):
    scenario = make_preset(preset)
    window = make_window(scenario=scenario)
    window.resize(*size)
    window.show()
    qtbot.waitExposed(window)
    window.docks["Inputs"].raise_()
    window.docks["Weights"].raise_()
    settle(qtbot)
    x = window.inputs.grid
    assert assert_whole_numbers(x, scenario.X) > 0
    # the columns of X do not fit: the grid scrolls, its columns keep their width
    if scenario.d_model > 8:
        assert x.horizontalScrollBar().isVisible()
    weights = window.weights
    for name in HEADS:
        grid = weights.grids[(name, 0)]
        page = weights.tabs.widget(0)
        if isinstance(page, QScrollArea):  # the head's grids, stacked, scroll into view
            page.ensureWidgetVisible(grid)
        settle(qtbot)
        assert assert_whole_numbers(grid, scenario.matrix(name, 0)) > 0, name
        if scenario.d_k <= 4:  # a few columns: all of them show, none scrolled away
            assert not grid.horizontalScrollBar().isVisible(), name
    assert assert_whole_numbers(weights.w_o, scenario.W_O) > 0


@pytest.mark.parametrize("size", [(380, 440), (400, 520)])
def test_the_worked_example_shows_every_weight_without_scrolling(qtbot, size):
    """The Weights dock at about its size in 1280 × 720 and 1440 × 900 windows."""
    scenario = make_preset("worked-example")
    panel = WeightsPanel(Workspace.create(scenario))
    qtbot.addWidget(panel)
    panel.resize(*size)
    panel.show()
    qtbot.waitExposed(panel)
    settle(qtbot)
    grids = [panel.grids[(name, 0)] for name in HEADS] + [panel.w_o]
    for grid in grids:
        assert not grid.horizontalScrollBar().isVisible(), grid.objectName()
        assert not grid.verticalScrollBar().isVisible(), grid.objectName()
        matrix = grid.matrix_model().matrix()
        assert assert_whole_numbers(grid, matrix) == matrix.size, grid.objectName()
    tops = {grid.mapTo(panel, grid.rect().topLeft()).y() for grid in grids[:3]}
    assert len(tops) == 1  # W_Q, W_K and W_V side by side


def test_weight_grids_too_wide_to_sit_side_by_side_are_stacked_not_squeezed(qtbot):
    scenario = make_preset("llama-style")  # d_model 8, d_k 4
    panel = WeightsPanel(Workspace.create(scenario))
    qtbot.addWidget(panel)
    panel.resize(380, 440)
    panel.show()
    qtbot.waitExposed(panel)
    settle(qtbot)
    grids = [panel.grids[(name, 0)] for name in HEADS]
    for grid in grids:
        assert not grid.horizontalScrollBar().isVisible(), grid.objectName()
        assert grid.columnAt(grid.viewport().width() - 1) in (-1, 3)  # all four columns
    ys = [grid.mapTo(panel, grid.rect().topLeft()).y() for grid in grids]
    assert ys[0] < ys[2]  # W_V below W_Q
    panel.resize(900, 440)  # room for all three: side by side again
    settle(qtbot)
    assert len({grid.mapTo(panel, grid.rect().topLeft()).y() for grid in grids}) == 1


def test_a_typed_wide_number_widens_its_column(qtbot):
    panel = WeightsPanel(Workspace.create(make_preset("worked-example")))
    qtbot.addWidget(panel)
    panel.resize(400, 520)
    panel.show()
    qtbot.waitExposed(panel)
    grid = panel.grids[("W_K", 0)]
    model = grid.matrix_model()
    assert model.setData(model.index(1, 0), "-0.000123456")
    settle(qtbot)
    assert grid.shown_text(1, 0) == "-0.0001235"
    assert grid.fontMetrics().horizontalAdvance("-0.0001235") <= text_room(grid, 0)
    # the head's three grids keep one column width, so they stay alike
    assert {panel.grids[(name, 0)].columnWidth(0) for name in HEADS} == {grid.columnWidth(0)}


def controls(window) -> dict[str, object]:
    """What the Inputs and Weights docks show of the scenario."""
    inputs, weights = window.inputs, window.weights
    return {
        "d_model": inputs.d_model.value(),
        "cross": inputs.cross.isChecked(),
        "heads": weights.heads.value(),
        "kv_heads": weights.kv_heads.value(),
        "d_k": weights.d_k.value(),
        "biases": weights.biases.isChecked(),
        "b_O shown": not weights.b_o.isHidden(),
        "tabs": weights.tabs.count(),
        "X": (inputs.model.rowCount(), inputs.model.columnCount()),
    }


def expected(s: Scenario) -> dict[str, object]:
    biases = any(np.any(getattr(s, b) != 0) for b in ("b_Q", "b_K", "b_V", "b_O"))
    return {
        "d_model": s.X.shape[1],
        "cross": s.X_kv is not None,
        "heads": len(s.W_Q),
        "kv_heads": len(s.W_K),
        "d_k": s.W_Q.shape[2],
        "biases": biases,
        "b_O shown": biases,
        "tabs": len(s.W_Q),
        "X": s.X.shape,
    }


def test_the_docks_follow_every_replacement_of_the_scenario(make_window, qtbot):
    window = make_window()
    window.resize(1280, 720)
    window.show()
    qtbot.waitExposed(window)
    settle(qtbot)
    small = window.weights.grids[("W_Q", 0)].columnWidth(0)
    big = big_with_biases()
    window.doc.load(big, None, "Import layer 3 of MiniLM")  # as an import does
    settle(qtbot)
    assert controls(window) == expected(big)
    wide = window.weights.grids[("W_Q", 0)]
    assert assert_whole_numbers(wide, big.W_Q[0]) > 0
    assert wide.columnWidth(0) > small

    window.doc.undo_stack.setClean()  # no "save the changes?" question
    window.files.new_document()  # File > New
    settle(qtbot)
    new = window.doc.scenario
    assert controls(window) == expected(new)
    assert not window.weights.biases.isChecked()
    for name in HEADS:
        grid = window.weights.grids[(name, 0)]
        assert grid.columnWidth(0) == small, name  # back to the width for small numbers
        assert not grid.horizontalScrollBar().isVisible(), name
        assert assert_whole_numbers(grid, new.matrix(name, 0)) == 8, name
    assert window.inputs.grid.columnWidth(0) <= small + 4

    for step in ("undo", "redo", "undo"):
        getattr(window.doc.undo_stack, step)()
        settle(qtbot)
        assert controls(window) == expected(window.doc.scenario), step
    for preset in ("llama-style", "cross-attention", "alibi", "worked-example"):
        window.doc.replace(make_preset(preset), preset)
        settle(qtbot)
        assert controls(window) == expected(window.doc.scenario), preset


def test_a_tick_of_the_users_own_stays_through_edits(qtbot):
    ws = Workspace.create(make_preset("worked-example"))
    panel = WeightsPanel(ws)
    qtbot.addWidget(panel)
    panel.biases.setChecked(True)  # zero bias rows, to type into
    ws.doc.change(lambda s: resized(s, d_k=3), "Set d_k to 3")
    assert panel.biases.isChecked()
    assert panel.grids[("b_Q", 0)].matrix_model().columnCount() == 3
