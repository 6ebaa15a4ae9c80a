"""Numbers and tables as text: what a user types, pastes or imports.

``parse_table`` reads spreadsheet ranges (tab-separated), CSV, and NumPy's printed
arrays (``[[0.1, 0.3], [0.7, -0.9]]``, ``array([...])`` or ``print`` output without
commas). ``format_table`` writes tab-separated text that spreadsheets paste as a range.
"""

from __future__ import annotations

import math
import re

import numpy as np

from attnviz.core.scenario import LIMITS

_NUMBER = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")
_ARRAY_WRAPPER = re.compile(r"^\s*array\((.*?)(,\s*dtype=[\w.]+)?\)\s*$", re.S)


def parse_number(text: str) -> float:
    """A finite decimal number within the value limit (the Unicode minus is accepted).

    Raises ValueError naming the text: ``'abc' is not a number``.
    """
    t = text.strip().replace("\u2212", "-")
    if not _NUMBER.fullmatch(t):
        raise ValueError(f"{text.strip()!r:.40} is not a number")
    value = float(t)
    if not math.isfinite(value) or abs(value) > LIMITS.abs_value:
        raise ValueError(f"{text.strip()!r:.40} is outside ±{LIMITS.abs_value:g}")
    return value


def _rows_of_numpy(text: str) -> list[list[str]]:
    """Cells of a NumPy-printed array: rows are the innermost [...] groups."""
    wrapped = _ARRAY_WRAPPER.match(text)
    if wrapped:
        text = wrapped.group(1)
    if text.count("[") != text.count("]"):
        raise ValueError("unbalanced brackets")
    inner = re.findall(r"\[([^\[\]]*)\]", text)
    if not inner:
        raise ValueError("no rows between brackets")
    if text.strip().startswith("[[") or len(inner) > 1:
        return [re.split(r"[,\s]+", row.strip()) if row.strip() else [] for row in inner]
    return [re.split(r"[,\s]+", inner[0].strip())]


def split_table(text: str) -> list[list[str]]:
    """Split text into rows of cell strings (no number parsing yet)."""
    text = text.strip()
    if not text:
        raise ValueError("nothing to paste")
    if "[" in text or text.startswith("array("):
        return _rows_of_numpy(text)
    lines = [line for line in text.splitlines() if line.strip()]
    if "\t" in text:
        return [line.split("\t") for line in lines]
    if "," in text:
        return [line.split(",") for line in lines]
    return [line.split() for line in lines]


def parse_table(text: str) -> np.ndarray:
    """A rectangular block of finite numbers as a 2-D float64 array; ValueError otherwise."""
    rows = split_table(text)
    out: list[list[float]] = []
    for r, cells in enumerate(rows, start=1):
        if not cells or cells == [""]:
            raise ValueError(f"row {r} is empty")
        row = []
        for c, cell in enumerate(cells, start=1):
            try:
                row.append(parse_number(cell))
            except ValueError as e:
                raise ValueError(f"row {r}, column {c}: {e}") from None
        if out and len(row) != len(out[0]):
            raise ValueError(f"row {r} has {len(row)} numbers, row 1 has {len(out[0])}")
        out.append(row)
    return np.array(out, dtype=np.float64)


def format_table(a: np.ndarray) -> str:
    """Tab-separated rows that read back exactly (repr of each float)."""
    return "\n".join("\t".join(repr(float(v)) for v in row) for row in np.atleast_2d(a)) + "\n"
