"""The Inspector's text as Qt lays it out: the heading names the cell's tokens, every number
has a true minus sign, every value sits in the value column, and no expression breaks."""

from __future__ import annotations

import re

import numpy as np
import pytest
from PySide6.QtGui import QTextCursor, QTextTable
from PySide6.QtWidgets import QApplication

from attnviz.core.maths.explain import explain
from attnviz.core.presets import make_preset
from attnviz.core.session import SetCells
from attnviz.ui.panels.inspector import InspectorPanel, number
from attnviz.ui.view_state import Selection
from attnviz.ui.workspace import Workspace

# One cell of every kind the Inspector explains, most with negative numbers in them.
CELLS = [
    Selection("X", None, 2, 1),
    Selection("Q", 1, 2, 0),
    Selection("K", 0, 1, 1),
    Selection("V", 0, 3, 1),
    Selection("scores", 0, 3, 2),
    Selection("scaled", 0, 1, 0),
    Selection("masked", 0, 3, 1),
    Selection("masked", 0, 0, 3),  # a future key: −∞
    Selection("weights", 0, 3, 2),
    Selection("weights", 1, 2, 1),
    Selection("output", 0, 3, 1),
    Selection("concat", None, 1, 3),
    Selection("final", None, 2, 0),
]
SQUARE = {"scores", "scaled", "masked", "weights"}


def settle() -> None:
    for _ in range(5):
        QApplication.processEvents()


def shown(text: str) -> str:
    """Text as a reader sees it: no word joiners, plain spaces."""
    return text.replace("\u2060", "").replace("\u200b", "").replace("\xa0", " ")


@pytest.fixture
def inspector(qtbot):
    def make(width: int = 600, tokens: list[str] | None = None) -> InspectorPanel:
        scenario = make_preset("worked-example")
        panel = InspectorPanel(
            Workspace.create(scenario.with_tokens(tokens) if tokens else scenario)
        )
        qtbot.addWidget(panel)
        panel.resize(width, 900)
        panel.show()
        qtbot.waitExposed(panel)
        return panel

    return make


def select(panel: InspectorPanel, cell: Selection):
    """Select a cell; its explanation, laid out at the view's width."""
    panel.view_state.select(cell)
    panel.compute.wait()
    settle()
    panel.view.document().setTextWidth(panel.view.viewport().width())
    head = cell.head if cell.view not in ("X", "concat", "final") else None
    return explain(
        panel.compute.result_scenario, panel.compute.result, cell.view, head, cell.row, cell.col
    )


def tables(panel: InspectorPanel) -> list[QTextTable]:
    frames = panel.view.document().rootFrame().childFrames()
    return [f for f in frames if isinstance(f, QTextTable)]


def cell_text(table: QTextTable, row: int, col: int) -> str:
    cell = table.cellAt(row, col)
    cursor = QTextCursor(cell.firstCursorPosition())
    cursor.setPosition(cell.lastCursorPosition().position(), QTextCursor.MoveMode.KeepAnchor)
    return shown(cursor.selectedText())


def text_box(panel: InspectorPanel, table: QTextTable, row: int, col: int) -> tuple[float, float]:
    """(left, right) of a cell's text on the page, alignment included."""
    block = table.cellAt(row, col).firstCursorPosition().block()
    rect = panel.view.document().documentLayout().blockBoundingRect(block)
    line = block.layout().lineAt(0).naturalTextRect()
    return rect.x() + line.left(), rect.x() + line.right()


def test_heading_names_the_query_and_the_key(inspector):
    panel = inspector()
    tokens = panel.compute.result.tokens
    for cell in CELLS:
        select(panel, cell)
        heading = shown(panel.view.toPlainText()).splitlines()[1]
        column = f"column {cell.col + 1}"
        if cell.view in SQUARE:  # a query row and a key column: both are tokens
            column += f" ({tokens[cell.col]})"
        assert heading.endswith(f"row {cell.row + 1} ({tokens[cell.row]}) · {column}"), heading
    select(panel, Selection("weights", 0, 3, 2))
    assert "head 1 · row 4 (cat) · column 3 (the)" in shown(panel.view.toPlainText())


