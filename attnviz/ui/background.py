"""Run panel computations off the UI thread; only the newest answer is delivered."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QObject, Signal

from attnviz.ui.workers import SerialQueue


class Background(QObject):
    """One job at a time on a worker thread; an answer older than the latest request is dropped.

    ``run(..., now=True)`` computes on the calling thread instead (small inputs), so the
    answer is there before the next frame.
    """

    done = Signal(object)
    failed = Signal(str)
    _finished = Signal(int, object, str)

    def __init__(self, parent: QObject | None = None):
        super().__init__(parent)
        self._generation = 0
        self._queue = SerialQueue()
        self._finished.connect(self._deliver)

    def run(self, job: Callable[..., Any], *args: Any, now: bool = False) -> None:
        self._generation += 1
        if now:
            self._deliver(self._generation, *self._call(job, args))
        else:
            gen = self._generation
            self._queue.submit(lambda: self._finished.emit(gen, *self._call(job, args)))

    def discard(self) -> None:
        """Drop the answer of any job still running."""
        self._generation += 1

    @staticmethod
    def _call(job: Callable[..., Any], args: tuple[Any, ...]) -> tuple[Any, str]:
        try:
            return job(*args), ""
        except Exception as e:  # shown to the user; the panel keeps its last good state
            return None, f"{type(e).__name__}: {e}"

    def _deliver(self, gen: int, value: Any, error: str) -> None:
        if gen != self._generation:
            return
        if error:
            self.failed.emit(error)
        else:
            self.done.emit(value)

    def wait(self) -> None:
        """Block until the queued jobs have run (tests and scripts)."""
        self._queue.wait()
        from PySide6.QtCore import QCoreApplication

        QCoreApplication.processEvents()

    def close(self) -> None:
        self._queue.close()
