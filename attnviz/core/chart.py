"""Line charts as true-vector SVG: benchmark timings against sequence length.

Standard library only (no NumPy, not even lazily), so a GPU machine with torch and
nothing else can still export its plots; PNG comes from rendering this same SVG.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from html import escape
from itertools import pairwise

FONT = "DejaVu Sans, Arial, Helvetica, sans-serif"  # as figure.py, which needs NumPy
# Okabe–Ito, ordered so that the first colours are the easiest to tell apart; yellow last.
PALETTE = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#F0E442")
INK, GRID, HLINE = "#222222", "#e6e6e6", "#555555"
TICK_FONT, LABEL_FONT = 11, 12
LOG2 = math.log10(2)
MID = 0.35  # baseline offset, in em, that centres digits on a y (QtSvg ignores dy)
SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


@dataclass(frozen=True)
class Series:
    """One line. Points whose x or y is not finite (or is None), or is <= 0 on a log
    axis, are left out and split the line."""

    label: str
    xs: tuple[float, ...]
    ys: tuple[float, ...]
    dashed: bool = False  # a guide line such as "n² guide", or a ceiling

    def __post_init__(self) -> None:
        if len(self.xs) != len(self.ys):
            raise ValueError(
                f"series {self.label!r}: {len(self.xs)} x values but {len(self.ys)} y values"
            )


@dataclass(frozen=True)
class Chart:
    """A line chart; log-log by default."""

    title: str
    x_label: str
    y_label: str
    series: tuple[Series, ...]
    log_x: bool = True
    log_y: bool = True
    hlines: tuple[tuple[str, float], ...] = ()  # labelled horizontal lines: ("ceiling", 640.0)


def n_squared_guide(
    xs: Iterable[float], anchor_x: float, anchor_y: float, label: str = "n² guide"
) -> Series:
    """A dashed line y = anchor_y·(x/anchor_x)², passing through (anchor_x, anchor_y)."""
    if not (math.isfinite(anchor_x) and anchor_x > 0):
        raise ValueError(f"n² guide: anchor_x must be a positive number, not {anchor_x!r}")
    xs = tuple(float(x) for x in xs)
    return Series(label, xs, tuple(anchor_y * (x / anchor_x) ** 2 for x in xs), dashed=True)


# --- numbers and text ---------------------------------------------------------------


def _value(v: object, log: bool) -> float | None:
    try:
        f = float(v)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) and (f > 0 or not log) else None


def _text_w(text: str, font: float) -> float:
    """A generous estimate of the width of text (DejaVu Sans digits are 0.64 em)."""
    return len(text) * font * 0.64


def _fit(text: str, font: float, max_w: float) -> str:
    """The text, cut short with an ellipsis if it would be wider than max_w."""
    if _text_w(text, font) <= max_w:
        return text
    keep = max(0, int(max_w / (font * 0.64)) - 1)
    return text[:keep] + "…"


def _fixed(v: float, decimals: int) -> str:
    text = f"{v:.{decimals}f}"
    return "0" if float(text) == 0 else text.replace("-", "−")


def _pow2_label(n: int) -> str:
    for shift, suffix in ((30, "G"), (20, "M"), (10, "k")):
        if n >= 1 << shift:
            return f"{n >> shift}{suffix}"
    return str(n)


def _is_pow2(x: float) -> bool:
    return x >= 1 and x == 2.0 ** round(math.log2(x))


# --- scales and ticks -----------------------------------------------------------------


@dataclass(frozen=True)
class _Scale:
    """Maps data values to pixels; lo and hi are in log10 units on a log axis."""

    lo: float
    hi: float
    log: bool
    p0: float  # pixel of lo
    p1: float  # pixel of hi

    def __call__(self, v: float) -> float:
        t = math.log10(v) if self.log else v
        return self.p0 + (t - self.lo) / (self.hi - self.lo) * (self.p1 - self.p0)


def _range(values: list[float], log: bool, pow2: bool, head: float = 0.04) -> tuple[float, float]:
    """The data range (log10 on a log axis), widened when flat and padded a little
    (by head, a fraction of the range, at the high end)."""
    t = [math.log10(v) for v in values] if log else values
    lo, hi = min(t), max(t)
    if hi - lo <= 1e-12 * max(1.0, abs(hi)):
        half = LOG2 if pow2 else 0.5 if log else max(abs(lo) * 0.1, 1.0)
        lo, hi = lo - half, hi + half
    span = hi - lo
    return lo - 0.04 * span, hi + head * span


Tick = tuple[float, str, bool]  # value, label ("" for none), major (gets a grid line)


def _linear_ticks(lo: float, hi: float, target: int = 8) -> list[Tick]:
    raw = (hi - lo) / target
    mag = 10.0 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw * (1 - 1e-9))
    first, last = math.ceil(lo / step - 1e-9), math.floor(hi / step + 1e-9)
    # large values in k, M or G, so that labels stay short: 800M rather than 800000000
    big = max(abs(lo), abs(hi))
    units = ((1e9, "G"), (1e6, "M"), (1e3, "k"))
    unit, suffix = next(((u, x) for u, x in units if big >= max(u, 1e5)), (1.0, ""))
    decimals = max(0, -math.floor(math.log10(step / unit) + 1e-9))
    return [
        (i * step, _fixed(i * step / unit, decimals) + (suffix if i else ""), True)
        for i in range(first, last + 1)
    ]


def _log_ticks(lo: float, hi: float) -> list[Tick]:
    """Powers of ten, with unlabelled minor ticks at 2 and 5 times them."""
    k0, k1 = math.ceil(lo - 1e-9), math.floor(hi + 1e-9)
    minors = [
        m * 10.0**k
        for k in range(k0 - 1, k1 + 1)
        for m in (2, 5)
        if lo - 1e-9 <= math.log10(m) + k <= hi + 1e-9
    ]
    if k1 > k0:
        plain = k0 >= -3 and k1 <= 4
        labels = {
            k: f"{10.0**k:g}" if plain else f"10{str(k).translate(SUPERSCRIPT)}"
            for k in range(k0, k1 + 1)
        }
        ticks = [(10.0**k, labels[k], True) for k in range(k0, k1 + 1)]
        return ticks + ([(v, "", False) for v in minors] if k1 - k0 <= 8 else [])
    # Less than a decade: label the 1-2-5 ticks, or failing that nice linear values.
    ones = sorted([10.0**k for k in range(k0, k1 + 1)] + minors)
    if len(ones) >= 2:
        return [(v, f"{v:g}", True) for v in ones]
    return [t for t in _linear_ticks(10.0**lo, 10.0**hi) if t[0] > 0]


def _pow2_ticks(lo: float, hi: float) -> list[Tick]:
    e0, e1 = max(0, math.ceil(lo / LOG2 - 1e-9)), math.floor(hi / LOG2 + 1e-9)
    return [(2.0**e, _pow2_label(1 << e), True) for e in range(e0, e1 + 1)]


def _ticks(lo: float, hi: float, log: bool, pow2: bool) -> list[Tick]:
    if pow2:
        return _pow2_ticks(lo, hi)
    return _log_ticks(lo, hi) if log else _linear_ticks(lo, hi)


def _thin(ticks: list[Tick], scale: _Scale, size: float | None) -> list[Tick]:
    """Blank every label but each k-th, for the smallest k at which none overlap.

    size is the label height on a vertical axis; None means measure widths (x axis).
    """
    labelled = sorted((t for t in ticks if t[1]), key=lambda t: scale(t[0]))
    extent = [size if size else _text_w(t[1], TICK_FONT) for t in labelled]
    pos = [scale(t[0]) for t in labelled]
    step = 1
    while step < len(labelled) and not all(
        abs(pos[b] - pos[a]) >= (extent[a] + extent[b]) / 2 + 4
        for a, b in pairwise(range(0, len(labelled), step))
    ):
        step += 1
    kept = {t[0] for t in labelled[::step]}
    return [(v, label if v in kept else "", major) for v, label, major in ticks]


# --- drawing ------------------------------------------------------------------------


@dataclass(frozen=True)
class _Plot:
    """The plot frame, in px; the page around it holds the title, ticks and axis titles."""

    left: float
    top: float
    right: float
    bottom: float
    page_w: int
    page_h: int

    @property
    def width(self) -> float:
        return self.right - self.left


def to_svg(chart: Chart, width: int = 640, height: int = 420) -> str:
    """The chart as an SVG document of the given size in px."""
    runs = [_runs(s, chart.log_x, chart.log_y) for s in chart.series]
    points = [p for series_runs in runs for run in series_runs for p in run]
    hlines = [(label, float(v)) for label, v in chart.hlines if _value(v, chart.log_y) is not None]
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}"'
        f' viewBox="0 0 {width} {height}" font-family="{FONT}">',
        f'<rect width="{width}" height="{height}" fill="#ffffff"/>',
        f'<text x="{width / 2:.1f}" y="20" font-size="{LABEL_FONT}" font-weight="bold"'
        f' text-anchor="middle" fill="{INK}">'
        f"{escape(_fit(chart.title, LABEL_FONT, width - 16))}</text>",
    ]
    top, bottom, right = 32.0, height - 44.0, width - 18.0
    if not points:
        plot = _Plot(44.0, top, right, bottom, width, height)
        out += _frame(chart, plot)
        out.append(
            f'<text x="{(plot.left + right) / 2:.1f}" y="{(top + bottom) / 2 + 4:.1f}"'
            f' font-size="{LABEL_FONT}" font-style="italic" fill="#777777"'
            ' text-anchor="middle">no data</text>'
        )
        return "\n".join([*out, "</svg>"]) + "\n"

    # room above the top line for its label
    head = 0.1 if hlines else 0.04
    ylo, yhi = _range([y for _, y in points] + [v for _, v in hlines], chart.log_y, False, head)
    yscale = _Scale(ylo, yhi, chart.log_y, bottom, top)
    yticks = _thin(_ticks(ylo, yhi, chart.log_y, False), yscale, TICK_FONT)
    label_w = max((_text_w(t[1], TICK_FONT) for t in yticks), default=0.0)
    plot = _Plot(min(max(44.0, 32 + label_w), width / 2), top, right, bottom, width, height)
    xs = [x for x, _ in points]
    pow2 = chart.log_x and all(_is_pow2(x) for x in xs)
    xlo, xhi = _range(xs, chart.log_x, pow2)
    xscale = _Scale(xlo, xhi, chart.log_x, plot.left, right)
    xticks = _thin(_ticks(xlo, xhi, chart.log_x, pow2), xscale, None)

    out += _grid(xticks, yticks, xscale, yscale, plot)
    out += _hlines(hlines, yscale, plot)
    out.append('<g id="series" stroke-linejoin="round">')
    for i, (s, series_runs) in enumerate(zip(chart.series, runs, strict=True)):
        out += _series(s, series_runs, PALETTE[i % len(PALETTE)], xscale, yscale)
    out.append("</g>")
    out += _frame(chart, plot)
    out += _tick_marks(xticks, yticks, xscale, yscale, plot)
    data = [p for series_runs in runs for run in series_runs for p in _trace(run, xscale, yscale)]
    lines = [(plot.left + plot.width * k / 40, yscale(v)) for _, v in hlines for k in range(41)]
    out += _legend(chart.series, data, lines, plot)
    return "\n".join([*out, "</svg>"]) + "\n"


def _runs(s: Series, log_x: bool, log_y: bool) -> list[list[tuple[float, float]]]:
    """The series' drawable points, split into runs at every point left out."""
    runs: list[list[tuple[float, float]]] = [[]]
    for x, y in zip(s.xs, s.ys, strict=True):
        fx, fy = _value(x, log_x), _value(y, log_y)
        if fx is not None and fy is not None:
            runs[-1].append((fx, fy))
        elif runs[-1]:
            runs.append([])
    return [run for run in runs if run]