def test_every_number_has_a_true_minus_sign(inspector):
    panel = inspector()
    negatives = 0
    for cell in CELLS:
        e = select(panel, cell)
        text = shown(panel.view.toPlainText())
        assert not re.search(r"-\d", text), (cell, text)
        negatives += len(re.findall(r"−\d", text))
        # the arithmetic is written out with the same numbers, only the sign changed
        for t in e.terms:
            assert t.expression.replace("-", "−") in text, (t.expression, text)
    assert negatives >= 10


def test_every_value_sits_in_the_value_column(inspector):
    panel = inspector()
    for cell in CELLS:
        e = select(panel, cell)
        found = tables(panel)
        if not (e.terms or e.steps):
            assert found == [], cell
            continue
        assert len(found) == 1, cell  # terms and steps in one table
        table = found[0]
        assert table.columns() == 3, cell
        header = 1 if e.terms else 0
        if header:
            assert [cell_text(table, 0, c) for c in range(3)] == ["term", "arithmetic", "value"]
        assert table.rows() == header + len(e.terms) + len(e.steps), cell
        for r, t in enumerate(e.terms, header):
            assert cell_text(table, r, 2) == number(t.value), (cell, t)
        for r, s in enumerate(e.steps, header + len(e.terms)):
            assert table.cellAt(r, 0).columnSpan() == 2, (cell, s)  # label over term, arithmetic
            assert cell_text(table, r, 0) == shown(s.label), (cell, s)
            assert cell_text(table, r, 2) == number(s.value), (cell, s)
        # right-aligned like the others, and apart from the text to their left
        rights = set()
        for r in range(table.rows()):
            value_left, value_right = text_box(panel, table, r, 2)
            rights.add(round(value_right))
            before = {0, 2 - table.cellAt(r, 0).columnSpan()}  # the term, the arithmetic
            text_right = max(text_box(panel, table, r, c)[1] for c in before)
            assert value_left - text_right >= 8, (cell, r, cell_text(table, r, 0))
        assert max(rights) - min(rights) <= 1, (cell, rights)


def lines_of(layout, start: int, end: int) -> set[int]:
    return {layout.lineForTextPosition(p).lineNumber() for p in range(start, end)}


def one_line_each(block, separator: str) -> None:
    """Each piece of a block's text between separators is laid out on one line."""
    text, layout, start = block.text(), block.layout(), 0
    for m in [*re.finditer(separator, text), None]:
        end = m.start() if m else len(text)
        if end > start:
            assert len(lines_of(layout, start, end)) == 1, (shown(text[start:end]), shown(text))
        start = m.end() if m else end


SUMMAND = r"\s\+\s"  # 0.2×0.5 + 0.1×0.1
# w[i,j] = …, m = max_k s[i,k]: after a clause, or after an =, +, · or / between factors;
# never inside a cell's index (X[i, j])
FORMULA = r"(?<=[,;=+·/])\s(?![^\[]*\])"
# exp(s[she] − m), head 1: concat[she, 1–2] · W_O[1–2, 1]: at a space or after a · that
# is outside every bracket
LABEL = r"(?<=·)\u200b?|\s(?![^\[(]*[\])])"
PART = r"\s·\s"  # head 1 · row 2 (she) · column 3 (the)


def blocks(panel: InspectorPanel):
    block = panel.view.document().begin()
    while block.isValid():
        yield block
        block = block.next()


@pytest.mark.parametrize("width", [300, 220])
def test_no_expression_breaks_at_a_narrow_width(inspector, width):
    # Tokens as a tokenizer writes them: a leading space, a hyphen, ideographs.
    panel = inspector(width, [" she", " saw", "well-known", "天气很好"])
    wrapped = 0
    for cell in CELLS:
        e = select(panel, cell)
        labels = {shown(x.label) for x in (*e.terms, *e.steps)}
        sums = {shown(t.expression).replace("-", "−") for t in e.terms}
        for block in blocks(panel):
            text = shown(block.text()).removeprefix("= ")
            if text in labels:  # a name breaks between the references it names
                one_line_each(block, LABEL)
            elif text in sums:  # the arithmetic breaks between summands only
                one_line_each(block, SUMMAND)
            elif text == shown(e.formula).replace("-", "−"):
                one_line_each(block, FORMULA)
                wrapped += block.layout().lineCount() > 1
            elif " · column " in text or text.startswith("column "):  # the heading
                one_line_each(block, PART)
    assert wrapped >= 1  # a long formula does break, between its clauses


