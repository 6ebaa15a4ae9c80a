"""Number and table parsing is linear in the text, and refuses oversized input up front.

Timing-free where possible: the work is bounded by counting what the number pattern
is asked to read, and refusals are checked by their messages and by what they skip.
The one timed test allows 0.5 s for 1e5 characters (the old pattern took minutes).
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from hang_guard import within

from attnviz.core.io import files as F
from attnviz.core.io import text as T
from attnviz.core.io.files import FileFormatError, matrix_from_csv
from attnviz.core.io.text import MAX_NUMBER_CHARS, TableTooLarge, parse_number, parse_table


class Spy:
    """Stands in for the number pattern and records the length of every text it reads."""

    def __init__(self) -> None:
        self.real = T._NUMBER
        self.lengths: list[int] = []

    def fullmatch(self, text: str) -> object:
        self.lengths.append(len(text))
        return self.real.fullmatch(text)


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> Spy:
    s = Spy()
    monkeypatch.setattr(T, "_NUMBER", s)
    return s


# Numbers ---------------------------------------------------------------------------------


def test_the_maximum_is_64_characters() -> None:
    assert MAX_NUMBER_CHARS == 64
    longest = "0." + "1" * 62  # 64 characters
    assert parse_number(longest) == float(longest)
    assert parse_number(f"  {longest}\t") == float(longest)  # surrounding space is free
    with pytest.raises(ValueError, match="65 characters long; a number has at most 64"):
        parse_number(longest + "1")


@pytest.mark.parametrize("length", [65, 16_000, 100_000])
def test_an_overlong_cell_is_refused_without_reading_it(spy: Spy, length: int) -> None:
    text = "1" * (length - 1) + "x"
    with pytest.raises(ValueError, match=f"{length:,} characters long; a number has at most 64"):
        parse_number(text)
    assert spy.lengths == []  # refused on its length alone


def test_the_number_pattern_reads_a_failing_text_in_linear_time() -> None:
    # The old pattern backtracked over every split of the digits: minutes for this text.
    with within(20):
        assert T._NUMBER.fullmatch("1" * 20_000 + "x") is None


@pytest.mark.parametrize(
    ("text", "value"),
    [("1", 1.0), ("-2.5", -2.5), ("+.5", 0.5), ("3.", 3.0), ("1e3", 1000.0), ("\u22120.25", -0.25)],
)
def test_every_number_form_still_reads(text: str, value: float) -> None:
    assert parse_number(text) == value


@pytest.mark.parametrize("text", ["", ".", "e5", "1e", "1.2.3", "--1", "1_000", "nan", "inf"])
def test_what_is_not_a_number_is_still_refused(text: str) -> None:
    with pytest.raises(ValueError, match="is not a number"):
        parse_number(text)


# Tables ----------------------------------------------------------------------------------


def test_an_overlong_cell_in_a_table_is_named(spy: Spy) -> None:
    text = "1,2\n3," + "1" * 32_000 + "x"
    with pytest.raises(ValueError, match=r"row 2, column 2: .*32,001 characters long"):
        parse_table(text)
    assert max(spy.lengths) <= MAX_NUMBER_CHARS


def test_an_overlong_cell_in_a_csv_file_is_named_at_once() -> None:
    with pytest.raises(FileFormatError, match=r"line 1, column 1: .*at most 64"):
        matrix_from_csv("1" * 32_000 + "x,1\n")


def test_the_number_pattern_reads_each_cell_at_most_twice(spy: Spy) -> None:
    a = np.arange(60.0).reshape(6, 10) / 7
    np.testing.assert_array_equal(parse_table(T.format_table(a)), a)
    assert len(spy.lengths) == a.size  # once per cell when all is well
    spy.lengths.clear()
    with pytest.raises(ValueError, match="row 6, column 10"):
        parse_table(T.format_table(a)[:-2] + "x\n")
    assert len(spy.lengths) <= 2 * a.size
    assert max(spy.lengths) <= MAX_NUMBER_CHARS


def test_text_longer_than_the_room_is_refused_before_it_is_split(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def split(*args: object) -> None:
        raise AssertionError("split_table ran")

    monkeypatch.setattr(T, "split_table", split)
    text = "0.5\t" * 250_000  # a megabyte
    with pytest.raises(TableTooLarge, match="1,000,000 characters, more than 4×2 numbers"):
        parse_table(text, (4, 2))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("1\n" * 70_000, "70,000 rows, but at most 65,536 fit"),
        ("[1]" * 70_000, "70,000 rows, but at most 65,536 fit"),
        ("\t".join(["1"] * 8193), "8,193 columns, but at most 8,192 fit"),
        ("[" + ", ".join(["1"] * 8193) + "]", "8,193 columns, but at most 8,192 fit"),
    ],
    ids=["lines", "bracket rows", "tabs", "a bracket row"],
)
def test_more_rows_or_columns_than_any_matrix_are_refused_unread(
    spy: Spy, text: str, message: str
) -> None:
    with pytest.raises(TableTooLarge, match=message):
        parse_table(text)
    assert spy.lengths == []


def test_the_default_room_is_the_largest_matrix_a_scenario_holds() -> None:
    # W_O of 128 heads of d_k 512 has 65536 rows; X and W_O have up to 8192 columns.
    assert parse_table("\t".join(["1"] * 8192)).shape == (1, 8192)
    assert parse_table("1\n" * 65_536).shape == (65_536, 1)
    with pytest.raises(TableTooLarge):
        parse_table("1\n" * 65_537)


def test_the_room_counts_rows_and_columns() -> None:
    assert parse_table("1 2\n3 4", (2, 2)).tolist() == [[1, 2], [3, 4]]
    with pytest.raises(TableTooLarge, match="3 rows, but at most 2 fit"):
        parse_table("1\n2\n3", (2, 2))
    with pytest.raises(TableTooLarge, match="3 columns, but at most 2 fit"):
        parse_table("1,2,3", (2, 2))


@pytest.mark.parametrize(
    "text",
    [
        "array([[1., 2.],\n       [3., 4.]])",
        "array([[1, 2], [3, 4]], dtype=int64)",
        "  array([[1.0, 2.0], [3.0, 4.0]], dtype=float32)  ",
        "[[1. 2.]\n [3. 4.]]",
    ],
)
def test_numpy_reprs_still_read(text: str) -> None:
    assert parse_table(text).tolist() == [[1, 2], [3, 4]]


@pytest.mark.parametrize(
    "text",
    [
        "array(" + ", " * 50_000,
        "array(" + ") " * 50_000 + "x",
        "array(" + ",dtype=a" * 12_500 + "x",
        "[] " * 33_000,
        "[" + "1, " * 33_000 + "]",
    ],
    ids=["commas", "parentheses", "dtypes", "empty rows", "one wide row"],
)
def test_hostile_text_of_1e5_characters_is_refused_quickly(text: str) -> None:
    with within(20), pytest.raises(ValueError):  # (a hang guard: seconds, not minutes)
        parse_table(text)


# One reader for pasted tables and CSV files ------------------------------------------------


def test_csv_files_and_pastes_are_read_by_one_parser(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[dict[str, object]] = []
    real = T.parse_table

    def spy(text: str, *args: object, **kwargs: object) -> np.ndarray:
        calls.append(kwargs)
        return real(text, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(F, "parse_table", spy)
    assert matrix_from_csv("1,2\n3,4\n").tolist() == [[1, 2], [3, 4]]
    assert calls == [{"sep": ",", "max_cells": F.MAX_MATRIX_CELLS, "by_line": True}]


def test_rows_are_named_by_row_or_by_line() -> None:
    text = "1,2\n\n3,x\n"
    with pytest.raises(ValueError, match=r"^row 2, column 2: 'x' is not a number"):
        parse_table(text)
    with pytest.raises(ValueError, match=r"^line 3, column 2: 'x' is not a number"):
        parse_table(text, by_line=True)
    with pytest.raises(FileFormatError, match=r"^line 3, column 2: 'x' is not a number"):
        matrix_from_csv(text)
    with pytest.raises(ValueError, match=r"^row 2 has 1 numbers, row 1 has 2$"):
        parse_table("1,2\n\n3\n")
    with pytest.raises(FileFormatError, match=r"^line 3 has 1 numbers, line 1 has 2$"):
        matrix_from_csv("1,2\n\n3\n")
    # NumPy text too: the line each bracket row starts on.
    with pytest.raises(ValueError, match=r"^line 3, column 2: "):
        parse_table("\n[[1, 2],\n [3, x]]", by_line=True)
    with pytest.raises(ValueError, match=r"^row 2, column 2: "):
        parse_table("\n[[1, 2],\n [3, x]]")


def test_a_given_separator_reads_lines_only() -> None:
    # A tab on a blank line does not make a CSV file tab-separated, nor brackets NumPy text.
    assert parse_table("1, 2\n\t\n3,4", sep=",").tolist() == [[1, 2], [3, 4]]
    with pytest.raises(ValueError, match=r"^row 1, column 1: '\[1' is not a number"):
        parse_table("[1, 2]", sep=",")
    assert parse_table("[1, 2]").tolist() == [[1, 2]]


def test_a_byte_order_mark_is_skipped_in_pastes_too() -> None:
    assert parse_table("\ufeff1\t2\n").tolist() == [[1, 2]]
    assert parse_table("\ufeff[[1, 2]]").tolist() == [[1, 2]]


def test_the_cell_limit_is_checked_before_the_first_row_is_read(spy: Spy) -> None:
    with pytest.raises(TableTooLarge, match=r"^2×2 numbers, but at most 3 fit$"):
        parse_table("1,2\n3,4", max_cells=3)
    assert spy.lengths == []
    assert parse_table("1,2\n3,4", max_cells=4).shape == (2, 2)


def test_a_wide_first_row_over_many_short_rows_allocates_no_table() -> None:
    # 32,768 rows under a first row of 2,048: 512 MiB if the array were made at once.
    text = "\t".join(["1"] * 2048) + "\n" + "1\n" * 32_767
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match=r"^row 2 has 1 numbers, row 1 has 2048$"):
            parse_table(text)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2 * len(text) + 2**20
