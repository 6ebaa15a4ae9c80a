"""Render the application icon (the SVG under resources/icons/hicolor/scalable/apps/) to
the PNG sizes desktops use.

python packaging/make_icons.py    # writes resources/icons/hicolor/<size>x<size>/apps/
"""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import QSize
from PySide6.QtGui import QColor, QGuiApplication, QImage, QPainter
from PySide6.QtSvg import QSvgRenderer

from attnviz.assets import APP_ID

HICOLOR = Path(__file__).resolve().parent.parent / "resources" / "icons" / "hicolor"  # the source
SIZES = (16, 24, 32, 48, 64, 128, 256, 512)


def main() -> None:
    _app = QGuiApplication.instance() or QGuiApplication([])
    renderer = QSvgRenderer(str(HICOLOR / "scalable" / "apps" / f"{APP_ID}.svg"))
    for size in SIZES:
        image = QImage(QSize(size, size), QImage.Format.Format_ARGB32)
        image.fill(QColor(0, 0, 0, 0))
        painter = QPainter(image)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        renderer.render(painter)
        painter.end()
        folder = HICOLOR / f"{size}x{size}" / "apps"
        folder.mkdir(parents=True, exist_ok=True)
        image.save(str(folder / f"{APP_ID}.png"))
    print(f"wrote {len(SIZES)} PNG sizes under {HICOLOR}")


if __name__ == "__main__":
    main()
