"""The numbers check: NumPy, torch and scaled_dot_product_attention agree (or not)."""

from __future__ import annotations

from PySide6.QtWidgets import QToolButton, QWidget

from attnviz.core.engine import Result
from attnviz.core.scenario import Scenario
from attnviz.ui.background import Background
from attnviz.ui.document import Document

TOLERANCE = 1e-9  # float64, relative to the size of the numbers: past it, an engine differs
GREEN, RED, GREY = "#1a7f37", "#cf222e", "#57606a"


class NumbersBadge(QToolButton):
    """Click once to start checking (this loads torch); then it follows every result."""

    def __init__(self, doc: Document, parent: QWidget | None = None):
        super().__init__(parent)
        self.doc = doc
        self.active = False
        self.worker = Background(self)
        self.worker.done.connect(self._show)
        self.worker.failed.connect(lambda text: self._paint(f"check failed: {text}", RED))
        self.clicked.connect(self.start)
        self.setToolTip(
            "Largest difference between the NumPy float64 engine, the torch engine and "
            "torch's scaled_dot_product_attention on this scenario (red past 1e-9 of the "
            "largest value compared)"
        )
        self._paint("Numbers check: click to run (loads torch)", GREY)
        doc.resultChanged.connect(self._on_result)

    def start(self) -> None:
        self.active = True
        self._paint("checking…", GREY)
        self._check()

    def _on_result(self, result: Result) -> None:
        if self.active and result.complete:
            self._check()

    def _check(self) -> None:
        self.worker.run(check, self.doc.scenario)

    def _show(self, c: object) -> None:
        from attnviz.core.torch_engine import CrossCheck

        assert isinstance(c, CrossCheck)
        sdpa = f"SDPA {c.sdpa_diff:.1e}" if c.sdpa_diff is not None else "SDPA n/a"
        ok = c.relative <= TOLERANCE
        text = f"{'✓' if ok else '✗'} NumPy vs torch {c.torch_diff:.1e} · {sdpa} ({c.device})"
        self._paint(text, GREEN if ok else RED)
        if c.sdpa_note:
            self.setToolTip(f"{self.toolTip().split(chr(10))[0]}\n{c.sdpa_note}")

    def _paint(self, text: str, colour: str) -> None:
        self.setText(text)
        self.setStyleSheet(f"QToolButton {{ color: {colour}; font-weight: bold; border: none; }}")


def check(s: Scenario) -> object:
    from attnviz.core.torch_engine import cross_check

    return cross_check(s, "auto", "float64")
