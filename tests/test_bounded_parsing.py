"""Hostile files are refused by cheap counts before Python objects are built for them.

Deterministic: each refusal is checked by its message and by the parser it skips
(json.loads, str.split), monkeypatched to fail. The peak-memory figures on large files
are measured by tests/perf/bench_parse_memory.py.
"""

from __future__ import annotations

import contextlib
import json
import tracemalloc
from collections.abc import Callable

import numpy as np
import pytest

from attnviz.core.io import files as F
from attnviz.core.io import text as T
from attnviz.core.io.files import FileFormatError, scenario_from_json, scenario_to_json
from attnviz.core.io.text import parse_table
from attnviz.core.maths.scenario import LIMITS, Scenario


@pytest.fixture
def no_json(monkeypatch: pytest.MonkeyPatch) -> None:
    def loads(*args: object, **kwargs: object) -> None:
        raise AssertionError("json.loads ran")

    monkeypatch.setattr(F.json, "loads", loads)


HEAD = '{"format": "attnviz-scenario", "version": 1, "X": ['


def test_many_empty_lists_are_refused_before_json_is_parsed(no_json: None) -> None:
    n = F._most_containers()
    text = HEAD + "[]," * n + "[]]}"
    with pytest.raises(FileFormatError, match=f"{n + 3:,} lists and objects; .* at most {n:,}"):
        scenario_from_json(text)
    with pytest.raises(FileFormatError, match="lists and objects"):
        scenario_from_json(text.encode())


def test_deep_nesting_is_refused_before_json_is_parsed(no_json: None) -> None:
    depth = F._most_containers() + 1
    with pytest.raises(FileFormatError, match="lists and objects"):
        scenario_from_json("[" * depth + "]" * depth)


def test_many_strings_are_refused_before_json_is_parsed(no_json: None) -> None:
    n = F._most_quotes() // 2 + 1
    with pytest.raises(FileFormatError, match=r"quotation marks; .* at most"):
        scenario_from_json(HEAD + '["ab",' * n + "]]}")


@pytest.mark.parametrize("char", ["[", "{", '"'])
def test_the_counts_allow_the_largest_scenario_and_any_labels(char: str) -> None:
    n = LIMITS.tokens
    heads, d_model, d_k = 2, 1, 1
    s = Scenario(
        tokens=tuple(char * (LIMITS.token_chars - 4) + f"{i:04}" for i in range(n)),
        X=np.zeros((n, d_model)),
        W_Q=np.zeros((heads, d_model, d_k)),
        W_K=np.zeros((heads, d_model, d_k)),
        W_V=np.zeros((heads, d_model, d_k)),
        W_O=np.zeros((heads * d_k, d_model)),
    )
    assert scenario_from_json(scenario_to_json(s)).tokens == s.tokens


def test_the_container_count_covers_every_matrix_row_at_the_limits() -> None:
    lim = LIMITS
    rows = lim.tokens + 3 * lim.heads * lim.d_model + lim.heads * lim.d_k
    assert F._most_containers() >= rows + 3 * lim.heads + 2 + lim.tokens * lim.token_chars
    doc = json.dumps({"X": [[0]] * 3, "heads": [{"W_Q": [[0]]}]})
    assert doc.count("[") + doc.count("{") <= F._most_containers()


# CSV and pasted tables ---------------------------------------------------------------------


@pytest.fixture
def no_numbers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Reading a row's cells, by the fast path or cell by cell, fails the test."""

    def read(*args: object) -> None:
        raise AssertionError("a cell was read")

    monkeypatch.setattr(T, "_numbers", read)
    monkeypatch.setattr(T, "parse_number", read)


def test_a_csv_row_wider_than_any_matrix_is_refused_before_a_cell_is_read(
    no_numbers: None,
) -> None:
    widest = max(LIMITS.d_model, LIMITS.d_k)  # X and W_O are d_model wide
    with pytest.raises(
        FileFormatError, match=f"line 2: {widest + 1:,} columns, but at most {widest:,} fit"
    ):
        F.matrix_from_csv("\n" + ",".join(["1"] * (widest + 1)) + "\n")


def test_a_csv_longer_than_any_matrix_is_refused_before_a_cell_is_read(
    no_numbers: None,
) -> None:
    with pytest.raises(FileFormatError, match="65,537 rows, but at most 65,536 fit"):
        F.matrix_from_csv("1\n\n" * 65_537)


@pytest.mark.parametrize(
    ("text", "where"),
    [("1,2\r\n\r\n3,x\n", "line 3, column 2"), ("1\r2\r\x0cx", "line 4, column 1")],
)
def test_csv_lines_are_numbered_as_splitlines_numbers_them(text: str, where: str) -> None:
    with pytest.raises(FileFormatError, match=where):
        F.matrix_from_csv(text)


def test_csv_with_blank_lines_and_spaces_reads_back() -> None:
    a = F.matrix_from_csv("\n 1, 2 \r\n\n\t\n3,4\r5,6")
    assert a.tolist() == [[1, 2], [3, 4], [5, 6]]


