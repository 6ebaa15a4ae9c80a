"""Table models and spreadsheet grids: the model contract, typing, undo, clipboard, refusals.

Expected numbers come from the brief's matrices (``reference``) and the values typed here.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import reference
from PySide6.QtCore import QItemSelection, QItemSelectionModel, Qt
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QAbstractItemView, QApplication

from attnviz.core.maths.scenario import resized
from attnviz.core.presets import worked_example
from attnviz.ui.document import Document
from attnviz.ui.matrix_model import MatrixModel

# Never let a message box block the run: warnings are recorded (tests that expect one ask
# for the list) and any other box nobody answers is rejected and fails the test.
pytestmark = pytest.mark.usefixtures("warnings_shown", "answers")

TOKENS = ("she", "saw", "the", "cat")
CTRL = Qt.KeyboardModifier.ControlModifier


def matrices(doc) -> dict[str, np.ndarray]:
    """Every editable matrix of the document's scenario, copied."""
    s = doc.scenario
    return {name: np.array(getattr(s, name)) for name in ("X", "W_Q", "W_K", "W_V", "W_O")}


def assert_same_matrices(before: dict[str, np.ndarray], after: dict[str, np.ndarray]) -> None:
    assert before.keys() == after.keys()
    for name in before:
        np.testing.assert_array_equal(after[name], before[name], err_msg=name)


def type_into(qtbot, grid, row: int, col: int, text: str) -> None:
    """Type text into a cell the way a user does: select it, type, press Enter."""
    grid.setFocus()
    grid.setCurrentIndex(grid.model().index(row, col))
    qtbot.keyClicks(grid, text[0])  # any key opens the editor with that key in it
    editor = QApplication.focusWidget()
    assert editor is not grid and grid.state() == QAbstractItemView.State.EditingState
    qtbot.keyClicks(editor, text[1:])
    qtbot.keyClick(editor, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: grid.state() != QAbstractItemView.State.EditingState)


def select_block(grid, row: int, col: int, rows: int, cols: int) -> None:
    model = grid.model()
    grid.setCurrentIndex(model.index(row, col))
    block = QItemSelection(model.index(row, col), model.index(row + rows - 1, col + cols - 1))
    grid.selectionModel().select(block, QItemSelectionModel.SelectionFlag.ClearAndSelect)


@pytest.fixture
def window(shared_window, qtbot):
    """The shared window, active, back on the worked example with an empty undo history."""
    shared_window.doc.reset(worked_example(), None)
    shared_window.view_state.set_head(0)
    QGuiApplication.clipboard().clear()
    if QApplication.activeWindow() is not shared_window:
        qtbot.waitExposed(shared_window)
        with qtbot.waitActive(shared_window):
            shared_window.activateWindow()
    yield shared_window
    shared_window.doc.undo_stack.setClean()


def grid_for(window, name: str, head: int | None = None):
    if name == "X":
        return window.inputs.grid
    return window.weights.grids[(name, head)]


# The model contract -------------------------------------------------------------------


def test_models_pass_qtmodeltester_through_edits_and_resizes(qtmodeltester):
    doc = Document()
    try:
        models = [
            MatrixModel(doc, "X"),
            MatrixModel(doc, "W_Q", 0),
            MatrixModel(doc, "W_K", 1),
            MatrixModel(doc, "W_V", 1),
            MatrixModel(doc, "W_O"),
        ]
        for model in models:
            qtmodeltester.check(model)
        assert [(m.rowCount(), m.columnCount()) for m in models] == [
            (4, 4),
            (4, 2),
            (4, 2),
            (4, 2),
            (4, 4),
        ]
        # The testers stay attached: edits, resets and header changes must keep the contract.
        assert models[0].setData(models[0].index(1, 2), "0.75")
        assert models[4].set_block(0, 0, np.ones((2, 3)))
        doc.replace(resized(doc.scenario, n=6, d_model=5), "grow")
        doc.replace(resized(doc.scenario, d_k=3), "wider heads")
        assert (models[0].rowCount(), models[0].columnCount()) == (6, 5)
        assert (models[1].rowCount(), models[1].columnCount()) == (5, 3)
        assert (models[4].rowCount(), models[4].columnCount()) == (6, 5)
        doc.undo_stack.undo()
        doc.undo_stack.undo()
        for model in models:
            qtmodeltester.check(model)
        assert doc.scenario.X[1, 2] == 0.75
    finally:
        doc.deleteLater()


