"""Large heatmaps as PNG: the cells pixel for pixel; checked writes; exports off the UI thread.

Expected colours come from ``colors.rgb`` (the documented colour map, itself checked
against the colour stops in tests/test_labels_and_exports.py) and the shading rule
written out here.
"""

from __future__ import annotations

import threading
import xml.etree.ElementTree as ET

import numpy as np
import pytest
from heatmap_pixels import assert_cells_show, image_array, shaded
from PySide6.QtGui import QImage

import attnviz.ui.image_export as image_export
import attnviz.ui.images as export
from attnviz.core.figures import colors
from attnviz.core.figures.figure import (
    HeatmapSpec,
    layout,
    make_spec,
    spec_for,
    svg_size,
    to_svg,
)
from attnviz.core.maths.forward import compute
from attnviz.core.maths.positions import future_mask
from attnviz.core.maths.results import HEAD_MATRICES
from attnviz.ui.image_export import ImageExport
from attnviz.ui.images import write_image

SVG = "{http://www.w3.org/2000/svg}"


def big_spec(n: int) -> HeatmapSpec:
    """Weights-like values with a causal mask: −∞ above the diagonal, leaks on a band."""
    rng = np.random.default_rng(5)
    values = rng.uniform(0, 1, (n, n))
    future = future_mask(n)
    leaked = future & (np.arange(n)[None, :] == np.arange(n)[:, None] + 1)  # j = i + 1
    values[future & ~leaked] = 0.0
    tokens = tuple(f"t{i + 1}" for i in range(n))
    return HeatmapSpec(
        "big", values, tokens, tokens, "query", "key", "sequential", (0.0, 1.0), "", future, leaked
    )


def test_a_1024_token_png_shows_every_cell_unsmoothed(qapp, tmp_path):
    spec = big_spec(1024)  # cells of one unit, as at 2048 tokens
    path = tmp_path / "w.png"
    write_image(spec, path, 2.0)
    width, height = svg_size(to_svg(spec))
    pixels = image_array(path)
    assert pixels.shape == (round(height * 2), round(width * 2), 3)
    L = layout(spec)
    n = spec.values.shape[0]
    centres = (np.arange(n) + 0.5) * L.cell
    xs = np.floor((L.left + centres) * 2).astype(int)
    ys = np.floor((L.top + centres) * 2).astype(int)
    got = pixels[ys][:, xs]
    expected = colors.rgb(spec.values, "sequential", (0.0, 1.0)).copy()
    expected[spec.masked] = shaded(expected[spec.masked])
    expected[spec.leaked] = [int(colors.LEAK[k : k + 2], 16) for k in (1, 3, 5)]
    # Exact colours at every cell's centre: with smoothing, a 2-pixel cell's centre pixel
    # would blend in a quarter of its neighbour.
    np.testing.assert_array_equal(got, expected)


def test_window_exports_of_a_large_scenario_hold_one_image_each(qapp, tmp_path, make_window):
    from attnviz.core.presets import make_preset

    window = make_window()
    window.doc.reset(make_preset("gpt2-small", 128, 0), None)  # 128² scores: images
    window.compute.wait()
    written = window.files.export_all_to(tmp_path)
    window.files.image_export.wait()
    assert len(written) == 2 * len(HEAD_MATRICES)
    expected = compute(window.doc.scenario)
    for view in HEAD_MATRICES:
        svg = (tmp_path / f"head1-{view}.svg").read_text("utf-8")
        root = ET.fromstring(svg)
        assert len(list(root.iter(f"{SVG}image"))) == 1, view
        assert not list(root.iter(f"{SVG}title")), view
        width, height = svg_size(svg)
        png = image_array(tmp_path / f"head1-{view}.png")
        assert png.shape[:2] == (round(height * 2), round(width * 2)), view
        # Every cell in the colour of its value (here the float64 reference engine's).
        assert_cells_show(png, spec_for(expected, view, 0), 2.0)


# Every write is checked. -----------------------------------------------------------------


def test_labels_xml_cannot_hold_are_an_error_not_a_file(qapp, tmp_path):
    spec = make_spec("t", np.eye(3), ("a", "b\x1b[31m", "c"))  # past the scenario's check
    for name in ("w.svg", "w.png"):
        with pytest.raises(ValueError, match="not well-formed"):
            write_image(spec, tmp_path / name)
    with pytest.raises(ValueError, match="not well-formed"):
        export.save_svg('<svg xmlns="http://www.w3.org/2000/svg"><text>\x07', tmp_path / "c.png")
    assert not list(tmp_path.iterdir())


