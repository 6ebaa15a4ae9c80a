"""Process start to first painted window (a script, not a test).

    python tests/perf/bench_startup.py [--runs 5]

Starts a fresh Python process that opens the real main window offscreen (as
``attnviz`` does) and exits at its first paint; the time runs from just before the
process is started to that paint. It also reports whether torch had been imported by
then, and the same measurement with torch imported eagerly first, with the ratio.
Target: ≤ 1 s, torch not imported.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

CHILD = r"""
import os, sys, tempfile
from pathlib import Path
if {eager}:
    import torch  # what a careless start-up would cost
from PySide6.QtCore import QEvent, QObject, QSettings
from attnviz.ui.app import make_app
app = make_app()
from attnviz.ui.main_window import MainWindow
folder = Path(tempfile.mkdtemp(dir={parent!r}))  # (the parent removes its folder)
window = MainWindow(QSettings(str(folder / "s.ini"), QSettings.Format.IniFormat), folder)

class FirstPaint(QObject):
    def eventFilter(self, obj, event):
        if event.type() == QEvent.Type.Paint:
            print("painted", "torch" in sys.modules, flush=True)
            os._exit(0)
        return False

watcher = FirstPaint()
window.pipeline.views["weights"].installEventFilter(watcher)
window.show()
app.exec()
"""


def once(eager: bool, parent: str) -> tuple[float, bool]:
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen")
    t0 = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-c", CHILD.format(eager=eager, parent=parent)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    elapsed = time.perf_counter() - t0
    line = next(line for line in out.splitlines() if line.startswith("painted"))
    return elapsed, line.split()[1] == "True"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=5)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as parent:  # the windows' settings and data
        once(False, parent)  # warm the file cache
        lazy = [once(False, parent) for _ in range(args.runs)]
        eager = [once(True, parent) for _ in range(args.runs)]
    t_lazy = statistics.median(t for t, _ in lazy)
    t_eager = statistics.median(t for t, _ in eager)
    torch_loaded = any(loaded for _, loaded in lazy)
    runs = args.runs
    print(f"first paint: {t_lazy * 1e3:.0f} ms (median of {runs}); torch imported: {torch_loaded}")
    print(f"with torch imported eagerly: {t_eager * 1e3:.0f} ms; ratio {t_lazy / t_eager:.2f}")


if __name__ == "__main__":
    main()
