"""Numbers and tables as text: what a user types, pastes or imports.

``parse_table`` reads spreadsheet ranges (tab-separated), CSV, and NumPy's printed
arrays (``[[0.1, 0.3], [0.7, -0.9]]``, ``array([...])`` or ``print`` output without
commas). ``format_table`` writes tab-separated text that spreadsheets paste as a range.

Every step is linear in the text: a number has at most ``MAX_NUMBER_CHARS`` characters,
a table with more rows or text than its destination can take is refused before any
number is read, and a row with more columns before it is split. Rows are split and read
one at a time into float64 arrays, so memory stays within a small multiple of the text.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator

import numpy as np

from attnviz.core.maths.scenario import LIMITS

MAX_NUMBER_CHARS = 64  # far more than any float needs (repr writes at most 24)
TABLE_ROWS = max(LIMITS.tokens, LIMITS.d_model, LIMITS.heads * LIMITS.d_k)  # X, W's, W_O
TABLE_COLS = max(LIMITS.d_model, LIMITS.d_k)

# One way to match each number, so a failed match never backtracks over its digits.
_NUMBER = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_DTYPE = re.compile(r"\s*dtype=[\w.]+\s*")
_BREAKS = "\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029"  # where str.splitlines ends a line
_SEPARATORS = re.compile(r"[,\s]+")  # between the numbers of a NumPy-printed row
_FIELD = re.compile(r"\S+")
_ROW = re.compile(r"\[([^\[\]]*)\]")  # an innermost [...] group: a NumPy-printed row
_CONTENT = re.compile(f"\\S[^{_BREAKS}]*")  # a line's text from its first non-space


class TableTooLarge(ValueError):
    """The text holds more rows, columns or characters than its destination can take."""


def parse_number(text: str) -> float:
    """A finite decimal number within the value limit (the Unicode minus is accepted).

    Raises ValueError naming the text: ``'abc' is not a number``.
    """
    t = text.strip()
    if len(t) > MAX_NUMBER_CHARS:
        raise ValueError(
            f"{t[:20]!r}… is {len(t):,} characters long; a number has at most {MAX_NUMBER_CHARS}"
        )
    t = t.replace("\u2212", "-")
    if not _NUMBER.fullmatch(t):
        raise ValueError(f"{text.strip()!r:.40} is not a number")
    value = float(t)
    if not math.isfinite(value) or abs(value) > LIMITS.abs_value:
        raise ValueError(f"{text.strip()!r:.40} is outside ±{LIMITS.abs_value:g}")
    return value


def _breaks(text: str, start: int, end: int) -> int:
    """How many line breaks text[start:end] holds, counted as str.splitlines counts them."""
    return sum(text.count(c, start, end) for c in _BREAKS) - text.count("\r\n", start, end)


def line_spans(text: str) -> Iterator[tuple[int, int, int]]:
    """(number, start, end) of each non-blank line, numbered as str.splitlines numbers them.

    Spans, not strings: a caller can count a line's fields before copying it.
    """
    number, end = 1, 0
    for m in _CONTENT.finditer(text):
        start = max(text.rfind(c, end, m.start()) for c in _BREAKS) + 1 if end else 0
        number += _breaks(text, end, m.start())
        end = m.end()
        yield number, start, end


def count_lines(text: str) -> int:
    """How many non-blank lines text holds, counted without copying them."""
    return count_matches(_CONTENT, text)


def count_matches(pattern: re.Pattern[str], text: str) -> int:
    """How many times pattern matches in text, without building the matches' text."""
    return sum(1 for _ in pattern.finditer(text))


