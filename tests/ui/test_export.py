"""Heatmap export: PNG size and pixels, SVG structure and labels, the whole pipeline.

Sizes are read from the files themselves (the decoded PNG, the SVG's width and height);
values are checked against the brief's matrices (``reference``): in the SVG by each
cell's title, in the PNG by each cell's colour (``heatmap_pixels``).
"""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest
import reference
from heatmap_pixels import assert_cells_show, image_array
from PySide6.QtGui import QColor, QImage
from PySide6.QtWidgets import QFileDialog, QInputDialog

from attnviz.core.figures.figure import HeatmapSpec
from attnviz.core.maths.results import HEAD_MATRICES
from attnviz.ui.images import write_image

SVG = "{http://www.w3.org/2000/svg}"
# Never let a message box block the run: warnings are recorded (tests that expect one ask
# for the list) and any other box nobody answers is rejected and fails the test.
pytestmark = pytest.mark.usefixtures("warnings_shown", "answers")

TOKENS = ("she", "saw", "the", "cat")


def svg_root(path: Path) -> ET.Element:
    root = ET.parse(path).getroot()
    assert root.tag == f"{SVG}svg"
    return root


def svg_size(root: ET.Element) -> tuple[float, float]:
    return float(root.get("width")), float(root.get("height"))


def assert_png_matches_svg(
    png: Path, svg: Path, scale: float, spec: HeatmapSpec, values: np.ndarray
) -> None:
    """The PNG is the SVG's size times the scale, and every cell shows the colour of the
    value the test expects there (so a blank or stale image fails)."""
    width, height = svg_size(svg_root(svg))
    pixels = image_array(png)
    got = pixels.shape[1], pixels.shape[0]
    # The image is the SVG's size times the scale, rounded to whole pixels.
    assert abs(got[0] - width * scale) <= 0.5 + 1e-9, (got, width, scale)
    assert abs(got[1] - height * scale) <= 0.5 + 1e-9, (got, height, scale)
    assert_cells_show(pixels, spec, scale, values)


def cells(root: ET.Element) -> list[tuple[ET.Element, str]]:
    """The (rect, title text) pairs of the <g id="cells"> group, in document order."""
    groups = [g for g in root.iter(f"{SVG}g") if g.get("id") == "cells"]
    assert len(groups) == 1
    out = []
    for rect in groups[0]:
        assert rect.tag == f"{SVG}rect"
        title = rect.find(f"{SVG}title")
        assert title is not None and title.text
        out.append((rect, title.text))
    return out


def texts(root: ET.Element) -> list[str]:
    return [t.text or "" for t in root.iter(f"{SVG}text")]


def title_value(title: str) -> float:
    """The value at the end of a cell's title ("she → saw: 0.25"; −∞ for masked cells)."""
    shown = title.rsplit(": ", 1)[1]
    return -math.inf if shown in ("−∞", "-inf") else float(shown)


def check_cells(root: ET.Element, rows: tuple[str, ...], cols: tuple[str, ...], expected):
    pairs = cells(root)
    assert len(pairs) == len(rows) * len(cols)
    for k, (rect, title) in enumerate(pairs):
        i, j = divmod(k, len(cols))
        assert title.startswith(rows[i]), title
        assert cols[j] in title.split(": ")[0], title
        assert float(rect.get("width")) > 0 and float(rect.get("height")) > 0
        value = title_value(title)
        if math.isinf(expected[i, j]):
            assert value == expected[i, j], title
            assert rect.get("fill") == "url(#hatch)", title
        else:
            assert value == pytest.approx(expected[i, j], abs=1e-12), title
            assert rect.get("fill", "").startswith("#"), title
            # The exact value: the printed number reads back to the same float.
            assert title.rsplit(": ", 1)[1] == repr(value)
    return pairs


@pytest.fixture
def window(worked_window):
    return worked_window