def _frame(chart: Chart, plot: _Plot) -> list[str]:
    mid_x, mid_y = (plot.left + plot.right) / 2, (plot.top + plot.bottom) / 2
    # centred under the plot, so it has twice the room to the nearer page edge
    room = 2 * min(mid_x, plot.page_w - mid_x) - 8
    x_title = escape(_fit(chart.x_label, LABEL_FONT, room))
    y_title = escape(_fit(chart.y_label, LABEL_FONT, plot.bottom - plot.top))
    return [
        f'<rect x="{plot.left:.1f}" y="{plot.top:.1f}" width="{plot.width:.1f}"'
        f' height="{plot.bottom - plot.top:.1f}" fill="none" stroke="#444444"/>',
        f'<g id="axis-titles" font-size="{LABEL_FONT}" fill="{INK}" text-anchor="middle">',
        f'<text x="{mid_x:.1f}" y="{plot.page_h - 10}">{x_title}</text>',
        f'<text transform="translate(16,{mid_y:.1f}) rotate(-90)">{y_title}</text>',
        "</g>",
    ]


def _grid(xticks: list[Tick], yticks: list[Tick], xs: _Scale, ys: _Scale, plot: _Plot) -> list[str]:
    out = [f'<g id="grid" stroke="{GRID}" stroke-width="1">']
    for v, _, major in xticks:
        if major:
            x = xs(v)
            out.append(
                f'<line x1="{x:.2f}" y1="{plot.top:.1f}" x2="{x:.2f}" y2="{plot.bottom:.1f}"/>'
            )
    for v, _, major in yticks:
        if major:
            y = ys(v)
            out.append(
                f'<line x1="{plot.left:.1f}" y1="{y:.2f}" x2="{plot.right:.1f}" y2="{y:.2f}"/>'
            )
    return [*out, "</g>"]


