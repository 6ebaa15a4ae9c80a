"""Screenshots of the real window for the README (offscreen): python docs/make_screenshots.py"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import QSettings
from PySide6.QtWidgets import QApplication

from attnviz.core.presets import make_preset
from attnviz.ui.app import make_app
from attnviz.ui.document import Document, Selection
from attnviz.ui.main_window import MainWindow

OUT = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent


def settle(app: QApplication) -> None:
    for _ in range(30):
        app.processEvents()


def window(app: QApplication, doc: Document | None = None) -> MainWindow:
    folder = Path(tempfile.mkdtemp())
    w = MainWindow(QSettings(str(folder / "s.ini"), QSettings.Format.IniFormat), folder, doc)
    w.resize(1440, 900)
    w.show()
    settle(app)
    return w


def main() -> None:
    app = make_app()
    w = window(app)
    w.doc.select(Selection("weights", 0, 3, 2))
    settle(app)
    w.grab().save(str(OUT / "window.png"))
    w.masks.run_probe()
    for name in ("Masks", "Heads", "Mix", "Experiments"):
        w.docks[name].raise_()
        settle(app)
        w.docks[name].grab().save(str(OUT / f"dock-{name.lower()}.png"))
    w.docks["Inspector"].grab().save(str(OUT / "dock-inspector.png"))
    timing = w.panel("GPU timing")
    w.docks["GPU timing"].raise_()
    timing.min_n.setCurrentText("256")
    timing.max_n.setCurrentText("2048")
    timing.run()
    while timing.sweep is not None:
        app.processEvents()
    settle(app)
    w.docks["GPU timing"].grab().save(str(OUT / "dock-timing.png"))
    w.docks["Weights"].setFloating(True)
    w.docks["Weights"].resize(620, 420)
    settle(app)
    w.docks["Weights"].grab().save(str(OUT / "floating-weights.png"))
    w.doc.undo_stack.setClean()
    w.close()
    big = window(app, Document(make_preset("gpt2-small", n=64)))
    big.grab().save(str(OUT / "window-n64.png"))
    big.close()
    print(f"wrote screenshots to {OUT}")


if __name__ == "__main__":
    main()
