"""Words and sizes of the editable grids: undo texts, status messages, cells at GPT-2 sizes.

Heads are named as on the Weights tabs ("head 2 W_V"); a refusal in the status bar gives
way to the next edit that goes through; numbers fit their cells and a head's three grids
are alike.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from PySide6.QtCore import QItemSelection, QItemSelectionModel
from PySide6.QtWidgets import QApplication, QStyle

from attnviz.core.presets import make_preset
from attnviz.ui.document import Document
from attnviz.ui.grid import MatrixGrid
from attnviz.ui.matrix_model import MatrixModel
from attnviz.ui.panels.weights import WeightsPanel
from attnviz.ui.workspace import Workspace

pytestmark = pytest.mark.usefixtures("warnings_shown", "answers")

HEADS = ("W_Q", "W_K", "W_V")


def select_block(grid, row: int, col: int, rows: int, cols: int) -> None:
    model = grid.model()
    grid.setCurrentIndex(model.index(row, col))
    block = QItemSelection(model.index(row, col), model.index(row + rows - 1, col + cols - 1))
    grid.selectionModel().select(block, QItemSelectionModel.SelectionFlag.ClearAndSelect)


def settle(qtbot) -> None:
    QApplication.processEvents()
    qtbot.wait(10)
    QApplication.processEvents()


@pytest.fixture
def doc():
    document = Document()
    return document


# Undo texts and messages name a head as the window does ------------------------------------


def test_undo_texts_and_refusals_say_head_2_not_heads_index(doc, qtbot):
    grid = MatrixGrid(MatrixModel(doc, "W_V", 1))
    qtbot.addWidget(grid)
    stack = doc.undo_stack
    model = grid.matrix_model()
    assert model.title == "head 2 W_V"

    assert model.setData(model.index(2, 0), "0.5")
    assert stack.undoText() == "Edit head 2 W_V[3,1]"
    select_block(grid, 0, 0, 1, 1)
    assert grid.paste_text("1 2\n3 4\n5 6\n7 8")
    assert stack.undoText() == "Paste 4×2 into head 2 W_V"
    select_block(grid, 1, 0, 2, 2)
    assert grid.paste_text("0.25")
    assert stack.undoText() == "Fill 2×2 cells of head 2 W_V"
    grid.clear()
    assert stack.undoText() == "Set 2×2 cells of head 2 W_V to 0"
    select_block(grid, 3, 1, 1, 1)
    grid.clear()
    assert stack.undoText() == "Set head 2 W_V[4,2] to 0"

    with qtbot.waitSignal(grid.message) as refusal:
        assert not grid.paste_text("1 2 3")  # three columns into two
    assert refusal.args[0].startswith("head 2 W_V: ") and "heads[" not in refusal.args[0]
    with qtbot.waitSignal(grid.message) as refusal:
        assert not model.setData(model.index(0, 0), "abc")
    assert refusal.args[0].startswith("head 2 W_V[1,1]: ")


def test_an_edit_that_goes_through_replaces_a_refusal_in_the_status_bar(make_window, qtbot):
    window = make_window()
    status = window.statusBar()
    grid = window.weights.grids[("W_Q", 0)]
    select_block(grid, 0, 0, 1, 1)

    assert not grid.paste_text("1 2 3")
    assert "nothing was changed" in status.currentMessage()
    assert grid.paste_text("1 2\n3 4\n5 6\n7 8")
    assert status.currentMessage() == "Pasted 4×2 into head 1 W_Q"

    assert not grid.paste_text("abc")
    assert "refused" in status.currentMessage()
    assert grid.matrix_model().setData(grid.model().index(1, 1), "0.75")  # a typed value
    assert status.currentMessage() == ""

    x = window.inputs.grid
    select_block(x, 0, 0, 2, 2)
    assert not x.paste_text("nan")
    x.clear()
    assert status.currentMessage() == "Set 2×2 cells of X to 0"


# Grids at GPT-2 sizes and at the worked example --------------------------------------------


def text_room(grid: MatrixGrid, col: int) -> int:
    """The pixels a cell's text may take in a column (as QCommonStyle lays out item text)."""
    margin = grid.style().pixelMetric(QStyle.PixelMetric.PM_FocusFrameHMargin, None, grid)
    return grid.columnWidth(col) - 2 * (margin + 1)


