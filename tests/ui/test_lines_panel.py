"""The Lines dock, driven through the window: it builds when raised, follows edits and the
shown head, isolates a hovered token, and exports SVG and PNG through its dialogs.

Expected weights come from the plain NumPy reference (tests/reference.py).
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

import numpy as np
import pytest
import reference as ref
from PySide6.QtCore import QEvent, QPointF, Qt
from PySide6.QtGui import QColor, QImage, QMouseEvent
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QApplication, QFileDialog, QInputDialog

from attnviz.core.figures.lines import Isolated
from attnviz.core.presets import make_preset, random_scenario
from attnviz.ui.images import png_size
from attnviz.ui.panels.lines import LinesPanel

pytestmark = pytest.mark.usefixtures("warnings_shown", "answers")

SVG = "{http://www.w3.org/2000/svg}"
TOKENS = ("she", "saw", "the", "cat")
THRESHOLD = 0.01  # the figure's: weights below it get no line


def settle() -> None:
    for _ in range(3):
        QApplication.processEvents()


def weights_of(head: int, X: np.ndarray = ref.X) -> np.ndarray:
    return ref.head(X, ref.W_Q[head], ref.W_K[head], ref.W_V[head])[1]


@pytest.fixture
def window(worked_window):
    return worked_window


@pytest.fixture
def panel(window, qtbot) -> LinesPanel:
    window.bring_forward(("Lines",))
    settle()
    panel = window.panel("Lines")
    assert isinstance(panel, LinesPanel)
    panel.follow_shown_head()
    panel.canvas.set_isolated(None)
    qtbot.waitUntil(lambda: panel.canvas.tokens == TOKENS and panel.isVisible())
    settle()
    return panel


def hover(canvas, side: str, index: int) -> None:
    """A mouse move over a token's label, as the window system would send it."""
    g = canvas.geometry_now()
    x = g.q_x - 4 if side == "query" else g.k_x + 4
    pos = QPointF(x, g.centre(index))
    event = QMouseEvent(
        QEvent.Type.MouseMove,
        pos,
        canvas.mapToGlobal(pos),
        Qt.MouseButton.NoButton,
        Qt.MouseButton.NoButton,
        Qt.KeyboardModifier.NoModifier,
    )
    QApplication.sendEvent(canvas, event)
    settle()


def pixel(image: QImage, x: float, y: float) -> QColor:
    return image.pixelColor(round(x), round(y))


def rgb(image: QImage) -> np.ndarray:
    """(height, width, 4) ints: an image's pixels."""
    image = image.convertToFormat(QImage.Format.Format_RGB32)
    rows = np.frombuffer(image.constBits(), np.uint8).reshape(image.height(), -1)
    return rows[:, : 4 * image.width()].reshape(image.height(), image.width(), 4).astype(int)


def is_white(color: QColor) -> bool:
    return min(color.red(), color.green(), color.blue()) >= 250


def test_the_dock_builds_when_raised_and_shows_the_shown_head(window, panel):
    assert window.docks["Lines"].windowTitle() == "Lines"
    canvas = panel.canvas
    assert canvas.heads == (0,)
    assert canvas.keys == TOKENS
    np.testing.assert_allclose(canvas.weights[0], weights_of(0), atol=1e-12)
    count = int((weights_of(0) >= THRESHOLD).sum())
    assert panel.note.text() == f"{count} lines (weights ≥ 0.01)."
    window.view_state.set_head(1)
    settle()
    assert canvas.heads == (1,)
    np.testing.assert_allclose(canvas.weights[1], weights_of(1), atol=1e-12)


def test_an_edit_through_the_document_redraws_the_lines(window, panel):
    canvas = panel.canvas
    before = canvas.grab().toImage()
    model = window.inputs.model
    assert model.setData(model.index(3, 0), "-2")
    window.compute.wait()
    settle()
    X = ref.X.copy()
    X[3, 0] = -2.0
    np.testing.assert_allclose(canvas.weights[0], weights_of(0, X), atol=1e-12)
    assert not np.allclose(weights_of(0, X)[3], weights_of(0)[3], atol=0.02)  # a real change
    assert canvas.grab().toImage() != before
    window.doc.undo_stack.undo()
    window.compute.wait()
    settle()
    np.testing.assert_allclose(canvas.weights[0], weights_of(0), atol=1e-12)


