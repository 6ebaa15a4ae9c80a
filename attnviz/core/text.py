"""Numbers and tables as text: what a user types, pastes or imports.

``parse_table`` reads spreadsheet ranges (tab-separated), CSV, and NumPy's printed
arrays (``[[0.1, 0.3], [0.7, -0.9]]``, ``array([...])`` or ``print`` output without
commas). ``format_table`` writes tab-separated text that spreadsheets paste as a range.

Every step is linear in the text: a number has at most ``MAX_NUMBER_CHARS`` characters,
and a table with more rows, columns or text than its destination can take is refused
before any number is read.
"""

from __future__ import annotations

import math
import re

import numpy as np

from attnviz.core.scenario import LIMITS

MAX_NUMBER_CHARS = 64  # far more than any float needs (repr writes at most 24)
TABLE_ROWS = max(LIMITS.tokens, LIMITS.d_model, LIMITS.heads * LIMITS.d_k)  # X, W's, W_O
TABLE_COLS = max(LIMITS.d_model, LIMITS.d_k)

# One way to match each number, so a failed match never backtracks over its digits.
_NUMBER = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_DTYPE = re.compile(r"\s*dtype=[\w.]+\s*")


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


def _rows_of_numpy(text: str, max_rows: int) -> list[list[str]]:
    """Cells of a NumPy-printed array: rows are the innermost [...] groups."""
    if text.startswith("array(") and text.endswith(")"):  # repr: array([...], dtype=...)
        text = text[len("array(") : -1]
        head, comma, tail = text.rpartition(",")
        if comma and _DTYPE.fullmatch(tail):
            text = head
    if text.count("[") != text.count("]"):
        raise ValueError("unbalanced brackets")
    inner = re.findall(r"\[([^\[\]]*)\]", text)
    if not inner:
        raise ValueError("no rows between brackets")
    _check_rows(len(inner), max_rows)
    if text.strip().startswith("[[") or len(inner) > 1:
        return [re.split(r"[,\s]+", row.strip()) if row.strip() else [] for row in inner]
    return [re.split(r"[,\s]+", inner[0].strip())]


def _check_rows(count: int, max_rows: int) -> None:
    if count > max_rows:
        raise TableTooLarge(f"{count:,} rows, but at most {max_rows:,} fit")


def split_table(text: str, max_rows: int = TABLE_ROWS) -> list[list[str]]:
    """Split text into rows of cell strings (no number parsing yet).

    More than max_rows rows raises TableTooLarge before any row is split into cells.
    """
    text = text.strip()
    if not text:
        raise ValueError("nothing to paste")
    if "[" in text or text.startswith("array("):
        return _rows_of_numpy(text, max_rows)
    lines = [line for line in text.splitlines() if line.strip()]
    _check_rows(len(lines), max_rows)
    if "\t" in text:
        return [line.split("\t") for line in lines]
    if "," in text:
        return [line.split(",") for line in lines]
    return [line.split() for line in lines]


def most_chars(rows: int, cols: int) -> int:
    """The longest text a table of rows × cols numbers can be (each number padded, brackets)."""
    return rows * (cols * (MAX_NUMBER_CHARS + 2) + 8) + 64


def parse_table(text: str, room: tuple[int, int] = (TABLE_ROWS, TABLE_COLS)) -> np.ndarray:
    """A rectangular block of finite numbers as a 2-D float64 array; ValueError otherwise.

    room: the most rows and columns the destination takes; a larger table (or longer
    text than such a table can be) raises TableTooLarge before any number is read.
    """
    max_rows, max_cols = room
    if len(text) > most_chars(max_rows, max_cols):
        raise TableTooLarge(
            f"{len(text):,} characters, more than {max_rows:,}×{max_cols:,} numbers can take"
        )
    rows = split_table(text, max_rows)
    widest = max(map(len, rows))
    if widest > max_cols:
        raise TableTooLarge(f"{widest:,} columns, but at most {max_cols:,} fit")
    out: list[list[float]] = []
    for r, cells in enumerate(rows, start=1):
        if not cells or cells == [""]:
            raise ValueError(f"row {r} is empty")
        row = _numbers(cells, r)
        if out and len(row) != len(out[0]):
            raise ValueError(f"row {r} has {len(row)} numbers, row 1 has {len(out[0])}")
        out.append(row)
    return np.array(out, dtype=np.float64)


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
