"""Inspector dock: the worked arithmetic of the selected cell, with the real numbers."""

from __future__ import annotations

import math
from html import escape

from PySide6.QtWidgets import QTextBrowser, QVBoxLayout, QWidget

from attnviz.core.engine import HEAD_MATRICES, Result, compute
from attnviz.core.explain import Explanation, explain
from attnviz.core.scenario import Scenario
from attnviz.ui.background import Background
from attnviz.ui.document import Document, Selection, computes_at_once

EMPTY = (
    "<p style='color:#666'>Click any cell of a heatmap to see the "
    "arithmetic behind it: the products and their sum for a score, the division by √d_k, "
    "the exponentials and their quotient for a weight, the weighted sum of value rows for "
    "an output, the head blocks times W_O for the final output.</p>"
)


def number(x: float) -> str:
    return "−∞" if x == -math.inf else f"{x:.6g}".replace("-", "−")


def to_html(e: Explanation, where: str) -> str:
    """An explanation as a small HTML page: formula, terms table, steps, value."""
    rows = "".join(
        f"<tr><td>{escape(t.label)}</td><td style='color:#555'>{escape(t.expression)}</td>"
        f"<td align='right'>{number(t.value)}</td></tr>"
        for t in e.terms
    )
    table = (
        "<table cellspacing='0' cellpadding='3' style='margin-top:6px'>"
        "<tr><th align='left'>term</th><th align='left'>arithmetic</th><th>value</th></tr>"
        f"{rows}</table>"
        if e.terms
        else ""
    )
    steps = "".join(
        f"<tr><td>{escape(s.label)}</td><td align='right'>{number(s.value)}</td></tr>"
        for s in e.steps
    )
    note = f"<p><i>{escape(e.note)}</i></p>" if e.note else ""
    return (
        f"<h3 style='margin-bottom:2px'>{escape(e.title)}</h3>"
        f"<div style='color:#444'>{escape(where)}</div>"
        f"<p><code>{escape(e.formula)}</code></p>{table}"
        f"<table cellspacing='0' cellpadding='3' style='margin-top:6px'>{steps}</table>"
        f"<p style='font-size:large'>value = <b>{number(e.value)}</b></p>{note}"
    )


class InspectorPanel(QWidget):
    """Follows the document's selection and result."""

    def __init__(self, doc: Document, parent: QWidget | None = None):
        super().__init__(parent)
        self.doc = doc
        self.view = QTextBrowser()
        self.view.setOpenLinks(False)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addWidget(self.view)
        # A cell of the Masks comparison lives in the scenario under another mask:
        # (result it came from, mask) -> (that scenario, its result), computed off-thread.
        self._other: tuple[Result, str, Scenario, Result] | None = None
        self.worker = Background(self)
        self.worker.done.connect(self._other_ready)
        doc.selectionChanged.connect(lambda _: self.refresh())
        doc.resultChanged.connect(lambda r: r.complete and self.refresh())
        self.refresh()

    def _other_ready(self, other: tuple[Result, str, Scenario, Result]) -> None:
        self._other = other
        self.refresh()

    def _result_for(self, sel: Selection) -> tuple[Scenario, Result] | None:
        """The scenario and result the selected cell belongs to; None while computing."""
        s, r = self.doc.result_scenario, self.doc.result
        if sel.mask is None or sel.mask == s.settings.mask:
            return s, r
        if self._other is not None and self._other[0] is r and self._other[1] == sel.mask:
            return self._other[2], self._other[3]
        other, mask = s.with_settings(mask=sel.mask), sel.mask
        if computes_at_once(other):
            self._other = (r, mask, other, compute(other))
            return other, self._other[3]
        self.worker.run(lambda: (r, mask, other, compute(other)))
        return None

    def refresh(self) -> None:
        sel = self.doc.selection
        if sel is None or not self.doc.result.complete:
            if sel is None:
                self.view.setHtml(EMPTY)
            return
        found = self._result_for(sel)
        if found is None:
            self.view.setHtml("<p style='color:#666'>computing…</p>")
            return
        scenario, result = found
        head = sel.head if sel.view in HEAD_MATRICES else None
        try:
            e = explain(scenario, result, sel.view, head, sel.row, sel.col)
        except KeyError:
            self.view.setHtml(EMPTY)  # the cell is gone (the matrix shrank)
            return
        tokens = result.tokens
        parts = [f"head {head + 1}"] if head is not None else []
        if sel.row < len(tokens):
            parts.append(f"row {sel.row + 1} ({tokens[sel.row]})")
        parts.append(f"column {sel.col + 1}")
        if sel.mask:
            parts.append(f"under mask {sel.mask}")
        self.view.setHtml(to_html(e, " · ".join(parts)))