def test_hovering_a_query_keeps_only_its_lines_and_prints_their_weights(panel):
    canvas, w = panel.canvas, weights_of(0)
    g = canvas.geometry_now()
    x1, x2 = g.q_x + 6, g.k_x - 6
    mid = (x1 + x2) / 2
    # "she" attends only to itself (causal): an opaque line along its row.
    assert w[0, 0] == pytest.approx(1.0)
    before = canvas.grab().toImage()
    assert not is_white(pixel(before, mid, g.centre(0)))

    hover(canvas, "query", 2)
    assert canvas.isolated == Isolated("query", 2)
    after = canvas.grab().toImage()
    assert is_white(pixel(after, mid, g.centre(0)))  # another query's line is gone
    strongest = int(np.argmax(w[2]))  # the hovered query's strongest line is drawn
    assert not is_white(pixel(after, mid, (g.centre(2) + g.centre(strongest)) / 2))
    printed = canvas.printed_weights()
    assert [[text for _, text, _ in row] for row in printed] == [[f"{v:.2f}"] for v in w[2]]
    assert [line for row in printed for _, _, line in row] == list(w[2] >= THRESHOLD)

    hover(canvas, "key", 1)
    assert canvas.isolated == Isolated("key", 1)
    printed = canvas.printed_weights()
    assert [[text for _, text, _ in row] for row in printed] == [[f"{v:.2f}"] for v in w[:, 1]]
    QApplication.sendEvent(canvas, QEvent(QEvent.Type.Leave))
    assert canvas.isolated is None


def test_arrow_keys_pick_a_token_and_escape_shows_every_line(panel):
    canvas = panel.canvas
    QTest.keyClick(canvas, Qt.Key.Key_Down)
    assert canvas.isolated == Isolated("query", 0)
    QTest.keyClick(canvas, Qt.Key.Key_End)
    assert canvas.isolated == Isolated("query", 3)
    QTest.keyClick(canvas, Qt.Key.Key_Right)
    assert canvas.isolated == Isolated("key", 3)
    QTest.keyClick(canvas, Qt.Key.Key_Up)
    assert canvas.isolated == Isolated("key", 2)
    QTest.keyClick(canvas, Qt.Key.Key_Escape)
    assert canvas.isolated is None


def test_a_token_picked_with_the_keys_is_scrolled_into_view(window, panel):
    window.doc.reset(random_scenario(n=90, d_model=8, heads=2, d_k=4), None)
    window.compute.wait()
    settle()
    bar = panel.view.verticalScrollBar()
    assert bar.maximum() > 0 and bar.value() == 0  # 90 rows do not fit
    g, seen = panel.canvas.geometry_now(), panel.view.viewport().height()
    QTest.keyClick(panel.canvas, Qt.Key.Key_End)
    assert panel.canvas.isolated == Isolated("query", 89)
    assert bar.value() > 0
    assert bar.value() < g.centre(89) < bar.value() + seen
    QTest.keyClick(panel.canvas, Qt.Key.Key_Home)
    assert bar.value() < g.centre(0) < bar.value() + seen


