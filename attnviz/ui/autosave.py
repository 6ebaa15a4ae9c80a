"""Autosave: while there are unsaved changes, a copy of the scenario in the data folder."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from PySide6.QtCore import QObject, QTimer, Signal

from attnviz.core import files
from attnviz.core.scenario import Scenario
from attnviz.ui.document import Document

INTERVAL_MS = 5000


class Autosave(QObject):
    """Every few seconds, if the document changed and is unsaved, writes a snapshot.

    The snapshot is binary (milliseconds even at GPT-2 sizes) and written on a background
    thread; the scenario is immutable, so the UI goes on editing meanwhile.
    """

    failed = Signal(str)

    def __init__(self, doc: Document, folder: Path, parent: QObject | None = None):
        super().__init__(parent)
        self.doc, self.folder = doc, folder
        self._saved: Scenario | None = None
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="attnviz-autosave")
        self.timer = QTimer(self)
        self.timer.setInterval(INTERVAL_MS)
        self.timer.timeout.connect(self.tick)
        self.timer.start()

    @property
    def path(self) -> Path:
        return self.folder / "autosave.npz"

    @property
    def origin_path(self) -> Path:
        return self.folder / "autosave.origin"  # the file the unsaved work belongs to

    def tick(self) -> None:
        scenario = self.doc.scenario
        if self.doc.undo_stack.isClean():
            if self._saved is not None:
                self.clear()  # undone back to the saved state: nothing to restore
            return
        if scenario is self._saved:
            return
        self._saved = scenario
        origin = str(self.doc.path) if self.doc.path else ""
        self._writer.submit(self._write, scenario, origin)

    def _write(self, scenario: Scenario, origin: str) -> None:
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            files.save_snapshot(self.path, scenario)
            files.atomic_write(self.origin_path, origin.encode("utf-8"))
        except OSError as e:
            self.failed.emit(f"Autosave failed: {e.strerror or e}")

    def clear(self) -> None:
        self._writer.submit(lambda: None).result()  # let a pending write finish first
        self._saved = None
        for path in (self.path, self.origin_path):
            path.unlink(missing_ok=True)

    def read(self) -> tuple[Scenario, Path | None]:
        """The autosaved scenario and the file it belonged to; FileFormatError if broken."""
        scenario = files.load_snapshot(self.path)
        text = self.origin_path.read_text("utf-8") if self.origin_path.exists() else ""
        return scenario, Path(text) if text else None

    def close(self) -> None:
        self.timer.stop()
        self.clear()
        self._writer.shutdown(wait=True)
