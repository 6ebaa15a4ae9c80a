"""Colour maps shared by the window's heatmaps and the exported figures.

Scores and every other signed matrix use a diverging map centred at 0 with symmetric
levels; weights use a sequential map from 0 to 1. Masked (−∞) cells get their own grey
and are hatched, so they never read as a number.
"""

from __future__ import annotations

import functools
import math
import threading

import numpy as np

# ColorBrewer RdBu, reversed: negative blue, zero near-white, positive red.
DIVERGING = (
    "#053061", "#2166ac", "#4393c3", "#92c5de", "#d1e5f0", "#f7f7f7",
    "#fddbc7", "#f4a582", "#d6604d", "#b2182b", "#67001f",
)  # fmt: skip
# ColorBrewer YlGnBu: 0 pale yellow, 1 deep blue.
SEQUENTIAL = (
    "#ffffd9", "#edf8b1", "#c7e9b4", "#7fcdbb", "#41b6c4",
    "#1d91c0", "#225ea8", "#253494", "#081d58",
)  # fmt: skip
# A light diverging map for tinting cells that show numbers (the weight grids' gradients):
# blue negative, white at 0, red positive, light enough that black digits stay readable.
LIGHT_DIVERGING = ("#92c5de", "#d1e5f0", "#ffffff", "#fddbc7", "#f4a582")
MASKED_FILL = "#c8c8c8"
MASKED_HATCH = "#8c8c8c"
LEAK = "#d62728"  # outline of weight that reached a future key
PROBE = "#0072b2"  # the key column a causality probe nudged
PROBABILITY_VIEWS = ("weights",)


def kind_for(view: str) -> str:
    """'sequential' for weights (0 to 1), 'diverging' for everything else."""
    return "sequential" if view in PROBABILITY_VIEWS else "diverging"


def stops(kind: str) -> np.ndarray:
    """The map's colours as an (k, 3) uint8 array, evenly spaced from low to high."""
    table = {"sequential": SEQUENTIAL, "light": LIGHT_DIVERGING}.get(kind, DIVERGING)
    return np.array([[int(c[i : i + 2], 16) for i in (1, 3, 5)] for c in table], dtype=np.uint8)


def nice_ceiling(x: float) -> float:
    """The smallest of 1, 1.5, 2, 2.5, 3, 4, 5, 6, 8 × 10^k that is ≥ x (x > 0)."""
    exponent = math.floor(math.log10(x))
    for step in (1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0):
        candidate = step * 10.0**exponent
        if candidate >= x * (1 - 1e-12):
            return candidate
    raise AssertionError("unreachable")


def extent(values: np.ndarray) -> tuple[float, float]:
    """The smallest and largest value (NaN if any value is; 0, 0 when there are none)."""
    return (float(values.min()), float(values.max())) if values.size else (0.0, 0.0)


def levels(
    values: np.ndarray, kind: str, known: tuple[float, float] | None = None
) -> tuple[float, float]:
    """Colour-bar limits: (0, 1) for weights; ±a nice number ≥ max|finite value| otherwise.
    ``known``: values' extent, if found already.

    Rounding up to a nice number keeps the scale (and the colour bar) steady while a
    value is edited, and gives round tick labels.
    """
    if kind == "sequential":
        return 0.0, 1.0
    low, high = extent(values) if known is None else known
    top = max(-low, high)
    if not math.isfinite(top):  # −∞ (masked) or NaN among them: the finite ones only
        finite = values[np.isfinite(values)]
        top = float(np.abs(finite).max()) if finite.size else 0.0
    top = nice_ceiling(top) if top > 0 else 1.0
    return -top, top


LUT_SIZE = 1024


@functools.cache
def lut(kind: str) -> np.ndarray:
    """RGBA uint8 colours at LUT_SIZE evenly spaced levels, plus the masked grey last."""
    table = stops(kind).astype(np.float64)
    pos = np.linspace(0, len(table) - 1, LUT_SIZE)
    i = np.minimum(pos.astype(int), len(table) - 2)
    f = (pos - i)[:, None]
    colours = np.rint(table[i] * (1 - f) + table[i + 1] * f)
    rows = np.vstack([colours, [hex_rgb(MASKED_FILL)]])
    out = np.hstack([rows, np.full((LUT_SIZE + 1, 1), 255)]).astype(np.uint8)
    out.flags.writeable = False
    return out


SCRATCH_MOST = 1 << 21  # cells: larger matrices get arrays of their own, not kept
_scratch = threading.local()  # per thread: exports colour figures off the UI thread


def _work(name: str, shape: tuple[int, ...], dtype: type) -> np.ndarray:
    """A scratch array of this thread, reused from call to call (no page faults)."""
    size = math.prod(shape)
    if size > SCRATCH_MOST:
        return np.empty(shape, dtype)
    buffer = getattr(_scratch, name, None)
    if buffer is None or buffer.size < size:
        buffer = np.empty(max(size, 1 << 16), dtype)
        setattr(_scratch, name, buffer)
    return buffer[:size].reshape(shape)


