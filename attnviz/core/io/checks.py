"""What every file reader shares: ``FileFormatError``, the size limits, how values from a
file are named in messages, and the checks of matrices and their shapes."""

from __future__ import annotations

from typing import Any

import numpy as np

from attnviz.core.maths.scenario import LIMITS, ScenarioError, check_values

MAX_FILE_BYTES = 256 * 2**20
MAX_MATRIX_CELLS = 2**24  # per matrix; per head for the stacks of an .attn.npz


class FileFormatError(ScenarioError):
    """A file could not be loaded; the message names the problem and where."""


# Pieces of messages ---------------------------------------------------------------------


def clip(value: Any, width: int = 40) -> str:
    """repr(value) in at most width characters: a cut one ends in "…", quotes closed."""
    try:
        text = repr(value)
    except ValueError:  # an int of over 4,300 digits
        return f"a whole number of about {int(value.bit_length() * 0.30103):,} digits"
    if len(text) <= width:
        return text
    if isinstance(value, (str, bytes)):
        return text[: width - 2] + "…" + text[-1]
    return text[: width - 1] + "…"


def key_text(key: str) -> str:
    """A key from a file as it can appear in a one-line message."""
    return key if key.isidentifier() and len(key) <= 40 else clip(key)


def shape_text(shape: tuple[int, ...], width: int = 60) -> str:
    """A shape as "4×2", cut to width characters."""
    text = "×".join(map(str, shape))
    return text if len(text) <= width else text[: width - 1] + "…"


def size_text(n: int) -> str:
    """A size in whole MiB, or KiB under 1 MiB."""
    return f"{n // 2**20} MiB" if n >= 2**20 else f"{n // 2**10} KiB"


def reason(e: BaseException) -> str:
    """What numpy, zipfile or json said, in one line; never advice to load pickles."""
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    if "pickle" in text.lower():
        return "holds Python objects (pickles are never loaded)"
    return text[:200] + "…" if len(text) > 200 else text


# Checks ----------------------------------------------------------------------------------


def _whole(n: float) -> str:
    """A bound as text: 2^63 − 1 rather than its 19 digits."""
    if type(n) is int and n > 2**20 and (n + 1).bit_count() == 1:
        return f"2^{n.bit_length()} − 1"
    return f"{n:,}"


def number(
    value: Any,
    where: str,
    low: float,
    high: float,
    integer: bool = False,
    ends: str = "[]",
    what: str = "",
) -> Any:
    """A number from a file, checked to lie from low to high and returned as an int
    (integer: a whole number) or a float; FileFormatError naming where otherwise. ends
    says which ends a float may equal: "[]" both, "(]" not low, "[)" not high; what, if
    given, names the number in the message ("a token id").

    Every single number the readers take from a file comes through here (matrices go
    through ``check_numbers`` as arrays). The range is checked before any conversion,
    so no value (10**400, NaN, a subnormal where the engine divides) raises or
    overflows later: Python compares ints of any size with floats exactly.
    """
    ok = type(value) is int if integer else type(value) in (int, float)
    if ok:
        above = low < value if ends[0] == "(" else low <= value
        below = value < high if ends[1] == ")" else value <= high
        if above and below:
            return value if integer else float(value)
    if integer:
        expected = f"a whole number from {_whole(low)} to {_whole(high)}"
    else:
        expected = f"a number in {ends[0]}{low:g}, {high:g}{ends[1]}"
    expected = f"{what} ({expected})" if what else expected
    raise FileFormatError(f"{where}: expected {expected}, got {clip(value)}")


def check_numbers(where: str, array: np.ndarray, limit: float = LIMITS.abs_value) -> None:
    """Every number finite and within ±limit (the scenario's check, as a FileFormatError)."""
    try:
        check_values(where, array, limit)
    except ScenarioError as e:
        raise FileFormatError(str(e)) from None


def expect_shape(where: str, array: Any, shape: tuple[int, ...]) -> None:
    """array (or a shape) must have shape."""
    got = array if isinstance(array, tuple) else array.shape
    if got != shape:
        raise FileFormatError(f"{where}: expected {shape_text(shape)}, got {shape_text(got)}")


def matrix_field(where: str, value: Any, limit: float = LIMITS.abs_value) -> np.ndarray:
    """A list of equal-length rows of finite numbers within ±limit, as a float64 array.

    A row is a list, or a float64 array when the JSON reader converted it already.
    """
    if not isinstance(value, list) or not value:
        raise FileFormatError(f"{where}: expected a non-empty list of rows")
    width = None
    for r, row in enumerate(value):
        if not isinstance(row, (list, np.ndarray)):
            raise FileFormatError(f"{where}[{r + 1}]: expected a row (a list of numbers)")
        if width is None:
            width = len(row)
        elif len(row) != width:
            raise FileFormatError(f"{where}: row {r + 1} has {len(row)} numbers, row 1 has {width}")
        if isinstance(row, list) and not set(map(type, row)) <= {int, float}:
            c = next(c for c, v in enumerate(row) if type(v) not in (int, float))
            raise FileFormatError(
                f"{where}[{r + 1},{c + 1}]: expected a number, "
                f"got {type(row[c]).__name__} {clip(row[c])}"
            )
    if not width:
        raise FileFormatError(f"{where}: rows are empty")
    if len(value) * width > MAX_MATRIX_CELLS:
        raise FileFormatError(f"{where}: {len(value)}×{width} is over {MAX_MATRIX_CELLS} cells")
    try:
        array = np.array(value, dtype=np.float64)
    except OverflowError:
        raise FileFormatError(f"{where}: a number is too large") from None
    check_numbers(where, array, limit)
    array.flags.writeable = False  # so that the Scenario keeps it without a copy
    return array