def head_reference(head: int) -> dict[str, np.ndarray]:
    Wq, Wk, Wv = reference.W_Q[head], reference.W_K[head], reference.W_V[head]
    Q, K, V = reference.X @ Wq, reference.X @ Wk, reference.X @ Wv
    scaled, weights, output = reference.head(reference.X, Wq, Wk, Wv)
    masked = np.where(np.triu(np.ones((4, 4), dtype=bool), k=1), -np.inf, scaled)
    return {
        "Q": Q,
        "K": K,
        "V": V,
        "scores": Q @ K.T,
        "scaled": scaled,
        "masked": masked,
        "weights": weights,
        "output": output,
    }


@pytest.mark.parametrize("scale", [1.0, 2.0, 0.5, 1.5, 3.0])
def test_png_is_the_svg_size_times_the_scale(window, tmp_path, scale):
    spec = window.pipeline.views["weights"].spec
    write_image(spec, tmp_path / "w.svg")
    write_image(spec, tmp_path / "w.png", scale)
    weights = head_reference(0)["weights"]
    assert_png_matches_svg(tmp_path / "w.png", tmp_path / "w.svg", scale, spec, weights)


@pytest.mark.parametrize("fill", ["white", "black"])
def test_a_blank_or_other_head_png_of_the_right_size_fails(window, tmp_path, fill):
    spec = window.pipeline.views["weights"].spec
    write_image(spec, tmp_path / "w.svg")
    write_image(spec, tmp_path / "w.png", 2.0)
    weights = head_reference(0)["weights"]
    assert_png_matches_svg(tmp_path / "w.png", tmp_path / "w.svg", 2.0, spec, weights)
    blank = QImage(QImage(str(tmp_path / "w.png")).size(), QImage.Format.Format_RGB888)
    blank.fill(QColor(fill))
    assert blank.save(str(tmp_path / "blank.png"))
    with pytest.raises(AssertionError):
        assert_png_matches_svg(tmp_path / "blank.png", tmp_path / "w.svg", 2.0, spec, weights)
    # Head 2's weights are not head 1's: the right size and a real heatmap are not enough.
    with pytest.raises(AssertionError):
        other = head_reference(1)["weights"]
        assert_png_matches_svg(tmp_path / "w.png", tmp_path / "w.svg", 2.0, spec, other)


def test_svg_holds_a_labelled_rectangle_for_every_cell(window, tmp_path):
    expected = head_reference(0)
    views = window.pipeline.views
    for name in ("weights", "masked", "Q", "output"):
        path = tmp_path / f"{name}.svg"
        write_image(views[name].spec, path)
        root = svg_root(path)
        square = name in ("weights", "masked")
        cols = TOKENS if square else ("1", "2")
        check_cells(root, TOKENS, cols, expected[name])
        labels = texts(root)
        for token in TOKENS:
            assert token in labels, (name, token)
        if not square:
            assert "1" in labels and "2" in labels
        # The title names what the figure shows.
        assert any("head 1" in t for t in labels), labels


def test_svg_values_follow_an_edit(window, tmp_path):
    doc = window.doc
    x = window.inputs.grid
    assert x.model().setData(x.model().index(0, 0), "1.5")
    X = reference.X.copy()
    X[0, 0] = 1.5
    path = tmp_path / "q.svg"
    write_image(window.pipeline.views["Q"].spec, path)
    check_cells(svg_root(path), TOKENS, ("1", "2"), X @ reference.W_Q[0])
    doc.undo_stack.undo()
    write_image(window.pipeline.views["Q"].spec, path)
    check_cells(svg_root(path), TOKENS, ("1", "2"), reference.X @ reference.W_Q[0])


def test_export_all_writes_every_view_of_the_head_as_png_and_svg(window, tmp_path):
    for head in (0, 1):
        window.view_state.set_head(head)
        folder = tmp_path / f"head{head + 1}"
        folder.mkdir()
        written = window.files.export_all_to(folder)
        window.files.image_export.wait()
        names = {p.name for p in written}
        assert names == {
            f"head{head + 1}-{view}.{suffix}" for view in HEAD_MATRICES for suffix in ("png", "svg")
        }
        assert sorted(p.name for p in folder.iterdir()) == sorted(names)
        expected = head_reference(head)
        for view in HEAD_MATRICES:
            svg = folder / f"head{head + 1}-{view}.svg"
            png = folder / f"head{head + 1}-{view}.png"
            spec = window.pipeline.views[view].spec
            assert_png_matches_svg(png, svg, 2.0, spec, expected[view])
            square = view in ("scores", "scaled", "masked", "weights")
            cols = TOKENS if square else ("1", "2")
            check_cells(svg_root(svg), TOKENS, cols, expected[view])


