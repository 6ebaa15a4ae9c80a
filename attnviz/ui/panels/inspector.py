"""Inspector dock: the worked arithmetic of the selected cell, with the real numbers."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from html import escape
from itertools import pairwise
from typing import cast

from PySide6.QtCore import QEvent, QObject, QTextBoundaryFinder
from PySide6.QtGui import QTextDocument, QTextOption
from PySide6.QtWidgets import QTextBrowser, QVBoxLayout, QWidget

from attnviz.core.maths.explain import Explanation, explain
from attnviz.core.maths.explain_gradient import EXPLAINABLE_GRADIENTS, explain_gradient
from attnviz.core.maths.results import HEAD_MATRICES, TURNED_MATRICES, Result
from attnviz.core.maths.scenario import ScenarioError
from attnviz.core.scheduler import Results
from attnviz.ui.view_state import Selection
from attnviz.ui.workspace import Workspace

EMPTY = (
    "<p style='color:#666'>Click any cell of a heatmap to see the "
    "arithmetic behind it: the products and their sum for a score, the division by √d_k, "
    "the exponentials and their quotient for a weight, the weighted sum of value rows for "
    "an output, the head blocks times W_O for the final output; with View → Show "
    "Gradients, click a gradient dQ, …, dmasked, … for its step of the chain rule.</p>"
)


REFERENCE = re.compile(r"\w+\[[^\[\]]*\]")  # a cell reference: V[she,1], W_O[1–2, 1], X[i,j]
# query × key: a column is a token
SQUARE = ("scores", "scaled", "masked", "weights", "dscores", "dscaled", "dmasked", "dweights")
PER_HEAD = HEAD_MATRICES + TURNED_MATRICES + EXPLAINABLE_GRADIENTS  # the views of one head
KEY_ROWS = ("K", "V", "K_rot", "dK", "dV", "dK_rot")  # a row is a key
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
# a formula may also break after its = and after a · or / that joins two of its factors
FORMULA_SEPARATOR = re.compile(r"[,;] | [+=·/] ")
LABEL_SEPARATOR = re.compile(r"· ?| ")  # a term's name: between the references it names
MINUS = re.compile(r"-(?=\d)")  # a hyphen-minus before a digit: -1.7, 1e-05


def expression(text: str, separator: re.Pattern[str] = SEPARATOR, brackets: str = "()[]") -> str:
    """A formula or a term's arithmetic (no token in it) as HTML that never breaks inside
    an expression: a line may break only after a separator (a ", ", "; " or " + ") outside
    all brackets (pairs of opening and closing characters in brackets)."""
    out, start, depth = [], 0, 0
    for i, ch in enumerate(text):
        depth += (ch in brackets[::2]) - (ch in brackets[1::2])
        if depth == 0 and i >= start and (m := separator.match(text, i)):
            piece = text[start : m.end()]
            spaced = piece.endswith(" ")
            out.append(unbreakable(piece.rstrip(" ")) + (" " if spaced else ZERO_WIDTH_SPACE))
            start = m.end()
    return "".join([*out, unbreakable(text[start:])])


def formula(text: str) -> str:
    """A formula as HTML that may break after a clause, an =, a + or a · or / that joins
    two factors, outside a cell's index (round brackets may break: formulas get long)."""
    return expression(text, FORMULA_SEPARATOR, "[]")


def label(text: str) -> str:
    """A term's or a step's name as HTML that may break between the cell references it
    names (after a ·) and at a space outside brackets, never inside a reference."""
    return expression(text, LABEL_SEPARATOR)


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


LAYOUTS = ("wide", "stacked", "narrow")  # tried in turn until one fits the width


def _value(x: float, style: str = "", prefix: str = "") -> str:
    return f"<td align='right' style='padding-left:12px;{style}'>{prefix}{number(x)}</td>"


