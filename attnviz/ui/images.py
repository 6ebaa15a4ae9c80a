"""Images: SVG straight from the core (heatmap figures, charts), PNG by rendering that SVG.

Both the window and ``attnviz export`` write through here, so they write the same image.
Every write checks what it made first: an SVG must parse as XML, a PNG must have the size
its SVG and scale ask for; anything else is an error, and nothing is written.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from pathlib import Path

import numpy as np
from PySide6.QtCore import QByteArray, QRectF, QSize
from PySide6.QtGui import QColor, QImage, QPainter
from PySide6.QtSvg import QSvgRenderer
from PySide6.QtWidgets import QFileDialog, QInputDialog, QWidget

from attnviz.core.figures.figure import (
    HeatmapSpec,
    cell_box,
    cell_pixels,
    is_raster,
    png_bytes,
    svg_size,
    to_svg,
)
from attnviz.core.io.files import atomic_write, printable

MAX_PNG_PIXELS = 100_000_000


IMAGE_FILTER = "PNG image (*.png);;SVG vector image (*.svg)"


def ask_image_path(parent: QWidget, title: str, default: str) -> tuple[Path, float] | None:
    """Ask where to export an image (PNG or SVG, by the name or the chosen filter) and, for
    a PNG, its scale; None when the user cancels."""
    path, chosen = QFileDialog.getSaveFileName(parent, title, default, IMAGE_FILTER)
    if not path:
        return None
    if Path(path).suffix.lower() not in (".png", ".svg"):
        path += ".svg" if "svg" in chosen.lower() else ".png"
    scale = 2.0
    if path.lower().endswith(".png"):
        scale, ok = QInputDialog.getDouble(
            parent, "PNG scale", "Pixels per unit (1 = 100%):", 2.0, 0.25, 8.0, 2
        )
        if not ok:
            return None
    return Path(path), scale


def render(spec: HeatmapSpec, scale: float = 2.0) -> QImage:
    """The figure as an image, scale pixels per SVG unit (2 = sharp on high-DPI screens)."""
    return render_svg(to_svg(spec), scale)


def render_svg(svg: str, scale: float = 2.0) -> QImage:
    """Any SVG document as an image on white, scale pixels per SVG unit.

    ValueError when the SVG is not well-formed, Qt cannot read it, or the image would be
    larger than MAX_PNG_PIXELS.
    """
    width, height = svg_size(svg)
    return _draw(svg, width, height, _pixel_size(width, height, scale))


def _pixel_size(width: float, height: float, scale: float) -> QSize:
    size = QSize(max(1, round(width * scale)), max(1, round(height * scale)))
    if size.width() * size.height() > MAX_PNG_PIXELS:
        raise ValueError(
            f"a {size.width()}×{size.height()} image is too large; choose a smaller scale"
        )
    return size


def _draw(
    svg: str,
    width: float,
    height: float,
    size: QSize,
    also: Callable[[QPainter, float, float], None] | None = None,
) -> QImage:
    renderer = QSvgRenderer(QByteArray(svg.encode("utf-8")))
    read = renderer.defaultSize()
    if not renderer.isValid() or (read.width(), read.height()) != (round(width), round(height)):
        raise ValueError("the SVG could not be drawn")
    image = QImage(size, QImage.Format.Format_RGB888)
    if image.isNull():
        raise ValueError(f"no memory for a {size.width()}×{size.height()} image")
    image.fill(QColor("white"))
    painter = QPainter(image)
    painter.setRenderHint(QPainter.RenderHint.Antialiasing)
    painter.setRenderHint(QPainter.RenderHint.TextAntialiasing)
    renderer.render(painter)
    if also is not None:
        also(painter, size.width() / width, size.height() / height)
    painter.end()
    return image


def png_size(data: bytes) -> tuple[int, int]:
    """Width and height from a PNG's header; (0, 0) when data is not a PNG."""
    if data[:8] != b"\x89PNG\r\n\x1a\n" or data[12:16] != b"IHDR":
        return 0, 0
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def write_png(spec: HeatmapSpec, path: str | os.PathLike[str], scale: float = 2.0) -> None:
    """A heatmap as PNG. A raster figure's cells are drawn straight from the colour-mapped
    array (not encoded into its SVG and decoded again): the same pixels, in half the time.
    """
    if not is_raster(spec):
        write_svg_as_png(to_svg(spec), path, scale)
        return
    cells = cell_pixels(spec)
    rows, cols, _ = cells.shape
    picture = QImage(cells.data, cols, rows, 3 * cols, QImage.Format.Format_RGB888)
    x, y, width, height = cell_box(spec)

    def draw_cells(painter: QPainter, scale_x: float, scale_y: float) -> None:
        box = QRectF(x * scale_x, y * scale_y, width * scale_x, height * scale_y)
        painter.setRenderHint(QPainter.RenderHint.SmoothPixmapTransform, False)
        painter.drawImage(box, picture)

    write_svg_as_png(to_svg(spec, cells=False), path, scale, draw_cells)


def write_svg_as_png(
    svg: str,
    path: str | os.PathLike[str],
    scale: float = 2.0,
    also: Callable[[QPainter, float, float], None] | None = None,
) -> None:
    """An SVG document rendered to PNG; ``also(painter, sx, sy)`` paints over it, with
    sx, sy the pixels per SVG unit."""
    width, height = svg_size(svg)
    size = _pixel_size(width, height, scale)
    image = _draw(svg, width, height, size, also)
    data = png_bytes(_rows(image))  # image stays alive while its rows are read
    got, expected = png_size(data), (size.width(), size.height())
    if got != expected:
        raise ValueError(f"the PNG came out {got[0]}×{got[1]}, not {expected[0]}×{expected[1]}")
    atomic_write(path, data)


def pixels(image: QImage) -> np.ndarray:
    """An RGB888 image as an (h, w, 3) uint8 array (a copy: the image may then go)."""
    return _rows(image).copy()


def _rows(image: QImage) -> np.ndarray:
    """A view of an RGB888 image's pixels; valid only while the image lives."""
    rows = np.frombuffer(image.constBits(), np.uint8).reshape(image.height(), -1)
    return rows[:, : 3 * image.width()].reshape(image.height(), image.width(), 3)


def write_image(spec: HeatmapSpec, path: str | os.PathLike[str], scale: float = 2.0) -> None:
    """A heatmap as PNG or SVG, by the path's suffix."""
    if Path(path).suffix.lower() == ".png":
        write_png(spec, path, scale)
    else:
        save_svg(to_svg(spec), path, scale)


def save_svg(svg: str, path: str | os.PathLike[str], scale: float = 2.0) -> None:
    """An SVG document as SVG or rendered to PNG, by the path's suffix."""
    suffix = Path(path).suffix.lower()
    if suffix == ".svg":
        svg_size(svg)
        atomic_write(path, svg.encode("utf-8"))
    elif suffix == ".png":
        write_svg_as_png(svg, path, scale)
    else:
        raise ValueError(f"{Path(path).name}: expected a .png or .svg file name")


def export_error(path: Path, error: Exception) -> str:
    """How a failed write is reported: the path and the reason, in one line."""
    if isinstance(error, OSError):
        return f"{printable(path)}: {error.strerror or error}"
    return f"{printable(path.name)}: {error}"
