"""Pastes and typed values that are too long or too large: refused at once, or read off
the UI thread, never a frozen window.

Timing-free: what runs where is recorded (which thread read the text, whether the text
was split at all), not how long it took.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
from PySide6.QtCore import QItemSelection, QItemSelectionModel

from attnviz.core.io import text as T
from attnviz.core.io.text import format_table
from attnviz.core.presets import random_scenario
from attnviz.ui import grid as grid_module
from attnviz.ui.document import Document
from attnviz.ui.grid import READ_NOW_CHARS, MatrixGrid
from attnviz.ui.matrix_model import MatrixModel


def select_block(grid: MatrixGrid, row: int, col: int, rows: int, cols: int) -> None:
    model = grid.model()
    grid.setCurrentIndex(model.index(row, col))
    block = QItemSelection(model.index(row, col), model.index(row + rows - 1, col + cols - 1))
    grid.selectionModel().select(block, QItemSelectionModel.SelectionFlag.ClearAndSelect)


@pytest.fixture
def doc():
    document = Document()  # the worked example: X is 4 × 4, W_V per head 4 × 2
    return document


@pytest.fixture
def big_doc():
    document = Document(random_scenario(n=400, d_model=256, heads=2, d_k=8, seed=1))
    return document


def make_grid(qtbot, doc: Document, name: str, head: int | None = None) -> MatrixGrid:
    grid = MatrixGrid(MatrixModel(doc, name, head))
    qtbot.addWidget(grid)
    return grid


def test_a_32k_digit_number_typed_into_a_cell_is_refused_naming_the_cell(qtbot, doc) -> None:
    grid = make_grid(qtbot, doc, "X")
    model = grid.matrix_model()
    before = doc.scenario.X.copy()
    with qtbot.waitSignal(model.refused, timeout=1000) as refusal:
        assert not model.setData(model.index(1, 2), "1" * 32_000 + "x")
    assert refusal.args[0].startswith("X[2,3]: ")
    assert "32,001 characters long; a number has at most 64" in refusal.args[0]
    np.testing.assert_array_equal(doc.scenario.X, before)
    assert doc.undo_stack.count() == 0


def test_a_32k_digit_paste_into_a_large_grid_is_refused_naming_the_cell(qtbot, big_doc) -> None:
    grid = make_grid(qtbot, big_doc, "X")
    select_block(grid, 0, 0, 1, 1)
    with qtbot.waitSignal(grid.message, timeout=1000) as message:
        assert not grid.paste_text("0.5\t" + "1" * 32_000 + "x")
    assert message.args[0].startswith("Paste refused: row 1, column 2: ")
    assert "a number has at most 64" in message.args[0]
    assert "nothing was changed" in message.args[0]
    assert big_doc.undo_stack.count() == 0


def test_a_megabyte_paste_into_a_small_grid_is_refused_unread(
    qtbot, doc, monkeypatch: pytest.MonkeyPatch
) -> None:
    def split(*args: object) -> None:
        raise AssertionError("the text was split")

    monkeypatch.setattr(T, "split_table", split)
    grid = make_grid(qtbot, doc, "W_V", 0)  # 4 × 2
    select_block(grid, 1, 0, 1, 1)
    before = doc.scenario.W_V.copy()
    with qtbot.waitSignal(grid.message, timeout=1000) as message:
        assert not grid.paste_text("0.25\t" * 200_000)
    text = message.args[0]
    assert text.startswith("head 1 W_V: 1,000,000 characters, more than 3×2 numbers can take")
    assert "from row 2, column 1" in text and "does not fit" in text
    assert "nothing was changed" in text
    np.testing.assert_array_equal(doc.scenario.W_V, before)


def test_more_rows_than_the_room_are_refused_with_the_grid_named(qtbot, doc) -> None:
    grid = make_grid(qtbot, doc, "X")
    select_block(grid, 2, 0, 1, 1)
    with qtbot.waitSignal(grid.message, timeout=1000) as message:
        assert not grid.paste_text("1\n2\n3")
    assert message.args[0].startswith("X: 3 rows, but at most 2 fit from row 3, column 1")
    assert "does not fit" in message.args[0]


def test_a_long_paste_is_read_off_the_ui_thread_and_is_one_edit(
    qtbot, big_doc, monkeypatch: pytest.MonkeyPatch
) -> None:
    readers: list[threading.Thread] = []
    real = grid_module.parse_table

    def parse(text: str, room: tuple[int, int]) -> np.ndarray:
        readers.append(threading.current_thread())
        return real(text, room)

    monkeypatch.setattr(grid_module, "parse_table", parse)
    grid = make_grid(qtbot, big_doc, "X")
    values = np.round(np.random.default_rng(2).uniform(-1, 1, (300, 256)), 6)
    text = format_table(values)
    assert len(text) > 10 * READ_NOW_CHARS  # over half a megabyte
    select_block(grid, 100, 0, 1, 1)
    before = big_doc.scenario.X.copy()

    with qtbot.waitSignal(grid.message, timeout=1000) as message:
        assert grid.paste_text(text)  # on its way
    assert message.args[0].startswith("Reading ")
    grid.reader.wait()

    assert readers and all(t is not threading.main_thread() for t in readers)
    expected = before.copy()
    expected[100:400] = values
    np.testing.assert_array_equal(big_doc.scenario.X, expected)
    assert big_doc.undo_stack.count() == 1
    assert big_doc.undo_stack.undoText() == "Paste 300×256 into X"
    big_doc.undo_stack.undo()
    np.testing.assert_array_equal(big_doc.scenario.X, before)


def test_a_long_paste_with_a_bad_cell_is_refused_after_reading(qtbot, big_doc) -> None:
    grid = make_grid(qtbot, big_doc, "X")
    values = np.full((300, 256), 0.123456)
    lines = format_table(values).splitlines()
    lines[250] = lines[250].replace("0.123456", "abc", 1)
    select_block(grid, 0, 0, 1, 1)
    before = big_doc.scenario.X.copy()
    assert grid.paste_text("\n".join(lines))
    with qtbot.waitSignal(grid.message, timeout=5000) as message:
        grid.reader.wait()
    assert message.args[0] == "Paste refused: row 251, column 1: 'abc' is not a number; " + (
        "nothing was changed"
    )
    np.testing.assert_array_equal(big_doc.scenario.X, before)
    assert big_doc.undo_stack.count() == 0


def test_a_long_paste_that_is_too_tall_is_refused_after_reading(qtbot, big_doc) -> None:
    grid = make_grid(qtbot, big_doc, "X")
    select_block(grid, 300, 0, 1, 1)  # room for 100 rows
    assert grid.paste_text(format_table(np.zeros((200, 256))))
    with qtbot.waitSignal(grid.message, timeout=5000) as message:
        grid.reader.wait()
    assert message.args[0].startswith("X: 200 rows, but at most 100 fit from row 301, column 1")
    assert big_doc.undo_stack.count() == 0


def test_a_huge_selection_is_measured_by_its_ranges(qtbot, big_doc) -> None:
    grid = make_grid(qtbot, big_doc, "X")
    select_block(grid, 10, 3, 390, 253)
    assert grid.selected_rect() == (10, 3, 390, 253)
    assert grid.paste_text("0.5")  # one value fills the whole selection
    assert big_doc.undo_stack.undoText() == "Fill 390×253 cells of X"
    assert (big_doc.scenario.X[10:, 3:] == 0.5).all()