def _wide_rows(e: Explanation) -> list[str]:
    """term | arithmetic | value; a step's label over the first two columns."""
    header = (
        "<th align='left'>term</th><th align='left'>arithmetic</th><th align='right'>value</th>"
    )
    rows = [f"<tr>{header}</tr>"] if e.terms else []
    rows += [
        f"<tr><td>{unbreakable(t.label)}</td>"
        f"<td style='color:#555'>{arithmetic(t.expression)}</td>{_value(t.value)}</tr>"
        for t in e.terms
    ]
    for k, s in enumerate(e.steps):  # the steps below the terms, a little apart
        gap = "padding-top:8px;" if k == 0 and e.terms else ""
        rows.append(
            f"<tr><td colspan='2' style='{gap}'>{unbreakable(s.label)}</td>"
            f"{_value(s.value, gap)}</tr>"
        )
    return rows


def _stacked_rows(e: Explanation) -> list[str]:
    """Each term's name on a line of its own, its arithmetic below it beside its value;
    a step's label beside its value."""
    rows = ["<tr><th align='left'>term, arithmetic</th><th align='right'>value</th></tr>"]
    rows = rows if e.terms else []
    for t in e.terms:
        rows += [
            f"<tr><td colspan='2' style='padding-top:4px'>{label(t.label)}</td></tr>",
            f"<tr><td style='color:#555;padding-left:12px'>{arithmetic(t.expression)}</td>"
            f"{_value(t.value)}</tr>",
        ]
    for k, s in enumerate(e.steps):
        gap = "padding-top:8px;" if k == 0 and e.terms else ""
        rows.append(f"<tr><td style='{gap}'>{label(s.label)}</td>{_value(s.value, gap)}</tr>")
    return rows


def _narrow_rows(e: Explanation) -> list[str]:
    """One column: each term's name, its arithmetic, then "= value" on lines of their own."""
    rows = []
    for t in e.terms:
        rows += [
            f"<tr><td style='padding-top:4px'>{label(t.label)}</td></tr>",
            f"<tr><td style='color:#555;padding-left:12px'>{arithmetic(t.expression)}</td></tr>",
            f"<tr>{_value(t.value, prefix='= ')}</tr>",
        ]
    for k, s in enumerate(e.steps):
        gap = "padding-top:8px;" if k == 0 and e.terms else ""
        rows += [
            f"<tr><td style='{gap}'>{label(s.label)}</td></tr>",
            f"<tr>{_value(s.value, prefix='= ')}</tr>",
        ]
    return rows


ROWS = {"wide": _wide_rows, "stacked": _stacked_rows, "narrow": _narrow_rows}


def to_html(e: Explanation, where: list[str], layout: str = "wide") -> str:
    """An explanation as a small HTML page: where (head 1, row 2 (she), …; each part as
    HTML that stays on one line), formula, one table of terms and steps, value.

    layout "wide": term | arithmetic | value columns; "stacked": a term's name above its
    arithmetic and value; "narrow": name, arithmetic and value each on a line of its own."""
    rows = ROWS[layout](e) if e.terms or e.steps else []
    table = (
        f"<table cellspacing='0' cellpadding='3' style='margin-top:6px'>{''.join(rows)}</table>"
        if rows
        else ""
    )
    note = f"<p><i>{text_html(e.note)}</i></p>" if e.note else ""
    return (
        f"<h3 style='margin-bottom:2px'>{text_html(e.title)}</h3>"
        f"<div style='color:#444'>{' · '.join(where)}</div>"
        f"<p><code>{formula(e.formula)}</code></p>{table}"
        f"<p style='font-size:large'>value = <b>{number(e.value)}</b></p>{note}"
    )


GRID = "grid:"  # a selection's view "grid:W_Q": a cell of that grid, its latest training step
NO_STEP = (
    "<p style='color:#666'>A cell of a matrix shows its latest training step here: train "
    "the layer in the Training dock (the matrix ticked under <i>trains</i>), then click the "
    "cell again. After an edit, an undo or a scrub back the run's last step is no longer "
    "what the grids show.</p>"
)
StepOf = Callable[[str, int | None, int, int], Explanation | None]