def _peak(call: Callable[[], object]) -> int:
    tracemalloc.start()
    try:
        with contextlib.suppress(ValueError):
            call()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize(
    "text",
    ["12," * 1_000_000, "12\n" * 1_000_000, "12 " * 1_000_000, "[12]" * 1_000_000],
    ids=["one wide csv row", "many lines", "one wide spaced row", "many bracket rows"],
)
def test_an_oversized_table_is_refused_in_memory_near_its_size(text: str) -> None:
    # Splitting first built a string object (about 50 bytes) for each 3 characters.
    assert _peak(lambda: F.matrix_from_csv(text)) < 2 * len(text) + 2**20
    assert _peak(lambda: parse_table(text)) < 2 * len(text) + 2**20


def test_a_table_is_read_into_one_array_not_a_float_object_a_cell() -> None:
    a = np.arange(256 * 256, dtype=np.float64).reshape(256, 256) % 97
    text = F.matrix_to_csv(a)
    np.testing.assert_array_equal(F.matrix_from_csv(text), a)
    np.testing.assert_array_equal(parse_table(text), a)
    assert _peak(lambda: F.matrix_from_csv(text)) < 2 * a.nbytes


# Scenario numbers: read row by row ----------------------------------------------------------


def _numbers_scenario(n: int, d: int) -> str:
    """A valid scenario document whose X is n×d short numbers, written compactly."""
    rng = np.random.default_rng(0)
    x = (rng.integers(0, 10, size=(n, d)) / 10).tolist()  # "0.3,": 4 bytes a number
    w = [[1.0]] * d
    doc = {
        "format": "attnviz-scenario",
        "version": 1,
        "tokens": [f"t{i}" for i in range(n)],
        "X": x,
        "heads": [{"W_Q": w, "W_K": w, "W_V": w}],
        "W_O": [[0.5] * d],
    }
    return json.dumps(doc, separators=(",", ":"))


def test_a_scenario_of_short_numbers_parses_in_a_small_multiple_of_its_size() -> None:
    # json.loads of the whole text built a float object and a list slot (32 bytes) for
    # every "0.3," (4 bytes): 8× the file, and 10× with the array made from it. Now: the
    # rows as arrays and X made from them (2 bytes of float64 per byte of file each).
    text = _numbers_scenario(1024, 512)
    want = np.array(json.loads(text)["X"], dtype=np.float64)
    s = scenario_from_json(text)
    np.testing.assert_array_equal(s.X, want)
    assert _peak(lambda: scenario_from_json(text)) < 2 * want.nbytes + 2**20


def test_rows_read_alone_hold_the_numbers_json_reads() -> None:
    row = "[1, 2, -0, 1E+5, 2.5e-320, 999999, -1.0e0]"
    text = _numbers_scenario(1, 7).replace('"X":[[', '"X":[' + row + ",[", 1)
    text = text.replace('"tokens":["t0"]', '"tokens":["t0","t1"]')
    want = np.array(json.loads(text)["X"], dtype=np.float64)
    np.testing.assert_array_equal(scenario_from_json(text).X, want)


def test_a_json_error_after_rows_is_placed_where_the_file_has_it() -> None:
    # Rows are swapped for placeholders before json.loads: the position must map back.
    good = _numbers_scenario(3, 4)
    for bad in (
        good.replace('"heads"', '"heads" ', 1).replace(':[{"W_Q"', ':[{"W_Q" x', 1),
        good.replace("],[", "],\n[", 2).replace('"W_O":[[', '"W_O":[[0.5,,', 1),
        good.replace('"X":[[', '"X":[[1,\n 2,\n', 1).replace('"version":1', '"version":1 1', 1),
    ):
        with pytest.raises(json.JSONDecodeError) as want:
            json.loads(bad)
        with pytest.raises(FileFormatError) as got:
            scenario_from_json(bad)
        assert f"at line {want.value.lineno}, column {want.value.colno}" in str(got.value)


def test_cells_that_are_not_numbers_are_named_as_before() -> None:
    text = _numbers_scenario(3, 4).replace('"X":[[', '"X":[[1,', 1)
    bad = text.replace('"X":[[1,', '"X":[[true,', 1).replace("[[1,", "[[1,", 1)
    with pytest.raises(FileFormatError, match=r"X\[1,1\]: expected a number, got bool True"):
        scenario_from_json(bad)


def test_many_rows_that_are_not_numbers_are_refused_at_once() -> None:
    rows = ",".join(["[true]"] * 65)
    with pytest.raises(FileFormatError, match="more than 64 rows that are not lists of numbers"):
        scenario_from_json(HEAD + rows + "]}")


def test_a_row_far_wider_than_any_matrix_is_refused_before_json_is_parsed(no_json: None) -> None:
    widest = max(LIMITS.d_model, LIMITS.d_k)
    with pytest.raises(
        FileFormatError, match=rf"line 2: a row of 140,000 values; .* at most {widest:,}"
    ):
        scenario_from_json(HEAD + "\n[" + "0.5," * 139_999 + "0.5]]}")