def _rows_of_numpy(text: str, max_rows: int, max_cols: int) -> Iterator[list[str]]:
    """Cells of a NumPy-printed array: rows are the innermost [...] groups."""
    if text.startswith("array(") and text.endswith(")"):  # repr: array([...], dtype=...)
        text = text[len("array(") : -1]
        head, comma, tail = text.rpartition(",")
        if comma and _DTYPE.fullmatch(tail):
            text = head
    if text.count("[") != text.count("]"):
        raise ValueError("unbalanced brackets")
    count = count_matches(_ROW, text)
    if not count:
        raise ValueError("no rows between brackets")
    _check_rows(count, max_rows)
    one_row = count == 1 and not text.strip().startswith("[[")
    for m in _ROW.finditer(text):
        row = m.group(1).strip()
        if not row and not one_row:
            yield []
            continue
        _check_cols(count_matches(_SEPARATORS, row) + 1, max_cols)
        yield _SEPARATORS.split(row)


def _check_rows(count: int, max_rows: int) -> None:
    if count > max_rows:
        raise TableTooLarge(f"{count:,} rows, but at most {max_rows:,} fit")


def _check_cols(count: int, max_cols: int) -> None:
    if count > max_cols:
        raise TableTooLarge(f"{count:,} columns, but at most {max_cols:,} fit")


def split_table(
    text: str, max_rows: int = TABLE_ROWS, max_cols: int = TABLE_COLS
) -> Iterator[list[str]]:
    """The rows of text as cell strings (no number parsing yet), one row at a time.

    More than max_rows rows raises TableTooLarge before any row is split into cells; a
    row of more than max_cols cells raises it before that row is split.
    """
    text = text.strip()
    if not text:
        raise ValueError("nothing to paste")
    if "[" in text or text.startswith("array("):
        yield from _rows_of_numpy(text, max_rows, max_cols)
        return
    _check_rows(count_lines(text), max_rows)
    sep = "\t" if "\t" in text else "," if "," in text else None
    for _, start, end in line_spans(text):
        if sep:
            _check_cols(text.count(sep, start, end) + 1, max_cols)
        line = text[start:end]
        if not sep:
            _check_cols(count_matches(_FIELD, line), max_cols)
        yield line.split(sep)


def most_chars(rows: int, cols: int) -> int:
    """The longest text a table of rows × cols numbers can be (each number padded, brackets)."""
    return rows * (cols * (MAX_NUMBER_CHARS + 2) + 8) + 64


def parse_table(text: str, room: tuple[int, int] = (TABLE_ROWS, TABLE_COLS)) -> np.ndarray:
    """A rectangular block of finite numbers as a 2-D float64 array; ValueError otherwise.

    room: the most rows and columns the destination takes; more rows (or longer text than
    such a table can be) raise TableTooLarge before any number is read, a row with more
    columns before that row is split.
    """
    max_rows, max_cols = room
    if len(text) > most_chars(max_rows, max_cols):
        raise TableTooLarge(
            f"{len(text):,} characters, more than {max_rows:,}×{max_cols:,} numbers can take"
        )
    out: list[np.ndarray] = []
    for r, cells in enumerate(split_table(text, max_rows, max_cols), start=1):
        if not cells or cells == [""]:
            raise ValueError(f"row {r} is empty")
        row = _numbers(cells, r)
        if out and len(row) != len(out[0]):
            raise ValueError(f"row {r} has {len(row)} numbers, row 1 has {len(out[0])}")
        out.append(np.array(row, dtype=np.float64))  # 8 bytes a number, not a float object
    return np.vstack(out)


def _numbers(cells: list[str], r: int) -> list[float]:
    """The numbers of row r; a bad cell raises ValueError naming its row and column."""
    texts = [c.strip().replace("\u2212", "-") for c in cells]
    if max(map(len, texts)) <= MAX_NUMBER_CHARS and all(map(_NUMBER.fullmatch, texts)):
        values = list(map(float, texts))  # the common case, without a call per cell
        if max(map(abs, values)) <= LIMITS.abs_value:
            return values
    row = []
    for c, cell in enumerate(cells, start=1):
        try:
            row.append(parse_number(cell))
        except ValueError as e:
            raise ValueError(f"row {r}, column {c}: {e}") from None
    return row


def format_table(a: np.ndarray) -> str:
    """Tab-separated rows that read back exactly (repr of each float)."""
    return "\n".join("\t".join(repr(float(v)) for v in row) for row in np.atleast_2d(a)) + "\n"