def _hlines(hlines: list[tuple[str, float]], ys: _Scale, plot: _Plot) -> list[str]:
    out = [f'<g id="hlines" fill="{HLINE}" font-size="{TICK_FONT}" text-anchor="end">']
    for label, v in hlines:
        y = ys(v)
        # the label sits above its line, or below when the line runs along the top
        ty = y - 4 if y - 4 - TICK_FONT > plot.top else y + TICK_FONT + 3
        text = _fit(label, TICK_FONT, plot.width / 2)
        w = _text_w(text, TICK_FONT)
        out.append(
            f'<line x1="{plot.left:.1f}" y1="{y:.2f}" x2="{plot.right:.1f}" y2="{y:.2f}"'
            f' stroke="{HLINE}" stroke-width="1.2" stroke-dasharray="7 4"/>'
        )
        # a pale backing keeps the label readable where a series crosses it
        out.append(
            f'<rect x="{plot.right - 6 - w:.1f}" y="{ty - TICK_FONT + 1:.1f}" width="{w + 4:.1f}"'
            f' height="{TICK_FONT + 2}" fill="#ffffff" fill-opacity="0.8"/>'
        )
        out.append(f'<text x="{plot.right - 4:.1f}" y="{ty:.2f}">{escape(text)}</text>')
    return [*out, "</g>"]