def test_export_heatmap_through_its_dialogs(window, tmp_path, monkeypatch):
    window.last_heatmap = window.pipeline.views["scaled"]
    monkeypatch.setattr(
        QFileDialog, "getSaveFileName", lambda *a, **k: (str(tmp_path / "fig"), "PNG image (*.png)")
    )
    monkeypatch.setattr(QInputDialog, "getDouble", lambda *a, **k: (1.5, True))
    window.files.export_heatmap()
    window.files.image_export.wait()
    write_image(window.pipeline.views["scaled"].spec, tmp_path / "same.svg")
    scaled = window.pipeline.views["scaled"].spec
    expected = head_reference(0)["scaled"]
    assert_png_matches_svg(tmp_path / "fig.png", tmp_path / "same.svg", 1.5, scaled, expected)

    monkeypatch.setattr(
        QFileDialog,
        "getSaveFileName",
        lambda *a, **k: (str(tmp_path / "vector"), "SVG vector image (*.svg)"),
    )
    window.files.export_heatmap()
    window.files.image_export.wait()
    check_cells(svg_root(tmp_path / "vector.svg"), TOKENS, TOKENS, head_reference(0)["scaled"])


def test_refused_exports_say_why_and_write_nothing(window, tmp_path, warnings_shown):
    spec = window.pipeline.views["weights"].spec
    with pytest.raises(ValueError, match=r"\.png or \.svg"):
        write_image(spec, tmp_path / "w.jpg")
    with pytest.raises(ValueError, match="too large"):
        write_image(spec, tmp_path / "huge.png", 1000.0)
    assert not list(tmp_path.iterdir())
    # Into a folder that does not exist: a message, no traceback, nothing written.
    window.files.export_all_to(tmp_path / "missing")
    window.files.image_export.wait()
    assert len(warnings_shown) == 1
    assert warnings_shown[0][0] == "Cannot export the image"
    assert "missing" in warnings_shown[0][1]
    assert not (tmp_path / "missing").exists()


def test_a_failed_export_names_the_image(window, tmp_path, warnings_shown):
    window.files.export_all_to(tmp_path / "missing")
    window.files.image_export.wait()
    message = warnings_shown[0][1]
    assert "head1-Q.png" in message and ".tmp" not in message, message


def test_window_exports_run_off_the_ui_thread_with_progress(window, tmp_path, monkeypatch, qtbot):
    import threading

    from attnviz.ui import image_export as export

    threads, messages = set(), []
    original = export.write_image

    def spy(*args, **kwargs):
        threads.add(threading.current_thread().name)
        return original(*args, **kwargs)

    monkeypatch.setattr(export, "write_image", spy)
    window.statusBar().messageChanged.connect(messages.append)
    written = window.files.export_all_to(tmp_path)
    window.files.image_export.wait()
    assert all(p.exists() for p in written) and len(written) == 2 * len(HEAD_MATRICES)
    assert threads and threading.main_thread().name not in threads
    assert any(m == f"Exporting images: 3 of {len(written)}…" for m in messages)
    assert messages[-1] == f"Exported {len(written)} images to {tmp_path}"
    assert not window.files.stop_export.isEnabled()  # Esc is a cell editor's again


def test_escape_stops_an_export(window, tmp_path, monkeypatch):
    from attnviz.ui import image_export as export

    original = export.write_image

    def slow_first(*args, **kwargs):
        window.files.image_export.cancel()  # as Esc does, while the first image is written
        return original(*args, **kwargs)

    monkeypatch.setattr(export, "write_image", slow_first)
    window.files.export_all_to(tmp_path)
    assert window.files.stop_export.isEnabled()
    window.files.image_export.wait()
    assert len(list(tmp_path.iterdir())) == 1  # the image being written is finished
    assert window.statusBar().currentMessage() == "Export stopped after 1 of the images"