def rows_of(n: int) -> tuple[str, ...]:
    """n tokens, two of them long: a hyphenated word and ideographs."""
    return (*(f"tok{k}" for k in range(n - 2)), "well-known", "天气很好")


NARROW_CASES = {  # a preset, or tokens for a model of 8 heads of 4 (d_model 32)
    "worked-example": None,
    "llama-style": None,  # RoPE, 4 query heads over 2 KV heads
    "alibi": None,
    "sinks": None,
    "8 heads, 16 tokens": rows_of(16),
}
KINDS = ("scores", "scaled", "masked", "weights", "output", "final", "Q_rot", "K_rot")


@pytest.mark.parametrize("case", NARROW_CASES)
def test_every_value_is_in_view_at_260_px(qtbot, case):
    """At the Inspector's narrowest (260 px, the right column at 1280 × 720) every number
    of every term and step is on the page and the page needs no sideways scrolling; the
    row max and Σ exp of a weight are those NumPy computes."""
    from attnviz.core.presets import small_model

    tokens = NARROW_CASES[case]
    scenario = make_preset(case) if tokens is None else small_model(tokens, 32, 8, 4, seed=3)
    panel = InspectorPanel(Workspace.create(scenario))
    qtbot.addWidget(panel)
    panel.resize(260, 720)
    panel.show()
    qtbot.waitExposed(panel)
    last = scenario.n - 1
    for view in KINDS:
        if view.endswith("_rot") and scenario.settings.positional != "rope":
            continue
        cell = Selection(view, None if view == "final" else 0, last, 1)
        e = select(panel, cell)
        settle()  # a vertical scroll bar may have come, and the page been laid out again
        text = shown(panel.view.toPlainText())
        assert panel.view.horizontalScrollBar().maximum() == 0, (case, view)
        for x in (e.value, *(t.value for t in e.terms), *(s.value for s in e.steps)):
            assert number(x) in text, (case, view, number(x))
        if view == "weights" and tokens is not None:  # the row max and Σ exp, by NumPy
            s = scenario
            q, k = s.X @ s.W_Q[0], s.X @ s.W_K[s.kv_head_of(0)]
            row = (q[last] @ k.T / np.sqrt(4))[: last + 1]  # causal: keys 1 … last + 1
            assert number(row.max()) in text and number(np.exp(row - row.max()).sum()) in text


def test_an_edit_that_changes_nothing_shown_lays_out_no_page(inspector, monkeypatch):
    """With no cell selected, or an edit that leaves the selected cell's arithmetic as it
    was, the page is not set (laid out and painted) again; an edit that changes the
    selected cell's numbers shows them."""
    panel = inspector()
    ws_doc, compute = panel.doc, panel.compute
    pages = []
    set_html = panel.view.setHtml
    monkeypatch.setattr(panel.view, "setHtml", lambda html: (pages.append(html), set_html(html)))

    def edit(name, head, row, col, value):
        ws_doc.push(SetCells(ws_doc.session, name, head, row, col, np.array([[value]])))
        compute.wait()
        settle()

    edit("X", None, 1, 1, 0.5)
    assert pages == [] and "Click any cell" in panel.view.toPlainText()
    panel.view_state.select(Selection("scores", 0, 3, 2))
    assert len(pages) == 1
    edit("W_O", None, 0, 0, 3.0)  # after the scores: the score's arithmetic is the same
    assert len(pages) == 1
    edit("X", None, 3, 0, 2.5)  # the query's row: a new score
    want = compute.result.heads[0].scores[3, 2]
    assert len(pages) == 2 and number(want) in shown(panel.view.toPlainText())
