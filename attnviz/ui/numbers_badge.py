"""The numbers check: NumPy, torch and scaled_dot_product_attention agree (or not)."""

from __future__ import annotations

from PySide6.QtWidgets import QToolButton, QWidget

from attnviz.core.maths.results import Result
from attnviz.core.maths.scenario import Scenario
from attnviz.ui.workspace import Workspace

GREEN, RED, GREY = "#1a7f37", "#cf222e", "#57606a"
ABOUT = (
    "The torch engine and torch's scaled_dot_product_attention against the NumPy float64 "
    "engine, every quantity (Q, K, V, scores, weights, outputs, leak, row sum, entropy) "
    "against its own tolerance: what float64 rounding can explain at that quantity's size. "
    "Red when any quantity differs by more."
)


CHECK = "numbers-check"


class NumbersBadge(QToolButton):
    """Click once to start checking (this loads torch); then it follows every result."""

    def __init__(self, ws: Workspace, parent: QWidget | None = None):
        super().__init__(parent)
        self.doc, self.compute = ws.doc, ws.compute
        self.active = False
        ws.compute.answered.connect(lambda name, c: self._show(c) if name == CHECK else None)
        ws.compute.queryFailed.connect(
            lambda name, text: self._paint(f"check failed: {text}", RED) if name == CHECK else None
        )
        self.clicked.connect(self.start)
        self.setToolTip(ABOUT)
        self._paint("Numbers check: click to run (loads torch)", GREY)
        ws.compute.resultChanged.connect(self._on_result)

    def start(self) -> None:
        self.active = True
        self._paint("checking…", GREY)
        self._check()

    def _on_result(self, _: Result) -> None:
        if self.active:
            self._check()

    def _check(self) -> None:
        self.compute.ask(CHECK, lambda r: check(r.scenario), needs_layer=True)

    def _show(self, c: object) -> None:
        from attnviz.core.maths.torch_engine import CrossCheck

        assert isinstance(c, CrossCheck)
        sdpa = f"{c.reference} {c.sdpa_diff:.1e}" if c.sdpa_diff is not None else "SDPA n/a"
        bad = c.culprit
        if bad is None:
            text = f"✓ NumPy vs torch {c.torch_diff:.1e} · {sdpa} ({c.device})"
        else:
            text = f"✗ {bad.name} differs by {bad.diff:.1e} · {sdpa} ({c.device})"
        self._paint(text, GREEN if bad is None else RED)
        rows = [f"{q.name}: {q.diff:.1e} ({q.excess:.2g} × its tolerance)" for q in c.quantities]
        note = [c.sdpa_note] if c.sdpa_note else []
        self.setToolTip("\n".join([ABOUT, "", *rows, *note]))

    def _paint(self, text: str, colour: str) -> None:
        self.setText(text)
        self.setStyleSheet(f"QToolButton {{ color: {colour}; font-weight: bold; border: none; }}")


def check(s: Scenario) -> object:
    from attnviz.core.maths.torch_engine import cross_check

    return cross_check(s, "auto", "float64")
