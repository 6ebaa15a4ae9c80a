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

from attnviz.bench.plots import report_charts
from attnviz.core.figures.chart import Chart, Series, n_squared_guide, to_svg

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
        # a marker on each measured point; none on the guide, which measures nothing
        guide = g.find(f"{NS}title").text == "n² guide"
        assert len(g.findall(f"{NS}circle")) == (0 if guide else len(POW2))


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
    # guides are drawn first, under the data
    assert [g.find(f"{NS}title").text for g in series_groups(root)] == ["n² guide", nasty]


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
    lines = {g.find(f"{NS}title").text: g.find(f"{NS}polyline") for g in series_groups(root)}
    dashed = {label: bool(p.get("stroke-dasharray")) for label, p in lines.items()}
    assert dashed == {"naive": False, "sdpa": False, "n² guide": True}
    assert len({p.get("stroke") for p in lines.values()}) == 3


def frame_box(root: ET.Element) -> tuple[float, float, float, float]:
    rect = root.find(f"{NS}rect[@fill='none']")
    x, y = float(rect.get("x")), float(rect.get("y"))
    return x, y, x + float(rect.get("width")), y + float(rect.get("height"))


Box = tuple[float, float, float, float]  # x0, y0, x1, y1


def text_box(t: ET.Element, anchor: str, font: float) -> Box:
    """A generous box around a text: 0.64 em per character, ascent and descent."""
    w = len(t.text or "") * font * 0.64
    x, y = float(t.get("x")), float(t.get("y"))
    x0 = {"start": x, "middle": x - w / 2, "end": x - w}[anchor]
    return x0, y - font, x0 + w, y + 0.25 * font


def boxes(el: ET.Element, anchor: str = "start", font: float = 11.0) -> list[Box]:
    """Boxes around what el draws: texts, lines, circles, polylines (not rotated text)."""
    anchor = el.get("text-anchor", anchor)
    font = float(el.get("font-size", font))
    out = []
    if el.tag == f"{NS}text" and not el.get("transform"):
        out.append(text_box(el, anchor, font))
    elif el.tag == f"{NS}line":
        x1, y1, x2, y2 = (float(el.get(a)) for a in ("x1", "y1", "x2", "y2"))
        out.append((min(x1, x2), min(y1, y2) - 1, max(x1, x2), max(y1, y2) + 1))
    elif el.tag == f"{NS}circle":
        x, y, r = float(el.get("cx")), float(el.get("cy")), float(el.get("r"))
        out.append((x - r, y - r, x + r, y + r))
    for child in el:
        out += boxes(child, anchor, font)
    return out


def overlap(a: Box, b: Box) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def rising_to_the_ceiling() -> Chart:
    """Throughput as a sweep draws it: rising towards the GEMM ceiling, top right."""
    ns = (256.0, 512.0, 1024.0, 2048.0, 4096.0)
    return Chart(
        "Throughput",
        "sequence length n",
        "TFLOP/s",
        (
            Series("naive", ns, (40.0, 90.0, 150.0, 210.0, 260.0)),
            Series("sdpa", ns, (60.0, 140.0, 260.0, 420.0, 560.0)),
        ),
        log_y=False,
        hlines=(("GEMM ceiling", 640.0),),
    )


@pytest.mark.parametrize("size", [(640, 420), (240, 300), (320, 240)])
@pytest.mark.parametrize("chart", [rising_to_the_ceiling(), timing_chart()], ids=["tflops", "ms"])
def test_legend_covers_no_data_line_label_or_tick_label(chart, size):
    root = parse(to_svg(chart, *size))
    legend = by_id(root, "legend")
    assert [t.text for t in legend.iter(f"{NS}text")] == [s.label for s in chart.series]
    mine = boxes(legend)
    assert mine
    # outside the plotting area, where the data, the guides and the line labels are
    frame = frame_box(root)
    assert not [b for b in mine if overlap(b, frame)]
    others = []
    for ident in ("hlines", "x-ticks", "y-ticks", "series"):
        group = root.find(f".//*[@id='{ident}']")
        others += boxes(group) if group is not None else []
    title = root.find(f"{NS}text[@font-weight='bold']")
    others.append(text_box(title, "middle", 12))
    assert not [(a, b) for a in mine for b in others if overlap(a, b)]
    assert_inside(root, *size)


