"""The window's one thread-pool policy: every background job runs on one shared pool.

A ``SerialQueue`` is a client's own queue on that pool: its jobs run one after another,
in order (the compute service, each panel's worker, exports, autosave), while the pool
bounds how many run at once across the window (as many as the machine has cores, up
to four), so background work never starves the UI thread of both cores.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def shared_pool() -> ThreadPoolExecutor:
    """The pool every SerialQueue runs on, made on first use."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            workers = max(2, min(4, os.cpu_count() or 2))
            _POOL = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="attnviz-worker")
        return _POOL


class SerialQueue:
    """Jobs run in the order submitted, one at a time, on the shared pool."""

    def __init__(self) -> None:
        self._jobs: deque[tuple[Callable[[], object], Future[object]]] = deque()
        self._lock = threading.Lock()
        self._running = False
        self._closed = False

    def submit(self, job: Callable[[], object]) -> Future[object]:
        """Queue job; the future holds its value or exception."""
        future: Future[object] = Future()
        with self._lock:
            if self._closed:
                future.cancel()
                return future
            self._jobs.append((job, future))
            if self._running:
                return future
            self._running = True
        shared_pool().submit(self._drain)
        return future

    def _drain(self) -> None:
        while True:
            with self._lock:
                if not self._jobs:
                    self._running = False
                    return
                job, future = self._jobs.popleft()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(job())
            except BaseException as e:  # the future carries it to whoever waits
                future.set_exception(e)

    def wait(self) -> None:
        """Block until every job queued so far has run."""
        future = self.submit(lambda: None)
        if not future.cancelled():
            future.result()

    def close(self, cancel: bool = True) -> None:
        """Take no more jobs; drop queued ones (cancel) and wait for the running one."""
        with self._lock:
            self._closed = True
            dropped = list(self._jobs) if cancel else []
            if cancel:
                self._jobs.clear()
        for _, future in dropped:
            future.cancel()
        done = threading.Event()
        with self._lock:
            if not self._running:
                return
            self._jobs.append((done.set, Future()))
        done.wait()
