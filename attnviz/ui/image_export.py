"""The window's image export: heatmaps written on a worker thread, in order, with
progress (the writes themselves are attnviz.ui.images')."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from PySide6.QtCore import QCoreApplication, QObject, Signal

from attnviz.core.figures.figure import HeatmapSpec
from attnviz.ui.images import export_error, write_image
from attnviz.ui.workers import SerialQueue

Figure = HeatmapSpec | Callable[[], HeatmapSpec]  # a spec, or what makes it


class ImageExport(QObject):
    """Writes heatmap images on a worker thread, in order, stopping at the first failure.

    ``progress(done, total)`` follows each image; ``finished(written, error)`` comes once,
    with the paths written and '' or the first failure (as ``export_error`` words it).
    Signals arrive on the thread that owns this object.
    """

    progress = Signal(int, int)
    finished = Signal(list, str)

    def __init__(self, parent: QObject | None = None):
        super().__init__(parent)
        self._queue = SerialQueue()
        self._cancelled = False

    def start(self, jobs: Sequence[tuple[Figure, Path, float]]) -> None:
        """Queue (figure, path, scale) writes; PNG or SVG by each path's suffix. A figure
        is a spec, or a function that makes it (on the export thread)."""
        self._cancelled = False
        self._queue.submit(lambda: self._run(list(jobs)))

    def cancel(self) -> None:
        """Write no further images (the one being written is finished)."""
        self._cancelled = True

    def _run(self, jobs: list[tuple[Figure, Path, float]]) -> None:
        written: list[Path] = []
        for figure, path, scale in jobs:
            if self._cancelled:
                self.finished.emit(written, "cancelled")
                return
            try:
                write_image(figure if isinstance(figure, HeatmapSpec) else figure(), path, scale)
            except (OSError, ValueError, MemoryError) as e:
                self.finished.emit(written, export_error(path, e))
                return
            written.append(path)
            self.progress.emit(len(written), len(jobs))
        self.finished.emit(written, "")

    def wait(self) -> None:
        """Block until the queued writes are done and their signals delivered (tests)."""
        self._queue.wait()
        QCoreApplication.processEvents()

    def close(self) -> None:
        self._cancelled = True
        self._queue.close(cancel=False)