class InspectorPanel(QWidget):
    """Follows the document's selection and result; a grid's cell, the training run's
    latest step of it (``step_of``)."""

    def __init__(self, ws: Workspace, step_of: StepOf | None = None, parent: QWidget | None = None):
        super().__init__(parent)
        self.step_of = step_of
        self.doc, self.view_state, self.compute = ws.doc, ws.view_state, ws.compute
        self.view = QTextBrowser()
        self._html = ""
        self.view.setOpenLinks(False)
        # Lines break between words only, never inside one; the page is laid out in the
        # first layout that fits the width (see _fitting), so nothing needs sideways scrolling.
        self.view.setWordWrapMode(QTextOption.WrapMode.WordWrap)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addWidget(self.view)
        self._page: tuple[Explanation, list[str]] | None = None  # the explanation shown
        self._scratch = QTextDocument(self)  # where a layout is tried for width
        self.view.viewport().installEventFilter(self)
        ws.view_state.selectionChanged.connect(lambda _: self.refresh())
        ws.compute.resultChanged.connect(lambda _: self.refresh())
        ws.compute.answered.connect(self._answered)
        self.refresh()

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if event.type() == QEvent.Type.Resize and self._page is not None:
            self._show(self._fitting(*self._page))  # another layout may fit the new width
        return super().eventFilter(watched, event)

    def _fitting(self, e: Explanation, parts: list[str]) -> str:
        """The explanation in the first layout whose page fits the view's width (the
        narrowest when none does)."""
        width = self.view.viewport().width()
        self._scratch.setDefaultFont(self.view.document().defaultFont())
        self._scratch.setDocumentMargin(self.view.document().documentMargin())
        self._scratch.setDefaultTextOption(self.view.document().defaultTextOption())
        for layout in LAYOUTS:
            html = to_html(e, parts, layout)
            self._scratch.setHtml(html)
            self._scratch.setTextWidth(width)
            if self._scratch.idealWidth() <= width:
                break
        return html

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
            self._page = None
            self._show(EMPTY)
            return
        if sel.view.startswith(GRID):
            self._show_step(sel)
            return
        head = sel.head if sel.view in PER_HEAD else None
        if sel.view in EXPLAINABLE_GRADIENTS:
            self.compute.ask("inspector", lambda r: gradient_job(r, sel), needs_layer=True)
            return

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

    def _show_step(self, sel: Selection) -> None:
        name = sel.view.removeprefix(GRID)
        e = None if self.step_of is None else self.step_of(name, sel.head, sel.row, sel.col)
        if e is None:
            self._page = None
            self._show(NO_STEP)
            return
        self._page = (e, [])
        self._show(self._fitting(e, []))

    def _answered(self, name: str, value: object) -> None:
        if name != "inspector":
            return
        sel, result, e = cast(tuple[Selection, Result, Explanation | None], value)
        if e is None or sel != self.view_state.selection:
            if e is None:
                self._page = None
                self._show(EMPTY)
            return
        head = sel.head if sel.view in PER_HEAD else None
        tokens, keys = result.tokens, result.keys
        rows = keys if sel.view in KEY_ROWS else tokens
        parts = [nbsp(f"head {head + 1}")] if head is not None else []
        if sel.row < len(rows):  # a token may hold a hyphen, ideographs: unbreakable
            parts.append(unbreakable(f"row {sel.row + 1} ({rows[sel.row]})"))
        column = f"column {sel.col + 1}"
        if sel.view in SQUARE and sel.col < len(keys):  # a key: name its token too
            column += f" ({keys[sel.col]})"
        parts.append(unbreakable(column))
        if sel.mask:
            parts.append(nbsp(f"under mask {sel.mask}"))
        self._page = (e, parts)
        self._show(self._fitting(e, parts))


def gradient_job(r: Results, sel: Selection) -> tuple[Selection, Result, Explanation | None]:
    """The chain rule of a selected gradient cell, from the gradients of the version's
    own loss (in core, off the UI thread); None when the cell or its head is gone."""
    result = r.layer()
    try:
        g = r.gradients()  # (made once a version, shared with the views that draw them)
        head = sel.head or 0
        return (
            sel,
            result,
            explain_gradient(r.scenario, result, g, sel.view, head, sel.row, sel.col),
        )
    except (KeyError, IndexError, ScenarioError):
        return sel, result, None