def _marker(x: float, y: float, color: str, dashed: bool) -> str:
    """A filled dot for a measured point; a hollow one on a guide line."""
    if dashed:
        style = f'r="2.3" fill="#ffffff" stroke="{color}" stroke-width="1.2"'
    else:
        style = f'r="2.8" fill="{color}"'
    return f'<circle cx="{x:.2f}" cy="{y:.2f}" {style}/>'


def _series(
    s: Series, runs: list[list[tuple[float, float]]], color: str, xs: _Scale, ys: _Scale
) -> list[str]:
    dash = ' stroke-dasharray="6 4"' if s.dashed else ""
    out = [f'<g class="series"><title>{escape(s.label)}</title>']
    for run in runs:
        pts = " ".join(f"{xs(x):.2f},{ys(y):.2f}" for x, y in run)
        out.append(
            f'<polyline points="{pts}" fill="none" stroke="{color}" stroke-width="1.8"{dash}/>'
        )
    for run in runs:
        out += [_marker(xs(x), ys(y), color, s.dashed) for x, y in run]
    return [*out, "</g>"]


def _tick_marks(
    xticks: list[Tick], yticks: list[Tick], xs: _Scale, ys: _Scale, plot: _Plot
) -> list[str]:
    out = [f'<g id="x-ticks" font-size="{TICK_FONT}" fill="{INK}" text-anchor="middle">']
    for v, label, major in sorted(xticks):
        x, y0 = xs(v), plot.bottom
        out.append(
            f'<line x1="{x:.2f}" y1="{y0:.1f}" x2="{x:.2f}" y2="{y0 + (5 if major else 3):.1f}"'
            ' stroke="#444444"/>'
        )
        if label:
            half = _text_w(label, TICK_FONT) / 2
            tx = min(max(x, half + 2), plot.page_w - half - 2)  # keep edge labels on the page
            out.append(f'<text x="{tx:.2f}" y="{y0 + 18:.1f}">{escape(label)}</text>')
    out.append("</g>")
    out.append(f'<g id="y-ticks" font-size="{TICK_FONT}" fill="{INK}" text-anchor="end">')
    for v, label, major in sorted(yticks):
        y, x0 = ys(v), plot.left
        out.append(
            f'<line x1="{x0 - (5 if major else 3):.1f}" y1="{y:.2f}" x2="{x0:.1f}" y2="{y:.2f}"'
            ' stroke="#444444"/>'
        )
        if label:
            ty = y + MID * TICK_FONT
            out.append(f'<text x="{x0 - 7:.1f}" y="{ty:.2f}">{escape(label)}</text>')
    return [*out, "</g>"]


