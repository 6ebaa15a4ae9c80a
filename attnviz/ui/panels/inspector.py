"""Inspector dock: the worked arithmetic of the selected cell, with the real numbers."""

from __future__ import annotations

import math
import re
from html import escape
from itertools import pairwise
from typing import cast

from PySide6.QtCore import QTextBoundaryFinder
from PySide6.QtGui import QTextOption
from PySide6.QtWidgets import QTextBrowser, QVBoxLayout, QWidget

from attnviz.core.maths.explain import Explanation, explain
from attnviz.core.maths.results import HEAD_MATRICES, TURNED_MATRICES, Result
from attnviz.core.scheduler import Results
from attnviz.ui.view_state import Selection
from attnviz.ui.workspace import Workspace

EMPTY = (
    "<p style='color:#666'>Click any cell of a heatmap to see the "
    "arithmetic behind it: the products and their sum for a score, the division by √d_k, "
    "the exponentials and their quotient for a weight, the weighted sum of value rows for "
    "an output, the head blocks times W_O for the final output.</p>"
)


REFERENCE = re.compile(r"\w+\[[^\[\]]*\]")  # a cell reference: V[she,1], W_O[1–2, 1], X[i,j]
SQUARE = ("scores", "scaled", "masked", "weights")  # query × key: a column is a token
WORD_JOINER, ZERO_WIDTH_SPACE = "\u2060", "\u200b"  # no break here; a break may come here


def number(x: float) -> str:
    return "−∞" if x == -math.inf else f"{x:.6g}".replace("-", "−")


def unbreakable(text: str) -> str:
    """Text as HTML that cannot break across lines: no-break spaces, and a word joiner
    wherever Qt could still break a line (after a hyphen, between ideographs, …)."""
    text = text.replace(" ", "\u00a0")
    index, utf16 = {0: 0}, 0  # Qt counts UTF-16 units; Python counts code points
    for i, ch in enumerate(text, 1):
        utf16 += 2 if ord(ch) > 0xFFFF else 1
        index[utf16] = i
    finder = QTextBoundaryFinder(QTextBoundaryFinder.BoundaryType.Line, text)
    cuts = []
    while (at := finder.toNextBoundary()) != -1:
        if 0 < index.get(at, 0) < len(text):
            cuts.append(index[at])
    pieces = [escape(text[a:b]) for a, b in pairwise([0, *cuts, len(text)])]
    return f"<span style='white-space:nowrap'>{WORD_JOINER.join(pieces)}</span>"


SEPARATOR = re.compile(r"[,;] | \+ ")  # between clauses of a formula, summands of a sum
MINUS = re.compile(r"-(?=\d)")  # a hyphen-minus before a digit: -1.7, 1e-05


def expression(text: str) -> str:
    """A formula or a term's arithmetic (no token in it) as HTML that never breaks inside
    an expression: a line may break only after a ", ", "; " or " + " outside all brackets."""
    pieces, start, depth = [], 0, 0
    for i, ch in enumerate(text):
        depth += (ch in "([") - (ch in ")]")
        if depth == 0 and i >= start and (m := SEPARATOR.match(text, i)):
            pieces.append(unbreakable(text[start : m.end() - 1]))
            start = m.end()
    return " ".join([*pieces, unbreakable(text[start:])])


def arithmetic(text: str) -> str:
    """The numbers written out, with true minus signs as the heatmaps show them."""
    return expression(MINUS.sub("−", text))


def nbsp(text: str) -> str:
    """Escaped text with no-break spaces."""
    return escape(text).replace(" ", "&nbsp;")


def text_html(text: str) -> str:
    """Escaped text in which every cell reference stays on one line; a line may break
    after the · between two of them."""
    out, end = [], 0
    for m in REFERENCE.finditer(text):
        between = escape(text[end : m.start()])
        out += [between + ZERO_WIDTH_SPACE if between == "·" else between, unbreakable(m.group())]
        end = m.end()
    return "".join([*out, escape(text[end:])])