def test_after_an_edit_only_the_lines_in_sight_are_drawn_and_a_scroll_draws_more(window, panel):
    """New lines (an edit) are drawn for what is seen alone (at n = 512 a third of the
    work: 50 → 16 ms); scrolled to, as much again above and below, so that scrolling on
    reuses them. Either way the screen shows what a canvas drawn afresh shows."""
    window.doc.reset(random_scenario(n=90, d_model=8, heads=2, d_k=4), None)
    window.compute.wait()
    settle()
    canvas, bar = panel.canvas, panel.view.verticalScrollBar()
    seen = panel.view.viewport().height()
    assert bar.maximum() > seen  # 90 rows: more than a page of them hidden
    model = window.inputs.model
    assert model.setData(model.index(40, 0), "1.5")
    window.compute.wait()
    settle()
    area = canvas._cache[1]
    assert area.top() == bar.value() and area.height() == seen
    bar.setValue(bar.value() + seen // 2)
    settle()
    area = canvas._cache[1]
    assert area.top() < bar.value() and area.bottom() > bar.value() + seen
    shown = panel.view.viewport().grab().toImage()
    canvas._cache = None  # drawn afresh
    fresh = panel.view.viewport().grab().toImage()
    # (smooth lines' edges differ by a few levels with where the image begins, and where
    # two edges cross by more, in a few pixels)
    differ = np.abs(rgb(fresh) - rgb(shown)).max(axis=2)
    assert np.count_nonzero(differ > 40) <= 12 and np.median(differ) == 0
    bar.setValue(bar.value() + seen // 4)
    settle()
    assert canvas._cache[1] == area  # scrolled within it: not drawn again


def test_head_boxes_pick_the_heads_and_shown_head_follows_the_toolbar_again(window, panel):
    canvas = panel.canvas
    panel.all_button.click()
    settle()
    assert canvas.heads == (0, 1)
    assert [s.isChecked() for s in panel.switches] == [True, True]
    panel.switches[0].click()
    settle()
    assert canvas.heads == (1,)
    window.view_state.set_head(0)  # not followed while heads are picked by hand
    settle()
    assert canvas.heads == (1,)
    panel.shown_button.click()
    settle()
    assert canvas.heads == (0,)
    assert [s.isChecked() for s in panel.switches] == [True, False]


def test_cross_attention_shows_the_key_tokens(window, panel):
    window.doc.reset(make_preset("cross-attention"), None)
    window.compute.wait()
    settle()
    assert panel.canvas.tokens == ("the", "cat", "sat")
    assert panel.canvas.keys == ("le", "chat", "est", "assis", ".")
    assert np.shape(panel.canvas.weights) == (2, 3, 5)


def test_many_lines_keep_the_strongest_and_no_copy_of_every_head(window, panel):
    from attnviz.ui.panels.lines import MAX_LINES

    window.doc.reset(make_preset("gpt2-small", n=512), None)
    window.compute.wait()
    settle()
    heads = window.compute.result.heads
    canvas = panel.canvas
    assert all(np.array_equal(canvas.weights[h], heads[h].weights) for h in range(12))
    everything = np.sort(heads[0].weights.ravel())
    assert (everything >= 0.01).sum() > MAX_LINES
    assert canvas._floor == everything[-MAX_LINES]  # the 4000th strongest weight
    assert f"{MAX_LINES:,} strongest" in canvas.note


def lines_in(path) -> dict[tuple[int, int], float]:
    root = ET.parse(path).getroot()
    assert root.tag == f"{SVG}svg"
    return {
        (int(line.get("data-query")), int(line.get("data-key"))): float(line.get("stroke-opacity"))
        for line in root.iter(f"{SVG}line")
    }


def test_export_writes_svg_and_png_through_the_dialogs(window, panel, tmp_path, monkeypatch):
    monkeypatch.setattr(
        QFileDialog,
        "getSaveFileName",
        lambda *a, **k: (str(tmp_path / "lines"), "SVG vector image (*.svg)"),
    )
    panel.export_button.click()
    panel.wait()
    settle()
    w = weights_of(0)
    got = lines_in(tmp_path / "lines.svg")
    want = {(i, j): w[i, j] for i in range(4) for j in range(4) if w[i, j] >= THRESHOLD}
    assert got.keys() == want.keys()
    for pair, value in want.items():
        assert got[pair] == pytest.approx(value, abs=5e-5)
    assert window.statusBar().currentMessage() == "Exported lines.svg"

    monkeypatch.setattr(
        QFileDialog,
        "getSaveFileName",
        lambda *a, **k: (str(tmp_path / "lines"), "PNG image (*.png)"),
    )
    monkeypatch.setattr(QInputDialog, "getDouble", lambda *a, **k: (1.5, True))
    panel.export()
    panel.wait()
    settle()
    data = (tmp_path / "lines.png").read_bytes()
    root = ET.parse(tmp_path / "lines.svg").getroot()
    width, height = float(root.get("width")), float(root.get("height"))
    assert png_size(data) == (round(width * 1.5), round(height * 1.5))
    image = QImage(str(tmp_path / "lines.png"))
    colours = {image.pixel(x, y) for x in range(0, image.width(), 7) for y in range(0, 200, 3)}
    assert len(colours) > 10  # text and lines, not a blank page
    assert window.statusBar().currentMessage() == "Exported lines.png"


def test_a_failed_export_says_why(window, panel, tmp_path, warnings_shown):
    panel.export_to(tmp_path / "missing" / "lines.svg")
    panel.wait()
    settle()
    assert warnings_shown and warnings_shown[-1][0] == "Cannot export the image"
    assert "lines.svg" in warnings_shown[-1][1]
