"""Render the application icon (attnviz/resources/attnviz.svg) to the PNG sizes desktops use.

python packaging/make_icons.py    # writes packaging/icons/hicolor/<size>x<size>/apps/
"""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import QSize
from PySide6.QtGui import QColor, QGuiApplication, QImage, QPainter
from PySide6.QtSvg import QSvgRenderer

from attnviz.resources import APP_ID, path

SIZES = (16, 24, 32, 48, 64, 128, 256, 512)


def main() -> None:
    _app = QGuiApplication.instance() or QGuiApplication([])
    renderer = QSvgRenderer(str(path("attnviz.svg")))
    out = Path(__file__).parent / "icons" / "hicolor"
    for size in SIZES:
        image = QImage(QSize(size, size), QImage.Format.Format_ARGB32)
        image.fill(QColor(0, 0, 0, 0))
        painter = QPainter(image)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        renderer.render(painter)
        painter.end()
        folder = out / f"{size}x{size}" / "apps"
        folder.mkdir(parents=True, exist_ok=True)
        image.save(str(folder / f"{APP_ID}.png"))
    scalable = out / "scalable" / "apps"
    scalable.mkdir(parents=True, exist_ok=True)
    (scalable / f"{APP_ID}.svg").write_bytes(path("attnviz.svg").read_bytes())
    print(f"wrote {len(SIZES)} PNG sizes and the SVG under {out}")


if __name__ == "__main__":
    main()