def _trace(run: list[tuple[float, float]], xs: _Scale, ys: _Scale) -> list[tuple[float, float]]:
    """Pixels along a drawn run: its points and some in between."""
    pix = [(xs(x), ys(y)) for x, y in run]
    out = list(pix)
    for (x0, y0), (x1, y1) in pairwise(pix):
        out += [(x0 + (x1 - x0) * k / 8, y0 + (y1 - y0) * k / 8) for k in range(1, 8)]
    return out


def _legend(
    series: tuple[Series, ...],
    data: list[tuple[float, float]],
    lines: list[tuple[float, float]],
    plot: _Plot,
) -> list[str]:
    """A legend in the inside corner that covers the fewest data points, then the fewest
    points of the horizontal lines; top-left when that is as good as any."""
    row = 16
    entries = [(s.label, PALETTE[i % len(PALETTE)], s.dashed) for i, s in enumerate(series)]
    max_rows = max(1, int((plot.bottom - plot.top - 16) // row))
    if len(entries) > max_rows:
        more = len(entries) - max_rows + 1
        entries = [*entries[: max_rows - 1], (f"… {more} more", "", False)]
    if not entries:
        return []
    labels = [_fit(label, TICK_FONT, plot.width * 0.5) for label, _, _ in entries]
    box_w = 38 + max(_text_w(label, TICK_FONT) for label in labels)
    box_h = len(entries) * row + 8

    def covered(corner: tuple[float, float]) -> tuple[int, int]:
        x, y = corner
        inside = [
            sum(x <= px <= x + box_w and y <= py <= y + box_h for px, py in pts)
            for pts in (data, lines)
        ]
        return inside[0], inside[1]

    left, right = plot.left + 8, plot.right - 8 - box_w
    top, bottom = plot.top + 8, plot.bottom - 8 - box_h
    x, y = min([(left, top), (right, top), (left, bottom), (right, bottom)], key=covered)
    out = [
        f'<g id="legend" font-size="{TICK_FONT}" fill="{INK}">',
        f'<rect x="{x:.1f}" y="{y:.1f}" width="{box_w:.1f}" height="{box_h:.1f}" fill="#ffffff"'
        ' fill-opacity="0.9" stroke="#bbbbbb"/>',
    ]
    for k, (label, (_, color, dashed)) in enumerate(zip(labels, entries, strict=True)):
        cy = y + 4 + row * (k + 0.5)
        if color:
            dash = ' stroke-dasharray="5 3"' if dashed else ""
            out.append(
                f'<line x1="{x + 6:.1f}" y1="{cy:.1f}" x2="{x + 28:.1f}" y2="{cy:.1f}"'
                f' stroke="{color}" stroke-width="1.8"{dash}/>'
            )
            out.append(_marker(x + 17, cy, color, dashed))
        out.append(f'<text x="{x + 32:.1f}" y="{cy + MID * TICK_FONT:.1f}">{escape(label)}</text>')
    return [*out, "</g>"]