def to_html(e: Explanation, where: list[str]) -> str:
    """An explanation as a small HTML page: where (head 1, row 2 (she), …; each part as
    HTML that stays on one line), formula, one table of terms and steps with every value
    in the value column, value."""

    def value(x: float, style: str = "") -> str:
        return f"<td align='right' style='padding-left:12px;{style}'>{number(x)}</td>"

    rows = [
        f"<tr><td>{unbreakable(t.label)}</td>"
        f"<td style='color:#555'>{arithmetic(t.expression)}</td>{value(t.value)}</tr>"
        for t in e.terms
    ]
    for k, s in enumerate(e.steps):  # the steps below the terms, a little apart
        gap = "padding-top:8px;" if k == 0 and e.terms else ""
        rows.append(
            f"<tr><td colspan='2' style='{gap}'>{unbreakable(s.label)}</td>"
            f"{value(s.value, gap)}</tr>"
        )
    header = (
        "<tr><th align='left'>term</th><th align='left'>arithmetic</th>"
        "<th align='right'>value</th></tr>"
        if e.terms
        else ""
    )
    table = (
        f"<table cellspacing='0' cellpadding='3' style='margin-top:6px'>{header}{''.join(rows)}"
        "</table>"
        if rows
        else ""
    )
    note = f"<p><i>{text_html(e.note)}</i></p>" if e.note else ""
    return (
        f"<h3 style='margin-bottom:2px'>{text_html(e.title)}</h3>"
        f"<div style='color:#444'>{' · '.join(where)}</div>"
        f"<p><code>{expression(e.formula)}</code></p>{table}"
        f"<p style='font-size:large'>value = <b>{number(e.value)}</b></p>{note}"
    )


class InspectorPanel(QWidget):
    """Follows the document's selection and result."""

    def __init__(self, ws: Workspace, parent: QWidget | None = None):
        super().__init__(parent)
        self.doc, self.view_state, self.compute = ws.doc, ws.view_state, ws.compute
        self.view = QTextBrowser()
        self._html = ""
        self.view.setOpenLinks(False)
        # Lines break between words only, never inside one: a number or a cell reference
        # wider than its column widens the table (it scrolls) rather than split.
        self.view.setWordWrapMode(QTextOption.WrapMode.WordWrap)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addWidget(self.view)
        ws.view_state.selectionChanged.connect(lambda _: self.refresh())
        ws.compute.resultChanged.connect(lambda _: self.refresh())
        ws.compute.answered.connect(self._answered)
        self.refresh()

    def _show(self, html: str) -> None:
        """Show html, unless it is what is shown (a page laid out and painted again for
        nothing after every edit, when no cell is selected)."""
        if html != self._html:
            self._html = html
            self.view.setHtml(html)

    def refresh(self) -> None:
        """Ask for the selected cell's arithmetic in the newest complete result (a cell
        of the Masks comparison: in the scenario under that mask)."""
        sel = self.view_state.selection
        if sel is None:
            self._show(EMPTY)
            return
        head = sel.head if sel.view in HEAD_MATRICES + TURNED_MATRICES else None

        def job(r: Results) -> tuple[Selection, Result, Explanation | None]:
            mask = sel.mask or r.scenario.settings.mask
            result = r.layer(mask=mask)
            try:
                return (
                    sel,
                    result,
                    explain(r.under(mask=mask), result, sel.view, head, sel.row, sel.col),
                )
            except KeyError:  # the cell is gone (the matrix shrank)
                return sel, result, None

        self.compute.ask("inspector", job, needs_layer=True)

    def _answered(self, name: str, value: object) -> None:
        if name != "inspector":
            return
        sel, result, e = cast(tuple[Selection, Result, Explanation | None], value)
        if e is None or sel != self.view_state.selection:
            self._show(EMPTY if e is None else self._html)
            return
        head = sel.head if sel.view in HEAD_MATRICES + TURNED_MATRICES else None
        tokens, keys = result.tokens, result.keys
        rows = keys if sel.view in ("K", "V", "K_rot") else tokens
        parts = [nbsp(f"head {head + 1}")] if head is not None else []
        if sel.row < len(rows):  # a token may hold a hyphen, ideographs: unbreakable
            parts.append(unbreakable(f"row {sel.row + 1} ({rows[sel.row]})"))
        column = f"column {sel.col + 1}"
        if sel.view in SQUARE and sel.col < len(keys):  # a key: name its token too
            column += f" ({keys[sel.col]})"
        parts.append(unbreakable(column))
        if sel.mask:
            parts.append(nbsp(f"under mask {sel.mask}"))
        self._show(to_html(e, parts))