def test_a_long_legend_wraps_and_is_cut_short_outside_the_plot():
    chart = Chart(
        "many", "n", "ms", tuple(Series(f"s{i}", (1.0, 2.0), (i + 1, i + 2)) for i in range(40))
    )
    root = parse(to_svg(chart, 320, 240))
    labels = texts(by_id(root, "legend"))
    assert labels[-1].startswith("… ") and labels[-1].endswith(" more")
    shown = len(labels) - 1
    assert labels[:-1] == [f"s{i}" for i in range(shown)] and labels[-1] == f"… {40 - shown} more"
    frame = frame_box(root)
    assert not [b for b in boxes(by_id(root, "legend")) if overlap(b, frame)]
    # the legend's strip (under the title, above the frame) takes at most a quarter of the page
    assert frame[1] - 32 <= 240 / 4


def stroke_of(root: ET.Element, label: str) -> str:
    (g,) = [g for g in series_groups(root) if g.find(f"{NS}title").text == label]
    return g.find(f"{NS}polyline").get("stroke")


def draw_order(root: ET.Element) -> dict[ET.Element, int]:
    return {el: k for k, el in enumerate(root.iter())}


def assert_guides_hide_no_data(root: ET.Element) -> None:
    """Every guide element comes before every data marker; no guide marker on a point."""
    order = draw_order(root)
    guides = [g for g in series_groups(root) if g.find(f"{NS}polyline").get("stroke-dasharray")]
    data = [g for g in series_groups(root) if g not in guides]
    assert guides and data
    markers = [c for g in data for c in g.iter(f"{NS}circle")]
    assert markers
    first_marker = min(order[c] for c in markers)
    assert max(order[el] for g in guides for el in g.iter()) < first_marker
    assert max(order[el] for el in by_id(root, "hlines").iter()) < first_marker
    for g in guides:
        for c in g.iter(f"{NS}circle"):
            gx, gy = float(c.get("cx")), float(c.get("cy"))
            for m in markers:
                assert math.dist((gx, gy), (float(m.get("cx")), float(m.get("cy")))) > 6


def test_guides_never_hide_data():
    # the guide is anchored on the first point of the first series, so it passes through it
    ns = (256.0, 512.0)
    chart = Chart(
        "partial",
        "n",
        "ms",
        (Series("naive", ns, (30.0, 75.0)), n_squared_guide(ns, 256.0, 30.0)),
        hlines=(("limit", 100.0),),
    )
    assert_guides_hide_no_data(parse(to_svg(chart)))


def records(*cells: tuple[str, int, float]) -> list:
    from attnviz.bench.sweep import Record

    return [
        Record(impl, n, "ok", time_ms=ms, peak_bytes=int(n * n * 40), tflops=n / ms / 100)
        for impl, n, ms in cells
    ]


def report_of(done: list, gemm: float):
    """A report of these records, measured with the default sweep settings."""
    from attnviz.bench.config import Config
    from attnviz.bench.report import Report

    return Report({"type": "cpu"}, Config().to_dict(), gemm, done)


def test_a_cancelled_sweep_keeps_every_point_visible():
    # cancelled during n = 1024: naive has three points, sdpa two
    done = records(
        ("naive", 256, 31.9), ("sdpa", 256, 7.9), ("naive", 512, 75.3), ("sdpa", 512, 23.9),
        ("naive", 1024, 253.1),
    )  # fmt: skip
    for key, chart in report_charts(report_of(done, 0.0)).items():
        root = parse(to_svg(chart, 240, 380))
        if key != "tflops":
            assert_guides_hide_no_data(root)
        # every measured point has a marker, none covered by a later one of another series
        markers = [c for g in series_groups(root) for c in g.iter(f"{NS}circle")]
        assert len(markers) == len(done)


def tick_value(label: str) -> float:
    units = {"k": 1e3, "M": 1e6, "G": 1e9}
    scale = units.get(label[-1], 1.0)
    return float(label.rstrip("kMG").replace("−", "-")) * scale


