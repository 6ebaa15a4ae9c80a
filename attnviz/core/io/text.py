"""Numbers and tables as text: what a user types, pastes or imports.

``parse_table`` is the one table reader: spreadsheet ranges (tab-separated), CSV (pasted,
or CSV files through ``files.matrix_from_csv``), and NumPy's printed arrays
(``[[0.1, 0.3], [0.7, -0.9]]``, ``array([...])`` or ``print`` output without commas).
``format_table`` writes tab-separated text that spreadsheets paste as a range.

Every step is linear in the text: a number has at most ``MAX_NUMBER_CHARS`` characters,
a table with more rows or text than its destination can take is refused before any
number is read, and a row with more columns before it is split. Rows are split and read
one at a time into one float64 array, so memory stays within a small multiple of the text.
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
_ARRAY = re.compile(r"\s*array\(")
_NESTED = re.compile(r"\s*\[\[")
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


def _check_rows(count: int, max_rows: int) -> None:
    if count > max_rows:
        raise TableTooLarge(f"{count:,} rows, but at most {max_rows:,} fit")


def _check_cols(count: int, max_cols: int, where: str = "") -> None:
    if count > max_cols:
        raise TableTooLarge(f"{where}{count:,} columns, but at most {max_cols:,} fit")


Rows = Iterator[tuple[int, list[str]]]  # (line number, cell strings) of each row


def _rows_of_numpy(text: str, max_rows: int, max_cols: int, by_line: bool) -> tuple[int, Rows]:
    """Cells of a NumPy-printed array: rows are the innermost [...] groups."""
    body = text.strip()
    line = 1 + _breaks(text, 0, text.find(body[0]))  # where the table starts
    if body.startswith("array(") and body.endswith(")"):  # repr: array([...], dtype=...)
        body = body[len("array(") : -1]
        head, comma, tail = body.rpartition(",")
        if comma and _DTYPE.fullmatch(tail):
            body = head
    if body.count("[") != body.count("]"):
        raise ValueError("unbalanced brackets")
    count = count_matches(_ROW, body)
    if not count:
        raise ValueError("no rows between brackets")
    _check_rows(count, max_rows)
    one_row = count == 1 and not _NESTED.match(body)

    def rows() -> Rows:
        nonlocal line
        pos = 0
        for m in _ROW.finditer(body):
            line += _breaks(body, pos, m.start())
            pos = m.start()
            row = m.group(1).strip()
            if not row and not one_row:
                yield line, []
                continue
            _check_cols(count_matches(_SEPARATORS, row) + 1, max_cols, _at(line, by_line))
            yield line, _SEPARATORS.split(row)

    return count, rows()


def _rows_of_lines(text: str, sep: str | None, max_cols: int, by_line: bool) -> Rows:
    """Cells of each non-blank line, split at sep (None: at runs of white space)."""
    for line, start, end in line_spans(text):
        where = _at(line, by_line)
        if sep:
            _check_cols(text.count(sep, start, end) + 1, max_cols, where)
        cells = text[start:end]
        if not sep:
            _check_cols(count_matches(_FIELD, cells), max_cols, where)
        yield line, cells.split(sep)


def _at(line: int, by_line: bool) -> str:
    """The prefix of a column refusal: the line when rows are named by line."""
    return f"line {line}: " if by_line else ""


def split_table(
    text: str,
    max_rows: int = TABLE_ROWS,
    max_cols: int = TABLE_COLS,
    sep: str | None = None,
    by_line: bool = False,
) -> tuple[int, Rows]:
    """How many rows text holds, and the rows as (line number, cell strings), one at a time
    (no number parsing yet). Line numbers are those of str.splitlines, from 1.

    sep None guesses the layout: NumPy's printed arrays (brackets), else tab-separated
    if the text holds a tab, else comma-separated if it holds a comma, else white space.
    A given sep reads lines split at it, never brackets.

    More than max_rows rows raises TableTooLarge before any row is split into cells (here,
    not at the first row); a row of more than max_cols cells raises it before that row is
    split. Neither copies the text, except that a guess looks at it stripped.
    """
    if not text or text.isspace():
        raise ValueError("no numbers to read")
    if sep is None and ("[" in text or _ARRAY.match(text)):
        return _rows_of_numpy(text, max_rows, max_cols, by_line)
    count = count_lines(text)
    _check_rows(count, max_rows)
    if sep is None:
        body = text.strip()  # a tab before or after the table is not a separator
        sep = "\t" if "\t" in body else "," if "," in body else None
        del body
    return count, _rows_of_lines(text, sep, max_cols, by_line)


def most_chars(rows: int, cols: int) -> int:
    """The longest text a table of rows × cols numbers can be (each number padded, brackets)."""
    return rows * (cols * (MAX_NUMBER_CHARS + 2) + 8) + 64


def parse_table(
    text: str,
    room: tuple[int, int] = (TABLE_ROWS, TABLE_COLS),
    *,
    sep: str | None = None,
    max_cells: int | None = None,
    by_line: bool = False,
) -> np.ndarray:
    """A rectangular block of finite numbers as a 2-D float64 array; ValueError otherwise.

    The one reader of tables: pasted ranges and NumPy text (sep None: guessed, see
    ``split_table``) and CSV files (sep ","). A leading byte-order mark is skipped.

    room: the most rows and columns the destination takes; more rows (or longer text than
    such a table can be) raise TableTooLarge before any number is read, a row with more
    columns before that row is split; so does a table of more than max_cells numbers
    (None: no limit but the room) before its first row is read.

    Messages name a row by its place in the table ("row 2, column 3: ..."), or with
    by_line by its line in the text, blank lines counted as an editor counts them
    ("line 4, column 3: ..."; "line 4: 2,049 columns, ...").

    Memory: one float64 array of the table's size, filled a row at a time.
    """
    max_rows, max_cols = room
    if len(text) > most_chars(max_rows, max_cols):
        raise TableTooLarge(
            f"{len(text):,} characters, more than {max_rows:,}×{max_cols:,} numbers can take"
        )
    text = text.removeprefix("\ufeff")
    count, rows = split_table(text, max_rows, max_cols, sep, by_line)
    out: np.ndarray | None = None
    width, first = 0, ""
    for r, (line, cells) in enumerate(rows):
        where = f"line {line}" if by_line else f"row {r + 1}"
        if not cells or cells == [""]:
            raise ValueError(f"{where} is empty")
        if not r:
            width, first = len(cells), where
            if max_cells is not None and count * width > max_cells:
                raise TableTooLarge(f"{count:,}×{width:,} numbers, but at most {max_cells:,} fit")
            # Each number takes a character at least: a taller or wider table is ragged,
            # and is only checked, not stored (no array far larger than the text).
            if count * width <= len(text):
                out = np.empty((count, width))
        elif len(cells) != width:
            raise ValueError(f"{where} has {len(cells)} numbers, {first} has {width}")
        values = _numbers(cells, where)
        if out is not None:
            out[r] = values
    if out is None:  # unreachable: a rectangular table fits its text
        raise ValueError("the rows are not all the same width")
    return out


def _numbers(cells: list[str], where: str) -> list[float]:
    """The numbers of one row; a bad cell raises ValueError naming where and its column."""
    if max(map(len, cells)) <= MAX_NUMBER_CHARS:  # long cells are never copied here
        texts = [c.strip().replace("\u2212", "-") for c in cells]
        if all(map(_NUMBER.fullmatch, texts)):
            values = list(map(float, texts))  # the common case, without a call per cell
            if max(map(abs, values)) <= LIMITS.abs_value:
                return values
    row = []
    for c, cell in enumerate(cells, start=1):
        try:
            row.append(parse_number(cell))
        except ValueError as e:
            raise ValueError(f"{where}, column {c}: {e}") from None
    return row


def format_table(a: np.ndarray) -> str:
    """Tab-separated rows that read back exactly (repr of each float)."""
    return "\n".join("\t".join(repr(float(v)) for v in row) for row in np.atleast_2d(a)) + "\n"
