"""Autosave: while there are unsaved changes, a copy of the scenario in the data folder.

Whatever that folder holds, reading it never crashes or hangs: a damaged copy is set
aside (renamed, never deleted) and the reason is returned for the window to show.
"""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

from PySide6.QtCore import QObject, QTimer, Signal

from attnviz.core.io import files
from attnviz.core.maths.scenario import Scenario
from attnviz.ui.document import Document
from attnviz.ui.workers import SerialQueue

INTERVAL_MS = 5000
# The timer's snapshot waits for a pause in editing this long: its write (40–70 ms of a
# GPT-2-sized scenario, on a thread) competes with an edit's own work for the two cores,
# and edits timed with it took 18 ms instead of 7. It is never put off longer than LATEST_S.
QUIET_S = 1.0
LATEST_S = 30.0
MAX_ORIGIN_BYTES = 64 * 2**10


def _reason(e: Exception) -> str:
    """An error as one line, naming the file where the error knows it."""
    if isinstance(e, OSError) and e.strerror:
        where = f"{files.printable(e.filename)}: " if e.filename else ""
        return where + e.strerror
    return str(e) or type(e).__name__


class Autosave(QObject):
    """Every few seconds, if the document changed and is unsaved, writes a snapshot.

    The snapshot is binary (milliseconds even at GPT-2 sizes) and written on a background
    thread; the scenario is immutable, so the UI goes on editing meanwhile. A failure is
    reported once through ``failed``, and again only after a write has worked.
    """

    failed = Signal(str)

    def __init__(self, doc: Document, folder: Path, parent: QObject | None = None):
        super().__init__(parent)
        self.doc, self.folder = doc, folder
        self._saved: Scenario | None = None
        self._reported = False
        for path in (self.path, self.origin_path):
            files.remove_stale_temps(path)  # left by a write that was killed
        self._writer = SerialQueue()
        self._edited_at: float | None = None  # the last edit, by time.monotonic()
        self._behind_since: float | None = None  # the first edit the snapshot lacks
        doc.cellsChanged.connect(lambda *_: self._edited())
        doc.scenarioChanged.connect(self._edited)
        self.timer = QTimer(self)
        self.timer.setInterval(INTERVAL_MS)
        self.timer.timeout.connect(self.timed)
        self.timer.start()

    @property
    def path(self) -> Path:
        return self.folder / "autosave.npz"

    @property
    def origin_path(self) -> Path:
        return self.folder / "autosave.origin"  # the file the unsaved work belongs to, as bytes

    def exists(self) -> bool:
        """Whether anything at all is where the snapshot goes."""
        return os.path.lexists(self.path)

    def _edited(self) -> None:
        self._edited_at = time.monotonic()
        if self._behind_since is None:
            self._behind_since = self._edited_at

    def timed(self) -> None:
        """The timer's tick: put off while the user is editing (an edit within QUIET_S),
        unless the snapshot has been behind for LATEST_S."""
        now = time.monotonic()
        editing = self._edited_at is not None and now - self._edited_at < QUIET_S
        overdue = self._behind_since is not None and now - self._behind_since >= LATEST_S
        if not editing or overdue:
            self.tick()

    def tick(self) -> None:
        """Write a snapshot now if the document changed since the last and is unsaved."""
        self._behind_since = None
        scenario = self.doc.scenario
        if self.doc.undo_stack.isClean():
            if self._saved is not None:
                self.clear()  # undone back to the saved state: nothing to restore
            return
        if scenario is self._saved:
            return
        self._saved = scenario
        origin = os.fsencode(self.doc.path) if self.doc.path else b""  # any name, exactly
        self._writer.submit(lambda: self._write(scenario, origin))

    def _write(self, scenario: Scenario, origin: bytes) -> None:
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            files.save_snapshot(self.path, scenario)
            files.atomic_write(self.origin_path, origin)
        except Exception as e:
            self._report(e)
        else:
            self._reported = False

    def _report(self, e: Exception) -> None:
        if not self._reported:
            self._reported = True
            self.failed.emit(f"Autosave failed: {_reason(e)}")

    def clear(self) -> None:
        """Remove the copy; anything that is not a file we wrote is set aside instead."""
        self._writer.wait()  # let a pending write finish first
        self._saved = None
        for path in (self.path, self.origin_path):
            try:
                mode = os.lstat(path).st_mode
                if stat.S_ISREG(mode) or stat.S_ISLNK(mode):
                    path.unlink()
                else:
                    self._set_aside(path)
            except FileNotFoundError:
                pass
            except OSError as e:
                self._report(e)

    def _set_aside(self, path: Path) -> str:
        """Rename path to <name>.damaged-<time> (never over another file); the new name."""
        stamp = time.strftime("%Y%m%d-%H%M%S")
        for n in range(1, 1000):
            new = path.with_name(f"{path.name}.damaged-{stamp}" + (f"-{n}" if n > 1 else ""))
            if not os.path.lexists(new):
                path.rename(new)
                return new.name
        raise FileExistsError(f"{path}.damaged-{stamp}")

    def _set_aside_all(self) -> str:
        """Set the snapshot and its origin aside; a sentence saying where they went."""
        kept, problems = [], []
        for path in (self.path, self.origin_path):
            if os.path.lexists(path):
                try:
                    kept.append(self._set_aside(path))
                except OSError as e:
                    problems.append(f"{path.name} could not be moved aside: {_reason(e)}")
        where = files.printable(self.folder)
        text = f"The damaged files were kept as {' and '.join(kept)} in {where}." if kept else ""
        return " ".join([text, *problems]).strip()

    def read(self) -> tuple[Scenario, Path | None, str]:
        """The autosaved scenario, the file it belonged to, and a note on what was set aside.

        A snapshot that cannot be read is set aside with its origin, and FileFormatError
        says why and where the files went. An origin that cannot be read is set aside
        alone; the scenario is then returned as untitled, with a note saying so.
        """
        try:
            scenario = files.load_snapshot(self.path)
        except files.FileFormatError as e:
            raise files.FileFormatError(f"{e}\n\n{self._set_aside_all()}".strip()) from None
        if not os.path.lexists(self.origin_path):
            return scenario, None, ""
        try:
            raw = files.read_file(self.origin_path, MAX_ORIGIN_BYTES)
            if raw and (b"\0" in raw or not os.path.isabs(os.fsdecode(raw))):
                raise files.FileFormatError(f"{self.origin_path}: not a file path")
        except files.FileFormatError as e:
            try:
                kept = f"kept as {self._set_aside(self.origin_path)}"
            except OSError as moved:
                kept = f"could not be moved aside: {_reason(moved)}"
            note = f"The name of the file this work belonged to is lost ({e}); {kept}."
            return scenario, None, note
        return scenario, Path(os.fsdecode(raw)) if raw else None, ""

    def close(self) -> None:
        self.timer.stop()
        self.clear()
        self._writer.close(cancel=False)