@pytest.mark.parametrize(
    "ys",
    [
        (0.0063, 0.0107, 0.0127, 0.0256, 0.0338),  # a CPU sweep: far above 0
        (0.5, 120.0, 300.0),  # padding below the lowest value would cross 0
        (0.0, 0.0, 0.0),  # nothing measurable
    ],
)
def test_a_linear_axis_of_non_negative_values_starts_at_zero(ys):
    xs = tuple(256.0 * 2**k for k in range(len(ys)))
    chart = Chart("Throughput", "n", "TFLOP/s", (Series("s", xs, ys),), log_y=False)
    root = parse(to_svg(chart))
    bottom = frame_box(root)[3]
    ticks = by_id(root, "y-ticks")
    values = {tick_value(t.text): float(t.get("y")) for t in ticks.iter(f"{NS}text")}
    assert min(values) == 0 and all(v >= 0 for v in values)
    # the "0" label is centred on the bottom of the frame: the axis starts there
    assert values[0] - 0.35 * 11 == pytest.approx(bottom, abs=0.6)
    # the same on a linear x axis
    root = parse(to_svg(Chart("t", "x", "y", (Series("s", (3.0, 5.0, 9.0), (1.0, 2.0, 3.0)),),
                              log_x=False, log_y=False)))  # fmt: skip
    left = frame_box(root)[0]
    zero = [t for t in by_id(root, "x-ticks").iter(f"{NS}text") if t.text == "0"]
    assert len(zero) == 1 and float(zero[0].get("x")) == pytest.approx(left, abs=0.6)


def test_colours_are_fixed_by_name_and_kind():
    full = records(
        ("naive", 256, 30.0), ("sdpa", 256, 8.0), ("flash", 256, 5.0),
        ("naive", 512, 70.0), ("sdpa", 512, 20.0), ("flash", 512, 12.0),
    )  # fmt: skip
    runs = {
        "naive, sdpa, flash": full,
        "sdpa alone": [r for r in full if r.impl == "sdpa"],
        "flash and sdpa": [r for r in full if r.impl != "naive"][::-1],  # another order
        "naive alone": [r for r in full if r.impl == "naive"],
    }
    seen: dict[str, set[str]] = {}
    for run in runs.values():
        for key, chart in report_charts(report_of(run, 300.0)).items():
            root = parse(to_svg(chart))
            strokes = {g.find(f"{NS}title").text: stroke_of(root, g.find(f"{NS}title").text)
                       for g in series_groups(root)}  # fmt: skip
            assert len(set(strokes.values())) == len(strokes), (key, strokes)
            # the legend shows each series in its own colour
            legend = by_id(root, "legend")
            swatches = [ln.get("stroke") for ln in legend.iter(f"{NS}line")]
            assert swatches == [strokes[s.label] for s in chart.series]
            for label, stroke in strokes.items():
                seen.setdefault(label, set()).add(stroke)
    assert {label: len(colours) for label, colours in seen.items()} == {
        "naive": 1, "sdpa": 1, "flash": 1, "n² guide": 1,
    }  # fmt: skip


def test_a_guide_keeps_its_colour_whatever_the_data_series():
    ns = (1.0, 2.0, 4.0)
    guides = set()
    for count in (0, 1, 2, 5):
        data = tuple(Series(f"s{i}", ns, (i + 1.0, i + 2.0, i + 3.0)) for i in range(count))
        root = parse(to_svg(Chart("t", "n", "y", (*data, n_squared_guide(ns, 1.0, 1.0)))))
        guides.add(stroke_of(root, "n² guide"))
    assert len(guides) == 1
    # and a colour given with a series is the one drawn
    root = parse(to_svg(Chart("t", "n", "y", (Series("mine", ns, ns, color="#123456"),))))
    assert stroke_of(root, "mine") == "#123456"


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
    from attnviz.core.figures.chart import Chart, Series, n_squared_guide, to_svg
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


@pytest.mark.parametrize("size", [(240, 380), (200, 160)])
def test_a_line_label_is_whole_in_a_narrow_plot(size):
    root = parse(to_svg(rising_to_the_ceiling(), *size))
    (label,) = by_id(root, "hlines").iter(f"{NS}text")
    assert label.text == "GEMM ceiling"
    left, _, right, _ = frame_box(root)
    x0, _, x1, _ = text_box(label, "end", 11)
    assert left <= x0 and x1 <= right
