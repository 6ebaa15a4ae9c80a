"""Waiting for the window in tests: until the latest edit's whole result is drawn."""

from __future__ import annotations

from PySide6.QtWidgets import QApplication


def settle(qtbot, window) -> None:
    """Until the latest edit is computed and every view's question about it answered,
    then a few event passes (so that the views have painted it)."""
    window.compute.wait()
    for _ in range(5):
        QApplication.processEvents()


def look_at_pipeline(window) -> None:
    """Bring the Pipeline forward if another tab hides it, as a user does to look at it
    (it draws the latest result once raised)."""
    from attnviz.ui.heatmap import on_screen

    if not on_screen(window.pipeline):
        window.bring_forward(("Pipeline",))
    for _ in range(3):
        QApplication.processEvents()
