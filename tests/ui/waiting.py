"""Waiting for the window in tests: until the latest edit's whole result is drawn."""

from __future__ import annotations

from PySide6.QtWidgets import QApplication


def settle(qtbot, window) -> None:
    """Until the compute service is idle with a complete result, then a few event passes
    (so that the views have painted it)."""
    qtbot.waitUntil(
        lambda: window.compute.result.complete and not window.compute.busy, timeout=10000
    )
    for _ in range(5):
        QApplication.processEvents()
