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
GUIDE = "#666666"  # every guide line, whatever else the chart shows
TICK_FONT, LABEL_FONT = 11, 12
LOG2 = math.log10(2)
MID = 0.35  # baseline offset, in em, that centres digits on a y (QtSvg ignores dy)
# The legend's strip under the title: its top, row height, line sample, gap between entries.
LEGEND_TOP, LEGEND_ROW, SWATCH, GAP = 28.0, 15.0, 22.0, 14.0
SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


@dataclass(frozen=True)
class Series:
    """One line. Points whose x or y is not finite (or is None), or is <= 0 on a log
    axis, are left out and split the line."""

    label: str
    xs: tuple[float, ...]
    ys: tuple[float, ...]
    dashed: bool = False  # a guide line such as "n² guide", or a ceiling
    color: str | None = None  # fixed by the caller; else GUIDE for a guide, or by position

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


def _range(
    values: list[float], log: bool, pow2: bool, headroom: float = 0.04
) -> tuple[float, float]:
    """The data range (log10 on a log axis), widened when flat and padded a little
    (by headroom, a fraction of the range, at the high end). A linear axis of values that
    are all >= 0 starts at 0, never below."""
    t = [math.log10(v) for v in values] if log else values
    lo, hi = min(t), max(t)
    from_zero = not log and lo >= 0
    if from_zero:
        lo = 0.0
    if hi - lo <= 1e-12 * max(1.0, abs(hi)):
        half = LOG2 if pow2 else 0.5 if log else max(abs(lo) * 0.1, 1.0)
        lo, hi = lo - half, hi + half
    span = hi - lo
    return (0.0 if from_zero else lo - 0.04 * span), hi + headroom * span


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

    # The legend has a strip of its own between the title and the plot: it covers nothing.
    colors = _colors(chart.series)
    legend = _legend_rows(chart.series, colors, width, height)
    top = LEGEND_TOP + len(legend) * LEGEND_ROW + 8 if legend else top
    # room above the top line for its label
    headroom = 0.1 if hlines else 0.04
    ylo, yhi = _range([y for _, y in points] + [v for _, v in hlines], chart.log_y, False, headroom)
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
    out += _frame(chart, plot)
    out += _hlines(hlines, yscale, plot)
    # Guides first, measured data last: a guide never hides a data point.
    order = sorted(range(len(chart.series)), key=lambda i: not chart.series[i].dashed)
    out.append('<g id="series" stroke-linejoin="round">')
    for i in order:
        out += _series(chart.series[i], runs[i], colors[i], xscale, yscale)
    out.append("</g>")
    out += _tick_marks(xticks, yticks, xscale, yscale, plot)
    out += _legend(legend, plot)
    return "\n".join([*out, "</svg>"]) + "\n"


def _colors(series: tuple[Series, ...]) -> list[str]:
    """Each series' colour: its own if it has one, GUIDE for a guide, else the palette's
    next colour (counting only such series, so adding a guide changes no other colour)."""
    out, k = [], 0
    for s in series:
        if s.color:
            out.append(s.color)
        elif s.dashed:
            out.append(GUIDE)
        else:
            out.append(PALETTE[k % len(PALETTE)])
            k += 1
    return out


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
        text = _fit(label, TICK_FONT, plot.width - 12)
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


def _marker(x: float, y: float, color: str) -> str:
    """A filled dot for a measured point (guides have none: they measure nothing)."""
    return f'<circle cx="{x:.2f}" cy="{y:.2f}" r="2.8" fill="{color}"/>'


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
    if not s.dashed:
        out += [_marker(xs(x), ys(y), color) for run in runs for x, y in run]
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


LegendEntry = tuple[str, str, bool, float]  # label, colour ("" for none), dashed, width in px


def _legend_rows(
    series: tuple[Series, ...], colors: list[str], width: int, height: int
) -> list[list[LegendEntry]]:
    """The legend entries in rows as wide as the page, at most a fifth of its height;
    those that do not fit are counted in a last "… k more"."""

    def entry(label: str, color: str, dashed: bool) -> LegendEntry:
        label = _fit(label, TICK_FONT, width - 16 - SWATCH - 4)
        return label, color, dashed, SWATCH + 4 + _text_w(label, TICK_FONT)

    def flow(entries: list[LegendEntry]) -> list[list[LegendEntry]]:
        rows: list[list[LegendEntry]] = []
        used = math.inf
        for e in entries:
            if used + GAP + e[3] > width - 16:
                rows.append([])
                used = -GAP
            rows[-1].append(e)
            used += GAP + e[3]
        return rows

    entries = [entry(s.label, c, s.dashed) for s, c in zip(series, colors, strict=True)]
    max_rows = max(1, int(height * 0.2 // LEGEND_ROW))
    keep = len(entries)
    rows = flow(entries)
    while len(rows) > max_rows and keep > 0:
        keep -= 1
        rows = flow([*entries[:keep], entry(f"… {len(entries) - keep} more", "", False)])
    return rows


def _legend(rows: list[list[LegendEntry]], plot: _Plot) -> list[str]:
    """The legend rows, each centred over the plot, above it."""
    out = [f'<g id="legend" font-size="{TICK_FONT}" fill="{INK}">']
    for k, row in enumerate(rows):
        row_w = sum(e[3] for e in row) + GAP * (len(row) - 1)
        x = (plot.left + plot.right - row_w) / 2
        x = max(8.0, min(x, plot.page_w - 8 - row_w))
        cy = LEGEND_TOP + LEGEND_ROW * (k + 0.5)
        for label, color, dashed, w in row:
            if color:
                dash = ' stroke-dasharray="5 3"' if dashed else ""
                out.append(
                    f'<line x1="{x:.1f}" y1="{cy:.1f}" x2="{x + SWATCH:.1f}" y2="{cy:.1f}"'
                    f' stroke="{color}" stroke-width="1.8"{dash}/>'
                )
                if not dashed:
                    out.append(_marker(x + SWATCH / 2, cy, color))
            ty = cy + MID * TICK_FONT
            out.append(f'<text x="{x + SWATCH + 4:.1f}" y="{ty:.1f}">{escape(label)}</text>')
            x += w + GAP
    return [*out, "</g>"]