def close_to_shown(text: str, value: float) -> bool:
    """Whether text is value rounded to the digits it shows (to at least one digit)."""
    if value == 0:
        return float(text) == 0
    shown = float(text)
    unit = 10.0 ** math.floor(math.log10(abs(value)))  # the first significant digit
    return abs(shown - value) <= 0.5 * unit * (1 + 1e-9)


def test_numbers_fit_their_cells_at_gpt2_sizes(shown_window, qtbot):
    from attnviz.ui.grid import NumberDelegate

    window = shown_window(scenario=make_preset("gpt2-small", n=64))
    window.resize(1440, 900)
    window.docks["Weights"].raise_()
    settle(qtbot)
    grids = [window.weights.grids[(name, 0)] for name in HEADS]
    grids += [window.weights.w_o, window.inputs.grid]
    digits = []
    for grid in grids:
        assert isinstance(grid.itemDelegate(), NumberDelegate)
        metrics = grid.fontMetrics()
        values = grid.matrix_model().matrix()
        assert 0 < grid.columnWidth(0) <= grid.viewport().width()  # a whole column shows
        assert grid.horizontalScrollBar().isVisible()  # and the rest scroll
        for row in range(6):
            for col in range(2):
                text = grid.shown_text(row, col)
                assert metrics.horizontalAdvance(text) <= text_room(grid, col), text
                assert close_to_shown(text, float(values[row, col])), (text, values[row, col])
                digits.append(len(text.lstrip("-0.").split("e")[0].replace(".", "")))
    assert np.median(digits) >= 2  # mostly two significant digits or more


def test_wide_cells_keep_four_significant_digits(doc, qtbot):
    grid = MatrixGrid(MatrixModel(doc, "X"))
    qtbot.addWidget(grid)
    grid.resize(600, 300)
    grid.horizontalHeader().resizeSection(0, 120)
    grid.show()
    qtbot.waitExposed(grid)
    assert grid.matrix_model().setData(grid.model().index(0, 0), "0.123456")
    assert grid.shown_text(0, 0) == "0.1235"
    assert grid.shown_text(0, 2) == "-0.3"


def head_grids(panel: WeightsPanel, head: int = 0) -> list[MatrixGrid]:
    return [panel.grids[(name, head)] for name in HEADS]


def content_width(grid: MatrixGrid) -> int:
    """The width the grid needs to show every column without a horizontal scrollbar."""
    scrollbar = grid.verticalScrollBar()
    return (
        2 * grid.frameWidth()
        + grid.verticalHeader().width()
        + grid.horizontalHeader().length()
        + (scrollbar.width() if scrollbar.isVisible() else 0)
    )


@pytest.mark.parametrize("preset", ["worked-example", "gpt2-small"])
def test_a_heads_three_grids_have_one_size_and_the_same_scrollbars(qtbot, preset):
    panel = WeightsPanel(Workspace.create(make_preset(preset)))
    qtbot.addWidget(panel)
    panel.show()
    qtbot.waitExposed(panel)
    fits = 0
    for width in range(panel.minimumSizeHint().width(), 720, 5):
        for height in (260, 420):
            panel.resize(width, height)
            settle(qtbot)
            grids = head_grids(panel)
            where = (width, height, [g.size().toTuple() for g in grids])
            assert len({g.size().toTuple() for g in grids}) == 1, where
            bars = [g.horizontalScrollBar().isVisible() for g in grids]
            assert len(set(bars)) == 1, where
            if grids[0].width() >= content_width(grids[0]):
                assert not bars[0], where  # the content fits: no scrollbar at all
                fits += 1
    assert (fits > 0) == (preset == "worked-example")


def test_columns_keep_their_width_whatever_the_room(qtbot):
    """Columns are as wide as their numbers: a narrow panel never squeezes them (the grids
    stack or scroll instead), a wide one never stretches them."""
    panel = WeightsPanel(Workspace.create())  # the worked example: three 4 × 2 grids
    qtbot.addWidget(panel)
    panel.show()
    qtbot.waitExposed(panel)
    widths = set()
    for width in (250, 372, 700):
        panel.resize(width, 520)
        settle(qtbot)
        for grid in head_grids(panel):
            widths |= {grid.columnWidth(j) for j in range(2)}
            assert not grid.horizontalScrollBar().isVisible(), width
            assert grid.shown_text(3, 0) == grid.model().data(grid.model().index(3, 0))
    assert len(widths) == 1, widths