def test_a_png_of_the_wrong_size_is_an_error_not_a_file(qapp, tmp_path, monkeypatch):
    def one_pixel(*_):
        image = QImage(1, 1, QImage.Format.Format_RGB888)
        image.fill(0)
        return image

    monkeypatch.setattr(export, "_draw", one_pixel)
    spec = make_spec("t", np.eye(3), ("a", "b", "c"))
    with pytest.raises(ValueError, match="came out 1×1"):
        write_image(spec, tmp_path / "w.png")
    assert not list(tmp_path.iterdir())


# The window's exports, off the UI thread. ------------------------------------------------


def run_export(jobs) -> tuple[list, list, set[str]]:
    """Run jobs through ImageExport; (progress, finished, threads that wrote)."""
    threads: set[str] = set()
    real = image_export.write_image

    def recording(*args):
        threads.add(threading.current_thread().name)
        real(*args)

    worker = ImageExport()
    progress: list = []
    finished: list = []
    worker.progress.connect(lambda done, total: progress.append((done, total)))
    worker.finished.connect(lambda written, error: finished.append((written, error)))
    image_export.write_image = recording
    try:
        worker.start(jobs)
        worker.wait()
    finally:
        image_export.write_image = real
        worker.close()
    return progress, finished, threads


def test_image_export_writes_on_a_worker_thread_with_progress(qapp, tmp_path):
    spec = make_spec("t", np.arange(6.0).reshape(2, 3), ("a", "b"))
    paths = [tmp_path / "a.svg", tmp_path / "a.png", tmp_path / "b.png"]
    progress, finished, threads = run_export([(spec, p, 1.5) for p in paths])
    assert progress == [(1, 3), (2, 3), (3, 3)]
    assert finished == [(paths, "")]
    assert threads and threading.current_thread().name not in threads
    width, height = svg_size(paths[0].read_text("utf-8"))
    assert image_array(paths[1]).shape == (round(height * 1.5), round(width * 1.5), 3)


def test_image_export_stops_at_the_first_failure_and_names_it(qapp, tmp_path):
    spec = make_spec("t", np.eye(2), ("a", "b"))
    good, bad = tmp_path / "a.svg", tmp_path / "missing" / "b.png"
    progress, finished, _ = run_export([(spec, good, 2.0), (spec, bad, 2.0), (spec, good, 2.0)])
    assert progress == [(1, 3)]
    ((written, error),) = finished
    assert written == [good] and str(bad) in error and ".tmp" not in error
    assert not (tmp_path / "missing").exists()


@pytest.mark.parametrize("scale", [0.5, 1.5, 3.0])
def test_a_png_drawn_from_the_array_is_the_png_of_its_svg(qapp, tmp_path, scale):
    # PNGs of large figures skip the SVG's embedded image and draw the array directly:
    # the result must be what rendering the whole SVG gives (axes, labels, bar, cells),
    # but for pixels on a cell's edge, which the two may give to either neighbour.
    spec = big_spec(300)
    fast, slow = tmp_path / "fast.png", tmp_path / "slow.png"
    write_image(spec, fast, scale)
    export.write_svg_as_png(to_svg(spec), slow, scale)
    a, b = image_array(fast), image_array(slow)
    assert a.shape == b.shape
    L = layout(spec)

    def on_an_edge(pixel: np.ndarray, origin: float) -> np.ndarray:
        where = ((pixel + 0.5) / scale - origin) / L.cell  # in cells
        return np.abs(where - np.rint(where)) * L.cell * scale <= 1.0  # within a pixel

    ys, xs = np.nonzero((a != b).any(axis=2))
    assert (on_an_edge(xs, L.left) | on_an_edge(ys, L.top)).all()
    centres = (np.arange(300) + 0.5) * L.cell
    cx, cy = (np.floor((o + centres) * scale).astype(int) for o in (L.left, L.top))
    if scale >= 1:  # below one pixel a cell, a centre pixel may show a neighbour
        np.testing.assert_array_equal(a[cy][:, cx], b[cy][:, cx])
