"""The Heads and Mix docks at the sizes they have in the default window (1280 × 720 and
1440 × 900): every head's map the same size, one colour bar of its own, every key
labelled when there are few tokens, and nothing wider than the dock."""

from __future__ import annotations

import pytest
from PySide6.QtCore import QPoint, QRect
from PySide6.QtGui import QTextDocument
from PySide6.QtWidgets import QApplication, QFrame, QLabel, QScrollArea, QWidget

from attnviz.core.presets import small_model
from attnviz.ui.heatmap import HeatmapView
from attnviz.ui.panels.heads import HeadsPanel
from attnviz.ui.panels.mix import MixPanel
from attnviz.ui.workspace import Workspace

# The middle column's room (the dock's inside) in the default window: at 1280 × 720, at
# 1440 × 900, and a little wider (as a different split of the columns may give).
DOCKS = {"1280x720": (636, 606), "1440x900": (706, 746), "wider": (760, 746)}
FOUR = ("she", "saw", "the", "cat")
EIGHT = ("the", "cat", "sat", "on", "the", "mat", "and", "slept")


def docked(qtbot, panel_type, scenario, size: tuple[int, int]):
    """The panel in a scroll area of the dock's size, as the window holds it, drawn."""
    ws = Workspace.create(scenario)
    scroll = QScrollArea()
    scroll.setWidgetResizable(True)
    scroll.setFrameShape(QFrame.Shape.NoFrame)
    panel = panel_type(ws)
    scroll.setWidget(panel)
    scroll.resize(*size)
    qtbot.addWidget(scroll)
    scroll.show()
    qtbot.waitExposed(scroll)
    views = lambda: panel.findChildren(HeatmapView)  # noqa: E731
    qtbot.waitUntil(
        lambda: bool(views()) and all(v.spec is not None for v in views()), timeout=10000
    )
    for _ in range(5):
        QApplication.processEvents()
    qtbot.wait(20)
    QApplication.processEvents()
    return scroll, panel


def in_viewport(widget: QWidget, scroll: QScrollArea) -> QRect:
    """The widget's rectangle in the scroll area's viewport."""
    top_left = widget.mapTo(scroll.viewport(), QPoint(0, 0))
    return QRect(top_left, widget.size())


def drawn_size(view: HeatmapView) -> tuple[float, float]:
    """The width and height of the matrix's cells as drawn."""
    rows, cols = view.spec.values.shape
    a, b = view.point_at(0, 0), view.point_at(cols, rows)
    return b.x() - a.x(), b.y() - a.y()


def heads_of(count: int, tokens: tuple[str, ...]):
    return small_model(tokens, 2 * count, count, 2, seed=4)


@pytest.mark.parametrize("screen", DOCKS)
@pytest.mark.parametrize("count", [2, 4, 8, 12])
def test_every_heads_map_has_one_size_and_every_key_of_four_tokens_is_labelled(
    qtbot, screen, count
):
    scroll, panel = docked(qtbot, HeadsPanel, heads_of(count, FOUR), DOCKS[screen])
    views = panel.findChildren(HeatmapView)
    assert len(views) == count
    sizes = [drawn_size(v) for v in views]
    widths, heights = [w for w, _ in sizes], [h for _, h in sizes]
    assert max(widths) - min(widths) <= 1.5 and max(heights) - min(heights) <= 1.5, sizes
    for v in views:
        assert list(v.labelled()[1]) == [0, 1, 2, 3], (v.spec.caption, list(v.labelled()[1]))
        assert list(v.labelled()[0]) == [0, 1, 2, 3]
        assert in_viewport(v, scroll).right() < scroll.viewport().width()
    # The maps start right under the words above them: no band of empty room.
    hint = max(panel.findChildren(QLabel), key=lambda label: len(label.text()))
    gap = min(v.y() for v in views) - (hint.y() + hint.height())
    assert gap <= 12, gap


@pytest.mark.parametrize("screen", DOCKS)
@pytest.mark.parametrize("count", [2, 4, 8, 12])
def test_the_heads_scale_is_one_colour_bar_beside_the_maps(qtbot, screen, count):
    scroll, panel = docked(qtbot, HeadsPanel, heads_of(count, EIGHT), DOCKS[screen])
    views = panel.findChildren(HeatmapView)
    bars = [w for w in panel.findChildren(QWidget) if type(w).__name__ == "ScaleBar"]
    assert len(bars) == 1 and bars[0].isVisible()
    bar = bars[0].geometry()
    assert not any(bar.intersects(v.geometry()) for v in views)
    assert in_viewport(bars[0], scroll).right() < scroll.viewport().width()
    sizes = [drawn_size(v) for v in views]
    assert max(w for w, _ in sizes) - min(w for w, _ in sizes) <= 1.5, sizes
    # Eight short tokens: every key labelled (turned upright rather than every other one
    # dropped).
    assert all(list(v.labelled()[1]) == list(range(8)) for v in views)


def text_width(label: QLabel) -> float:
    """How wide the label's text is when not wrapped (rich text as laid out)."""
    if label.text().lstrip().startswith("<"):
        document = QTextDocument()
        document.setDefaultFont(label.font())
        document.setHtml(label.text())
        return document.idealWidth()
    return label.fontMetrics().horizontalAdvance(label.text())


@pytest.mark.parametrize("screen", DOCKS)
@pytest.mark.parametrize("count", [2, 4])
def test_the_mix_dock_fits_its_width_every_label_and_colour_bar_visible(qtbot, screen, count):
    tokens = FOUR if count == 2 else EIGHT
    scroll, panel = docked(qtbot, MixPanel, heads_of(count, tokens), DOCKS[screen])
    qtbot.waitUntil(lambda: len(panel.parts) == count, timeout=10000)
    QApplication.processEvents()
    width = scroll.viewport().width()
    assert panel.width() <= width  # no sideways scrolling
    labels = [label for label in panel.findChildren(QLabel) if label.isVisible()]
    assert labels
    for label in labels:
        assert label.wordWrap() or text_width(label) <= label.width(), label.text()[:60]
        assert in_viewport(label, scroll).right() < width
    views = [v for v in panel.findChildren(HeatmapView) if v.isVisible()]
    assert len(views) == 3 + count
    for view in views:
        assert view.bar is not None
        # Each view draws its bar inside itself: the view wholly in sight across.
        assert in_viewport(view, scroll).right() < width, view.spec.title