def test_model_data_and_headers():
    doc = Document()
    try:
        x, w_o = MatrixModel(doc, "X"), MatrixModel(doc, "W_O")
        role = Qt.ItemDataRole
        assert [x.headerData(i, Qt.Orientation.Vertical) for i in range(4)] == list(TOKENS)
        assert [x.headerData(j, Qt.Orientation.Horizontal) for j in range(4)] == list("1234")
        assert [w_o.headerData(i, Qt.Orientation.Vertical) for i in range(4)] == [
            "h1·1",
            "h1·2",
            "h2·1",
            "h2·2",
        ]
        # Exact values for editing and tooltips, plain Python types throughout.
        assert x.data(x.index(0, 2), role.EditRole) == "-0.3"
        assert float(x.data(x.index(0, 2), role.DisplayRole)) == -0.3
        assert x.data(x.index(3, 1), role.ToolTipRole) == repr(-0.6)
        flags = x.flags(x.index(0, 0))
        assert flags & Qt.ItemFlag.ItemIsEditable and flags & Qt.ItemFlag.ItemIsSelectable
    finally:
        doc.deleteLater()


# Typing into the grid -------------------------------------------------------------------


def test_typed_value_changes_the_pipeline_heatmaps(window, qtbot):
    grid = window.inputs.grid
    type_into(qtbot, grid, 0, 0, "1.5")  # X[she, 1]

    X = reference.X.copy()
    X[0, 0] = 1.5
    assert window.doc.scenario.X[0, 0] == 1.5
    np.testing.assert_array_equal(window.doc.scenario.X, X)
    assert grid.currentIndex().row() == 1 and grid.currentIndex().column() == 0  # Enter: down
    assert window.doc.undo_stack.count() == 1

    views = window.pipeline.views
    np.testing.assert_allclose(views["Q"].spec.values, X @ reference.W_Q[0], rtol=0, atol=1e-12)
    np.testing.assert_allclose(views["K"].spec.values, X @ reference.W_K[0], rtol=0, atol=1e-12)
    np.testing.assert_allclose(views["V"].spec.values, X @ reference.W_V[0], rtol=0, atol=1e-12)
    scores, weights, output = reference.head(
        X, reference.W_Q[0], reference.W_K[0], reference.W_V[0]
    )
    np.testing.assert_allclose(views["scaled"].spec.values, scores, rtol=0, atol=1e-12)
    np.testing.assert_allclose(views["weights"].spec.values, weights, rtol=0, atol=1e-12)
    np.testing.assert_allclose(views["output"].spec.values, output, rtol=0, atol=1e-12)