def _lut_index(values: np.ndarray, lims: tuple[float, float]) -> np.ndarray:
    """Each value's row of the colour table (a scratch array of this thread): the level
    between lims, the masked grey (the last row) for non-finite values."""
    lo, hi = lims
    t = _work("t", values.shape, np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        np.subtract(values, lo, out=t)
        t *= (LUT_SIZE - 1) / (hi - lo)
        # One sum finds any ±∞ or NaN (and a sum that overflows only sends us the long way).
        all_finite = math.isfinite(t.sum())
        np.clip(t, 0, LUT_SIZE - 1, out=t)
        index = _work("index", values.shape, np.intp)
        np.copyto(index, t, casting="unsafe")  # truncates, as astype does; NaN: set below
    if not all_finite:
        hidden = _work("hidden", values.shape, np.bool_)
        np.logical_not(np.isfinite(values, out=hidden), out=hidden)
        np.copyto(index, LUT_SIZE, where=hidden)
    return index


def rgba(values: np.ndarray, kind: str, lims: tuple[float, float]) -> np.ndarray:
    """Colours for values as (..., 4) uint8 RGBA; non-finite values get the masked grey."""
    out = np.empty((*values.shape, 4), dtype=np.uint8)
    # Gather whole pixels as 32-bit words: one lookup per cell instead of four.
    words = lut(kind).view(np.uint32)[:, 0]
    np.take(words, _lut_index(values, lims), out=out.view(np.uint32)[..., 0], mode="clip")
    return out


@functools.cache
def _argb_words(kind: str) -> np.ndarray:
    c = lut(kind).astype(np.uint32)
    words = (c[:, 3] << 24) | (c[:, 0] << 16) | (c[:, 1] << 8) | c[:, 2]
    words.flags.writeable = False
    return words


def argb(
    values: np.ndarray, kind: str, lims: tuple[float, float], out: np.ndarray | None = None
) -> np.ndarray:
    """The colours of rgba as 32-bit words 0xAARRGGBB, an array of values' shape: the
    pixels of a QImage in Format_RGB32, which Qt draws fastest."""
    if out is None:
        out = np.empty(values.shape, dtype=np.uint32)
    # "clip": the indices are in range already, and numpy skips its checks (40 % faster).
    np.take(_argb_words(kind), _lut_index(values, lims), out=out, mode="clip")
    return out


def rgb(values: np.ndarray, kind: str, lims: tuple[float, float]) -> np.ndarray:
    """Colours for values as (..., 3) uint8; non-finite values get the masked grey."""
    return rgba(values, kind, lims)[..., :3]


def hex_rgb(color: str) -> tuple[int, int, int]:
    """The red, green and blue (0 to 255) of a "#rrggbb" colour."""
    return int(color[1:3], 16), int(color[3:5], 16), int(color[5:7], 16)


def dark_text(fills: np.ndarray) -> np.ndarray:
    """True where black text reads better than white on the (..., 3) uint8 fills."""
    luminance = fills[..., :3].astype(np.float64) @ np.array([0.2126, 0.7152, 0.0722]) / 255
    return luminance > 0.5  # type: ignore[no-any-return]


@functools.cache
def _dark_rows(kind: str) -> np.ndarray:
    """dark_text for each row of the colour table; True for the masked grey."""
    dark = dark_text(lut(kind))
    dark[LUT_SIZE] = True
    dark.flags.writeable = False
    return dark


def dark_text_on(values: np.ndarray, kind: str, lims: tuple[float, float]) -> np.ndarray:
    """dark_text on each value's colour (rgb), and True where a value is not finite: the
    table's verdict for each value's row, one lookup."""
    return _dark_rows(kind)[_lut_index(values, lims)]  # type: ignore[no-any-return]


def text_color(fill: np.ndarray) -> str:
    """Black or white, whichever reads better on fill (by relative luminance)."""
    return "#000000" if dark_text(np.asarray(fill)) else "#ffffff"


def cell_text(value: float) -> str:
    """How a value is printed inside a heatmap cell."""
    if value == -math.inf:
        return "−∞"
    if not math.isfinite(value):
        return str(value)
    if abs(value) >= 100:
        return f"{value:.3g}"
    return f"{value:.2f}".replace("-", "−")


def light_tint(fraction: float) -> tuple[int, int, int]:
    """The light diverging colour of fraction in [−1, 1] (clipped; NaN is white)."""
    if not math.isfinite(fraction):
        return 255, 255, 255
    level = round((min(max(fraction, -1.0), 1.0) + 1) / 2 * (LUT_SIZE - 1))
    red, green, blue, _ = lut("light")[level]
    return int(red), int(green), int(blue)
