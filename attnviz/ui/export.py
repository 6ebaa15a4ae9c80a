"""Images: SVG straight from the core (heatmap figures, charts), PNG by rendering that SVG.

Both the window and ``attnviz export`` write through here, so they write the same image.
"""

from __future__ import annotations

import os
from pathlib import Path

from PySide6.QtCore import QBuffer, QByteArray, QIODevice, QSize
from PySide6.QtGui import QColor, QImage, QPainter
from PySide6.QtSvg import QSvgRenderer

from attnviz.core.figure import HeatmapSpec, to_svg
from attnviz.core.files import atomic_write

MAX_PNG_PIXELS = 100_000_000


def render(spec: HeatmapSpec, scale: float = 2.0) -> QImage:
    """The figure as an image, scale pixels per SVG unit (2 = sharp on high-DPI screens)."""
    return render_svg(to_svg(spec), scale)


def render_svg(svg: str, scale: float = 2.0) -> QImage:
    """Any SVG document as an image on white, scale pixels per SVG unit."""
    renderer = QSvgRenderer(QByteArray(svg.encode("utf-8")))
    base = renderer.defaultSize()
    size = QSize(max(1, round(base.width() * scale)), max(1, round(base.height() * scale)))
    if size.width() * size.height() > MAX_PNG_PIXELS:
        raise ValueError(
            f"a {size.width()}×{size.height()} image is too large; choose a smaller scale"
        )
    image = QImage(size, QImage.Format.Format_ARGB32)
    image.fill(QColor("white"))
    painter = QPainter(image)
    painter.setRenderHint(QPainter.RenderHint.Antialiasing)
    painter.setRenderHint(QPainter.RenderHint.TextAntialiasing)
    renderer.render(painter)
    painter.end()
    return image


def write_png(spec: HeatmapSpec, path: str | os.PathLike[str], scale: float = 2.0) -> None:
    write_svg_as_png(to_svg(spec), path, scale)


def write_svg_as_png(svg: str, path: str | os.PathLike[str], scale: float = 2.0) -> None:
    buffer = QBuffer()
    buffer.open(QIODevice.OpenModeFlag.WriteOnly)
    if not render_svg(svg, scale).save(buffer, "PNG"):
        raise OSError(f"{Path(path).name}: the PNG could not be encoded")
    atomic_write(path, bytes(buffer.data().data()))


def write_image(spec: HeatmapSpec, path: str | os.PathLike[str], scale: float = 2.0) -> None:
    """A heatmap as PNG or SVG, by the path's suffix."""
    save_svg(to_svg(spec), path, scale)


def save_svg(svg: str, path: str | os.PathLike[str], scale: float = 2.0) -> None:
    """An SVG document as SVG or rendered to PNG, by the path's suffix."""
    suffix = Path(path).suffix.lower()
    if suffix == ".svg":
        atomic_write(path, svg.encode("utf-8"))
    elif suffix == ".png":
        write_svg_as_png(svg, path, scale)
    else:
        raise ValueError(f"{Path(path).name}: expected a .png or .svg file name")