def test_enter_moves_down_and_shift_enter_up(window, qtbot):
    grid = window.inputs.grid
    grid.setFocus()
    grid.setCurrentIndex(grid.model().index(1, 2))
    qtbot.keyClick(grid, Qt.Key.Key_Return)
    assert (grid.currentIndex().row(), grid.currentIndex().column()) == (2, 2)
    qtbot.keyClick(grid, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
    qtbot.keyClick(grid, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
    assert (grid.currentIndex().row(), grid.currentIndex().column()) == (0, 2)
    grid.setCurrentIndex(grid.model().index(3, 1))
    qtbot.keyClick(grid, Qt.Key.Key_Enter)
    assert grid.currentIndex().row() == 3  # the last row stays
    assert window.doc.undo_stack.count() == 0  # moving edits nothing
    np.testing.assert_array_equal(window.doc.scenario.X, reference.X)


@pytest.mark.parametrize("text", ["abc", "nan", "1e999", "inf", "1e7", "0x10"])
def test_typed_bad_text_is_refused_and_the_cell_keeps_its_value(window, qtbot, text):
    grid = grid_for(window, "W_K", 0)
    before = matrices(window.doc)
    with qtbot.waitSignal(grid.message, timeout=2000) as message:
        type_into(qtbot, grid, 2, 1, text)
    assert text in message.args[0] or text.replace("e", "E") in message.args[0]
    assert "head 1 W_K[3,2]" in message.args[0]
    assert_same_matrices(before, matrices(window.doc))
    assert window.doc.scenario.W_K[0, 2, 1] == 0.7
    assert window.doc.undo_stack.count() == 0


def test_undo_and_redo_restore_exact_values(window, qtbot):
    doc = window.doc
    grid = grid_for(window, "W_Q", 1)
    result_before = np.array(window.compute.result.final)
    type_into(qtbot, grid, 1, 0, "0.30000000000000004")  # 0.1 + 0.2, not 0.3
    type_into(qtbot, window.inputs.grid, 3, 3, "-0.1234567890123456789")
    assert doc.scenario.W_Q[1, 1, 0] == 0.1 + 0.2
    assert doc.scenario.X[3, 3] == -0.1234567890123456789
    assert doc.undo_stack.count() == 2

    doc.undo_stack.undo()
    assert doc.scenario.X[3, 3] == 0.8
    doc.undo_stack.undo()
    assert doc.scenario.W_Q[1, 1, 0] == -0.2
    np.testing.assert_array_equal(doc.scenario.W_Q, reference.W_Q)
    np.testing.assert_array_equal(doc.scenario.X, reference.X)
    np.testing.assert_array_equal(window.compute.result.final, result_before)

    doc.undo_stack.redo()
    doc.undo_stack.redo()
    assert doc.scenario.W_Q[1, 1, 0] == 0.1 + 0.2
    assert doc.scenario.X[3, 3] == -0.1234567890123456789
    # The pipeline follows: head 2's Q row "saw" uses the redone weight.
    window.view_state.set_head(1)
    X = reference.X.copy()
    X[3, 3] = -0.1234567890123456789
    W = reference.W_Q[1].copy()
    W[1, 0] = 0.1 + 0.2
    np.testing.assert_allclose(window.pipeline.views["Q"].spec.values, X @ W, rtol=0, atol=1e-12)


def test_repeated_edits_of_one_cell_merge_into_one_undo_step(window, qtbot):
    doc = window.doc
    grid = window.inputs.grid
    for text in ("0.5", "0.25", "-2"):
        type_into(qtbot, grid, 2, 3, text)
    assert doc.scenario.X[2, 3] == -2.0
    assert doc.undo_stack.count() == 1
    # The same cell of another matrix, or another cell, is a new step.
    w_q, w_k = window.weights.grids[("W_Q", 0)], window.weights.grids[("W_K", 0)]
    assert w_q.model().setData(w_q.model().index(0, 0), "1")
    assert w_k.model().setData(w_k.model().index(0, 0), "1")
    assert doc.undo_stack.count() == 3
    assert w_k.model().setData(w_k.model().index(0, 0), "2")
    assert doc.undo_stack.count() == 3  # merged with the previous W_K edit
    doc.undo_stack.undo()
    assert doc.scenario.W_K[0, 0, 0] == 0.9
    doc.undo_stack.undo()
    assert doc.scenario.W_Q[0, 0, 0] == 0.1
    doc.undo_stack.undo()
    assert doc.scenario.X[2, 3] == 0.3  # one undo takes back all three typed values
    np.testing.assert_array_equal(doc.scenario.X, reference.X)
    doc.undo_stack.redo()
    assert doc.scenario.X[2, 3] == -2.0


def test_delete_and_backspace_set_the_selection_to_zero(window, qtbot):
    doc = window.doc
    grid = window.weights.grids[("W_O", None)]
    grid.setFocus()
    select_block(grid, 1, 1, 2, 2)
    qtbot.keyClick(grid, Qt.Key.Key_Delete)
    expected = reference.W_O.copy()
    expected[1:3, 1:3] = 0.0
    np.testing.assert_array_equal(doc.scenario.W_O, expected)
    assert doc.undo_stack.count() == 1

    select_block(grid, 3, 0, 1, 4)
    qtbot.keyClick(grid, Qt.Key.Key_Backspace)
    expected[3] = 0.0
    np.testing.assert_array_equal(doc.scenario.W_O, expected)
    assert doc.undo_stack.count() == 2

    doc.undo_stack.undo()
    doc.undo_stack.undo()
    np.testing.assert_array_equal(doc.scenario.W_O, reference.W_O)


# Clipboard ----------------------------------------------------------------------------


def test_copy_writes_tab_separated_text_that_pastes_back_exactly(window, qtbot):
    doc = window.doc
    source = window.weights.grids[("W_Q", 0)]
    source.setFocus()
    select_block(source, 0, 0, 2, 2)
    qtbot.keyClick(source, Qt.Key.Key_C, CTRL)
    text = QGuiApplication.clipboard().text()
    assert text.rstrip("\n") == "0.1\t0.3\n0.7\t-0.9"

    # Values that a rounded copy would change.
    tricky = np.array([[1 / 3, 0.1 + 0.2], [-2 / 7, 1e-300], [123456.78901234567, -0.0]])
    x = window.inputs.grid
    select_block(x, 0, 0, 1, 1)
    assert x.paste_text("\n".join("\t".join(repr(float(v)) for v in row) for row in tricky))
    np.testing.assert_array_equal(doc.scenario.X[:3, :2], tricky)
    x.setFocus()
    select_block(x, 0, 0, 3, 2)
    qtbot.keyClick(x, Qt.Key.Key_C, CTRL)
    copied = QGuiApplication.clipboard().text()
    rows = [line.split("\t") for line in copied.rstrip("\n").split("\n")]
    assert [[float(c) for c in row] for row in rows] == tricky.tolist()

    window.view_state.set_head(1)  # shows head 2's tab of the Weights dock
    target = window.weights.grids[("W_V", 1)]
    qtbot.waitUntil(target.isVisible)
    target.setFocus()
    select_block(target, 1, 0, 1, 1)
    count = doc.undo_stack.count()
    qtbot.keyClick(target, Qt.Key.Key_V, CTRL)
    assert doc.undo_stack.count() == count + 1  # one paste, one undo step
    got = doc.scenario.W_V[1, 1:4, 0:2]
    assert got.tobytes() == tricky.tobytes()  # bit for bit, the sign of -0.0 included
    doc.undo_stack.undo()
    np.testing.assert_array_equal(doc.scenario.W_V, reference.W_V)


def test_paste_of_a_numpy_list_and_printed_arrays(window, qtbot):
    doc = window.doc
    grid = window.inputs.grid
    grid.setFocus()
    select_block(grid, 1, 1, 1, 1)
    QGuiApplication.clipboard().setText("[[0.1, 0.3], [0.7, -0.9]]")
    qtbot.keyClick(grid, Qt.Key.Key_V, CTRL)
    expected = reference.X.copy()
    expected[1:3, 1:3] = [[0.1, 0.3], [0.7, -0.9]]
    np.testing.assert_array_equal(doc.scenario.X, expected)
    assert doc.undo_stack.count() == 1

    block = np.array([[0.25, -1.5, 2.0], [3.0, 0.125, -0.5]])
    for text in (repr(block), str(block), np.array2string(block, separator=", ")):
        select_block(grid, 2, 1, 1, 1)
        assert grid.paste_text(text), text
        expected[2:4, 1:4] = block
        np.testing.assert_array_equal(doc.scenario.X, expected)
        grid.matrix_model().set_block(2, 1, np.zeros((2, 3)))  # reset for the next form
        expected[2:4, 1:4] = 0.0
    # A spreadsheet range and CSV.
    select_block(grid, 0, 0, 1, 1)
    assert grid.paste_text("1\t2\r\n3\t4\r\n")
    assert grid.paste_text("5,6\n7,8")
    expected[0:2, 0:2] = [[5, 6], [7, 8]]
    np.testing.assert_array_equal(doc.scenario.X, expected)


def test_refused_pastes_leave_every_cell_as_it_was(window, qtbot):
    doc = window.doc
    grid = window.inputs.grid
    select_block(grid, 2, 2, 1, 1)
    before, count = matrices(doc), doc.undo_stack.count()
    bad = [
        "abc",
        "nan",
        "1e999",
        "-inf",
        "1e7",  # beyond the value limit
        "",
        "1\t2\n3",  # ragged
        "[[1, 2], [3]]",
        "[[1, 2], [3, 4]",  # unbalanced
        "0.5\tabc",
        "1 2 3",  # three columns from column 3 of 4
        "1\n2\n3",  # three rows from row 3 of 4
        "\n".join("\t".join(["1"] * 4) for _ in range(5)),  # larger than the whole matrix
    ]
    for text in bad:
        with qtbot.waitSignal(grid.message, timeout=1000) as message:
            assert not grid.paste_text(text), text
        assert message.args[0], text
        assert "nothing was changed" in message.args[0], message.args[0]
        assert_same_matrices(before, matrices(doc))
        assert doc.undo_stack.count() == count, text
    # Through the keyboard too.
    grid.setFocus()
    QGuiApplication.clipboard().setText("nan")
    with qtbot.waitSignal(grid.message, timeout=1000):
        qtbot.keyClick(grid, Qt.Key.Key_V, CTRL)
    assert_same_matrices(before, matrices(doc))
    assert doc.undo_stack.count() == count
    np.testing.assert_array_equal(doc.scenario.X, reference.X)


def test_refused_oversized_paste_names_the_problem(window, qtbot):
    grid = window.weights.grids[("W_V", 0)]  # 4 × 2
    select_block(grid, 0, 0, 1, 1)
    before = matrices(window.doc)
    with qtbot.waitSignal(grid.message, timeout=1000) as message:
        assert not grid.paste_text(str(np.ones((4, 3))))
    assert "head 1 W_V" in message.args[0]
    assert "does not fit" in message.args[0]
    assert_same_matrices(before, matrices(window.doc))


def test_single_pasted_value_fills_the_selection(window, qtbot):
    doc = window.doc
    grid = window.inputs.grid
    grid.setFocus()
    select_block(grid, 1, 0, 2, 4)
    QGuiApplication.clipboard().setText("0.5\n")
    qtbot.keyClick(grid, Qt.Key.Key_V, CTRL)
    expected = reference.X.copy()
    expected[1:3, :] = 0.5
    np.testing.assert_array_equal(doc.scenario.X, expected)
    assert doc.undo_stack.count() == 1
    doc.undo_stack.undo()
    np.testing.assert_array_equal(doc.scenario.X, reference.X)
    # The fill shows in the pipeline: rows saw and the now share X, so share Q.
    doc.undo_stack.redo()
    q = window.pipeline.views["Q"].spec.values
    np.testing.assert_array_equal(q[1], q[2])
    np.testing.assert_allclose(q, expected @ reference.W_Q[0], rtol=0, atol=1e-12)
    assert not math.isclose(q[1, 0], (reference.X @ reference.W_Q[0])[1, 0])
    # A fill of part of a row.
    select_block(grid, 0, 1, 1, 2)
    assert grid.paste_text("-0.25")
    np.testing.assert_array_equal(doc.scenario.X[0], [0.9, -0.25, -0.25, 0.2])
    assert doc.undo_stack.count() == 2


def test_head_tabs_are_built_when_first_shown(make_window):
    from attnviz.core.presets import make_preset
    from attnviz.ui.grid import MatrixGrid

    window = make_window(scenario=make_preset("gpt2-small", n=4))  # 12 heads
    tabs = window.weights.tabs

    def built(head: int) -> int:
        return len(tabs.widget(head).findChildren(MatrixGrid))

    assert built(0) == 3 and all(built(h) == 0 for h in range(1, 12))
    window.view_state.set_head(4)  # the toolbar's head, or a click on a tab
    assert tabs.currentIndex() == 4 and built(4) == 3
    grid = window.weights.grids[("W_V", 7)]  # asked for by name: its tab is built
    assert built(7) == 3 and grid.matrix_model().rowCount() == 768
    assert built(6) == 0
