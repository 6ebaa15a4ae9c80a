"""Exported heatmap PNGs read back: each cell's pixel against the colour map of its value.

A PNG is decoded by Qt; one pixel is sampled inside each cell and compared with
``colors.rgb`` of the value the test expects there. A blank (all-white) image fails.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PySide6.QtGui import QImage

from attnviz.core.figures import colors
from attnviz.core.figures.figure import HeatmapSpec, is_raster, layout
from attnviz.ui import images as export


def image_array(path: Path | str) -> np.ndarray:
    """A PNG file as an (h, w, 3) uint8 array, read by Qt."""
    image = QImage(str(path))
    assert not image.isNull(), path
    return export.pixels(image.convertToFormat(QImage.Format.Format_RGB888))


def rgb_of(colour: str) -> np.ndarray:
    """A "#rrggbb" colour as three ints, read here (not by the code under test)."""
    return np.array([int(colour[k : k + 2], 16) for k in (1, 3, 5)])


def shaded(rgb: np.ndarray) -> np.ndarray:
    """The hatch grey at 110/255 over rgb: how masked cells too small to hatch are shown."""
    grey = rgb_of(colors.MASKED_HATCH)
    return np.rint(rgb * (1 - 110 / 255) + grey * (110 / 255)).astype(np.uint8)


def cell_samples(pixels: np.ndarray, spec: HeatmapSpec, scale: float) -> np.ndarray:
    """One pixel per cell, (rows, cols, 3), from an image of spec at scale pixels a unit.

    Cells drawn as one image (one unit or so each) are sampled at their centres. Vector
    cells print their value at the centre, so they are sampled on the centre line a fifth
    of a cell below the top: inside the cell, clear of the text and of a leak's outline.
    """
    L = layout(spec)
    rows, cols = spec.values.shape
    down = 0.5 if is_raster(spec) else 0.2
    ys = np.floor((L.top + (np.arange(rows) + down) * L.cell) * scale).astype(int)
    xs = np.floor((L.left + (np.arange(cols) + 0.5) * L.cell) * scale).astype(int)
    return pixels[ys][:, xs]


def assert_cells_show(
    pixels: np.ndarray, spec: HeatmapSpec, scale: float, values: np.ndarray | None = None
) -> None:
    """Every cell's sampled pixel is the colour map of its value (values: those the test
    knows; by default the spec's own).

    Plain cells: exactly ``colors.rgb``. Hatched cells of a vector figure: a number the
    mask set has each channel between its colour and the hatch colour, as the antialiased
    hatch mixes them; −∞ is a grey from the hatch colour up (the hatch pattern). In an
    image figure, hatched cells are the colour shaded by the hatch grey, and leaked cells
    the leak colour.
    """
    values = spec.values if values is None else np.asarray(values)
    assert values.shape == spec.values.shape
    got = cell_samples(pixels, spec, scale).astype(int)
    colour = colors.rgb(values, spec.kind, spec.levels).astype(int)
    hatched = spec.hatched()
    leaked = spec.leaked if spec.leaked is not None else np.zeros_like(hatched)
    if is_raster(spec):
        expected = colour.copy()
        expected[hatched] = shaded(colour[hatched])
        expected[leaked] = rgb_of(colors.LEAK)
        np.testing.assert_array_equal(got, expected)
        return
    plain = ~hatched
    np.testing.assert_array_equal(got[plain], colour[plain])
    hatch = rgb_of(colors.MASKED_HATCH)
    lo, hi = np.minimum(colour, hatch), np.maximum(colour, hatch)
    # −∞ cells are the hatch pattern alone, whose tiles may let the white page through
    # at their antialiased seams: a grey from the hatch colour to white.
    blank = ~np.isfinite(values)
    hi[blank] = 255
    between = (got >= lo) & (got <= hi)
    assert between[hatched].all(), (got[hatched], colour[hatched])
    grey = (got[..., 0] == got[..., 1]) & (got[..., 1] == got[..., 2])
    assert grey[blank & hatched].all(), got[blank & hatched]
