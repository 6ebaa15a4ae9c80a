"""Benchmark line charts as SVG: structure, log scales, ticks, escaping, bounds, no NumPy."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from itertools import pairwise

import pytest

from attnviz.core.chart import Chart, Series, n_squared_guide, to_svg

NS = "{http://www.w3.org/2000/svg}"
POW2 = tuple(2.0**k for k in range(8, 18))  # 256 … 128k


def parse(svg: str) -> ET.Element:
    return ET.fromstring(svg)


def by_id(root: ET.Element, ident: str) -> ET.Element:
    found = root.find(f".//*[@id='{ident}']")
    assert found is not None, ident
    return found


def series_groups(root: ET.Element) -> list[ET.Element]:
    return [g for g in root.iter(f"{NS}g") if g.get("class") == "series"]


def points(polyline: ET.Element) -> list[tuple[float, float]]:
    return [tuple(map(float, p.split(","))) for p in polyline.get("points").split()]


def texts(group: ET.Element) -> list[str]:
    return [t.text for t in group.iter(f"{NS}text")]


def timing_chart(**kw) -> Chart:
    ns = POW2
    return Chart(
        "time vs n",
        "sequence length n",
        "time (ms)",
        (
            Series("naive", ns, tuple(1e-3 * n**2 / 65536 for n in ns)),
            Series("sdpa", ns, tuple(1e-3 * n / 256 for n in ns)),
            n_squared_guide(ns, 256, 1e-3),
        ),
        **kw,
    )


def test_svg_parses_with_one_polyline_per_series():
    root = parse(to_svg(timing_chart()))
    assert root.tag == f"{NS}svg"
    assert (root.get("width"), root.get("height")) == ("640", "420")
    groups = series_groups(root)
    assert len(groups) == 3
    for g in groups:
        lines = g.findall(f"{NS}polyline")
        assert len(lines) == 1
        assert len(points(lines[0])) == len(POW2)
        assert len(g.findall(f"{NS}circle")) == len(POW2)


def test_gaps_split_a_series():
    nan, inf = math.nan, math.inf
    ys = (1.0, 2.0, 0.0, 3.0, 4.0, 5.0, nan, -1.0, 6.0, inf, None)
    xs = tuple(float(i + 1) for i in range(len(ys)))
    root = parse(to_svg(Chart("t", "x", "y", (Series("s", xs, ys),))))
    (g,) = series_groups(root)
    assert [len(points(p)) for p in g.findall(f"{NS}polyline")] == [2, 3, 1]
    assert len(g.findall(f"{NS}circle")) == 6
    # on a linear y axis only non-finite values are gaps
    root = parse(to_svg(Chart("t", "x", "y", (Series("s", xs, ys),), log_y=False)))
    (g,) = series_groups(root)
    assert [len(points(p)) for p in g.findall(f"{NS}polyline")] == [6, 2]
    # a point at x <= 0 is a gap on a log x axis
    root = parse(to_svg(Chart("t", "x", "y", (Series("s", (-1, 0, 1, 2), (1, 2, 3, 4)),))))
    (g,) = series_groups(root)
    assert [len(points(p)) for p in g.findall(f"{NS}polyline")] == [2]


def test_log_scale_maps_equal_ratios_to_equal_distances():
    ns = POW2
    doubling = Series("x2", ns, tuple(0.5 * n for n in ns))
    offset = Series("other", (300.0, 600.0, 3000.0, 6000.0), (1.0, 2.0, 7.0, 14.0))
    root = parse(to_svg(Chart("t", "x", "y", (doubling, offset))))
    a, b = (points(g.find(f"{NS}polyline")) for g in series_groups(root))
    dx = [x1 - x0 for (x0, _), (x1, _) in pairwise(a)]
    dy = [y1 - y0 for (_, y0), (_, y1) in pairwise(a)]
    assert max(dx) - min(dx) < 0.02 and dx[0] > 20
    assert max(dy) - min(dy) < 0.02 and dy[0] < -5  # up the page as y grows
    # a doubling is the same distance anywhere on the axis, in both directions
    assert b[1][0] - b[0][0] == pytest.approx(dx[0], abs=0.02)
    assert b[3][0] - b[2][0] == pytest.approx(dx[0], abs=0.02)
    assert b[1][1] - b[0][1] == pytest.approx(b[3][1] - b[2][1], abs=0.02)
    # and a factor of ten in x is log2(10) doublings
    assert b[2][0] - b[0][0] == pytest.approx(dx[0] * math.log2(10), abs=0.05)


def test_linear_scale_maps_equal_steps_to_equal_distances():
    s = Series("lin", (0.0, 1.0, 2.0, 5.0), (-3.0, -1.0, 1.0, 7.0))
    root = parse(to_svg(Chart("t", "x", "y", (s,), log_x=False, log_y=False)))
    p = points(series_groups(root)[0].find(f"{NS}polyline"))
    step_x, step_y = p[1][0] - p[0][0], p[1][1] - p[0][1]
    assert p[2][0] - p[1][0] == pytest.approx(step_x, abs=0.02)
    assert p[3][0] - p[0][0] == pytest.approx(5 * step_x, abs=0.05)
    assert p[3][1] - p[0][1] == pytest.approx(5 * step_y, abs=0.05)
    assert "0" in texts(by_id(root, "y-ticks")) and "−2" in texts(by_id(root, "y-ticks"))


def test_large_linear_values_are_labelled_with_k_m_g():
    s = Series("s", (0.0, 5e6), (-3e7, 9e8))
    root = parse(to_svg(Chart("t", "x", "y", (s,), log_x=False, log_y=False)))
    assert texts(by_id(root, "x-ticks")) == ["0", "1M", "2M", "3M", "4M", "5M"]
    assert texts(by_id(root, "y-ticks")) == ["0", "200M", "400M", "600M", "800M"]


def test_power_of_two_x_ticks_are_labelled_in_k():
    root = parse(to_svg(timing_chart()))
    labels = texts(by_id(root, "x-ticks"))
    assert labels == ["256", "512", "1k", "2k", "4k", "8k", "16k", "32k", "64k", "128k"]
    # y: powers of ten labelled, 2 and 5 times them as unlabelled minor ticks
    ylabels = texts(by_id(root, "y-ticks"))
    assert {"0.001", "0.01", "0.1", "1"} <= set(ylabels)
    assert len(by_id(root, "y-ticks").findall(f"{NS}line")) > len(ylabels)


def test_other_x_values_get_decade_ticks():
    s = Series("s", (100.0, 300.0, 1000.0, 5000.0), (1.0, 2.0, 3.0, 4.0))
    root = parse(to_svg(Chart("t", "x", "y", (s,))))
    assert texts(by_id(root, "x-ticks")) == ["100", "1000"]
    # less than a decade on y: the 1-2-5 values are labelled
    assert texts(by_id(root, "y-ticks")) == ["1", "2"]


def label_boxes(group: ET.Element, vertical: bool) -> list[tuple[float, float]]:
    """Extent of each tick label along its axis (an upper bound on the drawn width)."""
    out = []
    for t in group.iter(f"{NS}text"):
        if vertical:
            y = float(t.get("y"))
            out.append((y - 11, y))
        else:
            x, half = float(t.get("x")), len(t.text) * 11 * 0.6 / 2
            out.append((x - half, x + half))
    return sorted(out)


@pytest.mark.parametrize("size", [(640, 420), (260, 200), (180, 150)])
def test_tick_labels_are_thinned_so_they_never_overlap(size):
    ns = tuple(2.0**k for k in range(4, 25))
    chart = Chart("t", "n", "ms", (Series("s", ns, tuple(1.4**k for k in range(4, 25))),))
    root = parse(to_svg(chart, *size))
    xbox = label_boxes(by_id(root, "x-ticks"), vertical=False)
    ybox = label_boxes(by_id(root, "y-ticks"), vertical=True)
    for boxes in (xbox, ybox):
        assert len(boxes) >= 2
        assert all(a[1] <= b[0] for a, b in pairwise(boxes))
    assert set(texts(by_id(root, "x-ticks"))) <= {
        "16", "32", "64", "128", "256", "512", *(f"{k}k" for k in (1, 2, 4, 8, 16, 32, 64)),
        *(f"{k}k" for k in (128, 256, 512)), *(f"{k}M" for k in (1, 2, 4, 8, 16)),
    }  # fmt: skip
    if size[0] < 640:
        assert len(xbox) < 21


def test_labels_and_titles_present_and_escaped():
    nasty = 'a<&>b "q"'
    chart = Chart(
        "title <&>",
        "x <n>",
        "y & z",
        (Series(nasty, (1.0, 2.0), (1.0, 4.0)), n_squared_guide((1.0, 2.0), 1.0, 1.0)),
        hlines=(("cap <&>", 3.0),),
    )
    svg = to_svg(chart)
    assert "a&lt;&amp;&gt;b" in svg and "<&>" not in svg
    root = parse(svg)
    legend = texts(by_id(root, "legend"))
    assert legend == [nasty, "n² guide"]
    assert texts(by_id(root, "axis-titles")) == ["x <n>", "y & z"]
    assert "title <&>" in texts(root)
    assert texts(by_id(root, "hlines")) == ["cap <&>"]
    assert [g.find(f"{NS}title").text for g in series_groups(root)] == [nasty, "n² guide"]


def test_hlines_are_dashed_across_the_plot_with_the_label_at_the_right():
    root = parse(to_svg(timing_chart(hlines=(("GEMM ceiling", 5.0), ("never", -1.0))), 640, 420))
    frame = root.find(f"{NS}rect[@fill='none']")
    left = float(frame.get("x"))
    right = left + float(frame.get("width"))
    group = by_id(root, "hlines")
    (line,) = group.findall(f"{NS}line")  # -1 has no place on a log axis
    assert line.get("stroke-dasharray")
    assert (float(line.get("x1")), float(line.get("x2"))) == (left, right)
    (label,) = group.findall(f"{NS}text")
    assert label.text == "GEMM ceiling" and right - 10 < float(label.get("x")) <= right
    assert abs(float(label.get("y")) - float(line.get("y1"))) < 16
    # the line is within the y range even though every data point is below it
    top, bottom = float(frame.get("y")), float(frame.get("y")) + float(frame.get("height"))
    assert top < float(line.get("y1")) < bottom


def test_dashed_series_and_distinct_colours():
    root = parse(to_svg(timing_chart()))
    lines = [g.find(f"{NS}polyline") for g in series_groups(root)]
    assert [bool(p.get("stroke-dasharray")) for p in lines] == [False, False, True]
    assert len({p.get("stroke") for p in lines}) == 3


def legend_box(root: ET.Element) -> tuple[float, float, float, float]:
    rect = by_id(root, "legend").find(f"{NS}rect")
    x, y = float(rect.get("x")), float(rect.get("y"))
    return x, y, x + float(rect.get("width")), y + float(rect.get("height"))


def frame_box(root: ET.Element) -> tuple[float, float, float, float]:
    rect = root.find(f"{NS}rect[@fill='none']")
    x, y = float(rect.get("x")), float(rect.get("y"))
    return x, y, x + float(rect.get("width")), y + float(rect.get("height"))


def test_legend_sits_top_left_unless_that_covers_data():
    root = parse(to_svg(timing_chart()))
    left, top, right, bottom = frame_box(root)
    x0, y0, x1, y1 = legend_box(root)
    assert (x0 - left, y0 - top) == (8, 8)
    # data falling from the top-left corner: the legend moves off it
    ns = POW2
    falling = Chart("t", "n", "ms", (Series("falling", ns, tuple(1e6 / n for n in ns)),))
    root = parse(to_svg(falling))
    x0, y0, x1, y1 = legend_box(root)
    assert left < x0 < x1 < right and top < y0 < y1 < bottom
    markers = [(float(c.get("cx")), float(c.get("cy"))) for c in root.iter(f"{NS}circle")]
    data = markers[: len(ns)]  # the legend's own marker comes last
    assert not [(x, y) for x, y in data if x0 <= x <= x1 and y0 <= y <= y1]


def test_n_squared_guide():
    g = n_squared_guide([256, 512, 1024], anchor_x=512, anchor_y=2.0)
    assert g.label == "n² guide" and g.dashed
    assert g.xs == (256.0, 512.0, 1024.0)
    assert g.ys == pytest.approx((0.5, 2.0, 8.0))
    assert n_squared_guide((1, 3), 1, 1, label="quadratic").ys == (1.0, 9.0)
    with pytest.raises(ValueError, match="anchor_x"):
        n_squared_guide((1, 2), 0, 1)


def test_series_lengths_must_match():
    with pytest.raises(ValueError, match=r"'s'.*2 x values but 1 y values"):
        Series("s", (1.0, 2.0), (1.0,))


@pytest.mark.parametrize(
    "series",
    [(), (Series("s", (1.0, 2.0), (0.0, -1.0)),), (Series("s", (), ()),)],
)
def test_empty_chart_is_valid_and_says_no_data(series):
    root = parse(to_svg(Chart("empty", "n", "ms", series, hlines=(("cap", 1.0),))))
    assert "no data" in texts(root)
    assert not root.findall(f".//{NS}polyline")
    assert_inside(root, 640, 420)


@pytest.mark.parametrize(
    "chart",
    [
        timing_chart(hlines=(("ceiling", 100.0),)),
        Chart("one point", "n", "ms", (Series("s", (512.0,), (3.0,)),)),
        Chart("flat", "n", "ms", (Series("s", (1.0, 2.0), (5.0, 5.0)),), log_x=False, log_y=False),
        Chart("w" * 200, "x" * 200, "y" * 200, (Series("l" * 200, (1.0, 1e9), (1e-9, 1e9)),)),
        Chart(
            "many", "n", "ms", tuple(Series(f"s{i}", (1.0, 2.0), (i + 1, i + 2)) for i in range(40))
        ),
        Chart("big", "n", "ms", (Series("s", (0.0, 5e6), (-3e7, 9e8)),), log_x=False, log_y=False),
    ],
)
@pytest.mark.parametrize("size", [(640, 420), (320, 240)])
def test_nothing_is_drawn_outside_the_page(chart, size):
    assert_inside(parse(to_svg(chart, *size)), *size)


def assert_inside(root: ET.Element, width: int, height: int) -> None:
    """Every coordinate, and the estimated extent of every text, lies on the page."""
    xs: list[float] = []
    ys: list[float] = []

    def walk(el: ET.Element, anchor: str, font: float) -> None:
        anchor = el.get("text-anchor", anchor)
        font = float(el.get("font-size", font))
        xs.extend(float(el.get(a)) for a in ("x", "x1", "x2", "cx") if el.get(a))
        ys.extend(float(el.get(a)) for a in ("y", "y1", "y2", "cy") if el.get(a))
        if el.tag == f"{NS}rect" and el.get("x"):
            xs.append(float(el.get("x")) + float(el.get("width")))
            ys.append(float(el.get("y")) + float(el.get("height")))
        for x, y in points(el) if el.get("points") else ():
            xs.append(x)
            ys.append(y)
        if el.tag == f"{NS}text":
            w = len(el.text or "") * font * 0.6
            lo = {"start": 0.0, "middle": -w / 2, "end": -w}[anchor]
            if el.get("transform"):  # translate(x,y) rotate(-90): the text runs up the page
                found = re.match(r"translate\(([-\d.]+),([-\d.]+)\)", el.get("transform"))
                x, y = map(float, found.groups())
                xs.extend([x - font, x])
                ys.extend([y + lo, y + lo + w])
            else:
                x, y = float(el.get("x")), float(el.get("y"))
                xs.extend([x + lo, x + lo + w])
                ys.append(y - font)
        for child in el:
            walk(child, anchor, font)

    walk(root, "start", 11.0)
    assert xs and ys
    assert min(xs) >= 0 and max(xs) <= width
    assert min(ys) >= 0 and max(ys) <= height


def test_module_imports_no_numpy():
    code = """
    import importlib.abc, json, sys

    BLOCKED = {"numpy", "PySide6", "pyqtgraph", "shiboken6", "torch"}

    class Blocker(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ImportError(f"{name} is blocked in this test")
            return None

    sys.meta_path.insert(0, Blocker())
    from attnviz.core.chart import Chart, Series, n_squared_guide, to_svg
    ns = (256.0, 512.0, 1024.0)
    svg = to_svg(Chart("t", "n", "ms", (Series("s", ns, (1.0, 3.0, 9.0)),
                                         n_squared_guide(ns, 256, 1.0))))
    loaded = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
    print(json.dumps({"loaded": loaded, "svg": svg.startswith("<svg")}))
    """
    p = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout.splitlines()[-1]) == {"loaded": [], "svg": True}
