"""The lines view (BertViz's head view) as SVG: queries left, keys right, a line per weight.

Each line joins a query to a key; its opacity is that head's attention weight, its colour
the head's. Lines fainter than ``THRESHOLD`` are left out: they would not show, and at
n = 128 with 12 heads there are some 200 000 of them. Isolating a token (hovering it in
the window) keeps only its lines and prints their weights beside the other column. The
window draws the same picture with Qt and exports PNG by rendering this SVG.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

import numpy as np

from attnviz.core.figures.chart import FONT, PALETTE

THRESHOLD = 0.01  # weights below this get no line (opacity under 1 %)
HeadWeights = Sequence[np.ndarray] | np.ndarray  # each head's queries × keys, by head
# Okabe–Ito (colour-blind safe) without its yellow, which vanishes on white once faint.
HEAD_COLORS = tuple(c for c in PALETTE if c != "#F0E442")
MAX_WEIGHT_TEXTS = 4  # weights printed per label while isolating: the first shown heads
SIDES = ("query", "key")
MUTED = "#9a9a9a"  # labels on the isolated token's side, other than the isolated one


@dataclass(frozen=True)
class Isolated:
    """One token whose lines alone are shown: a query (row) or a key (column), 0-based."""

    side: str
    index: int

    def __post_init__(self) -> None:
        if self.side not in SIDES:
            raise ValueError(f"side {self.side!r}: expected query or key")


def head_color(head: int) -> str:
    """The colour of a head (0-based): the palette repeats after seven heads."""
    return HEAD_COLORS[head % len(HEAD_COLORS)]


def strand(position: int, heads: int, row: float) -> float:
    """How far (up or down) the lines of the head at this position among those shown sit
    from the row's centre: overlaid heads run side by side, each colour visible."""
    return (position - (heads - 1) / 2) * min(2.0, 0.5 * row / max(heads, 1))


def weight_text(weight: float) -> str:
    """A weight as printed beside a label."""
    return f"{weight:.2f}"


def shown_lines(
    weights: HeadWeights,
    heads: Sequence[int],
    isolated: Isolated | None = None,
    threshold: float = THRESHOLD,
) -> list[tuple[int, np.ndarray, np.ndarray, np.ndarray]]:
    """(head, queries, keys, weights) of the lines to draw, one entry per shown head:
    every weight at or above threshold, only the isolated token's when one is."""
    out = []
    for h in heads:
        w = weights[h]
        if isolated is None:
            i, j = np.nonzero(w >= threshold)  # NaN compares False: no line
        elif isolated.side == "query":
            j = np.flatnonzero(w[isolated.index] >= threshold)
            i = np.full_like(j, isolated.index)
        else:
            i = np.flatnonzero(w[:, isolated.index] >= threshold)
            j = np.full_like(i, isolated.index)
        out.append((h, i, j, w[i, j]))
    return out


def check_shapes(
    tokens: Sequence[str],
    key_tokens: Sequence[str],
    weights: np.ndarray,
    heads: Sequence[int],
    isolated: Isolated | None = None,
) -> None:
    """ValueError unless weights is heads × queries × keys and every head (and the
    isolated token) exists."""
    if weights.ndim != 3 or weights.shape[1:] != (len(tokens), len(key_tokens)):
        raise ValueError(
            f"weights of shape {weights.shape}: expected heads × {len(tokens)} × {len(key_tokens)}"
        )
    bad = [h for h in heads if not 0 <= h < weights.shape[0]]
    if bad:
        raise ValueError(f"head {bad[0] + 1}: there are {weights.shape[0]} heads")
    if isolated is not None:
        count = len(tokens if isolated.side == "query" else key_tokens)
        if not 0 <= isolated.index < count:
            raise ValueError(f"{isolated.side} {isolated.index + 1}: there are {count}")


def _short(label: str, most: int = 24) -> str:
    return label if len(label) <= most else label[: most - 1] + "…"


@dataclass(frozen=True)
class _Layout:
    """Where the parts of the figure go, in SVG units (px at scale 1)."""

    width: float
    height: float
    legend_columns: int
    header: float  # baseline of the "queries" and "keys" headings
    top: float  # the first row's top
    q_x: float  # query labels end here
    k_x: float  # key labels start here
    texts_x: float  # the isolated lines' weights start here (0 when none)

    ROW = 18.0
    FONT = 12.0
    STEP = 34.0  # room for one printed weight
    LEGEND = 74.0  # room for one head in the legend

    def y(self, k: int) -> float:
        """The baseline of row k's label (QtSvg ignores dy: centred by hand)."""
        return self.top + (k + 0.5) * self.ROW + 0.35 * self.FONT

    def line_y(self, k: int, offset: float) -> float:
        return self.top + (k + 0.5) * self.ROW + offset


def _layout(
    tokens: Sequence[str],
    key_tokens: Sequence[str],
    heads: int,
    isolated: Isolated | None,
    least: float,
) -> _Layout:
    char = 0.62 * _Layout.FONT
    texts = min(heads, MAX_WEIGHT_TEXTS) * _Layout.STEP + (12.0 if heads > MAX_WEIGHT_TEXTS else 0)
    texts_w = texts + 8.0 if isolated is not None else 0.0
    q_w = max([len(_short(t)) for t in tokens] + [7]) * char
    k_w = max([len(_short(t)) for t in key_tokens] + [4]) * char
    left = 16.0 + (texts_w if isolated is not None and isolated.side == "key" else 0.0)
    q_x = left + q_w
    k_x = q_x + 12.0 + 240.0 + 12.0
    width = k_x + k_w + (texts_w if isolated is not None and isolated.side == "query" else 0.0)
    width = max(width + 16.0, least)
    texts_x = 0.0
    if isolated is not None:
        texts_x = k_x + k_w + 8.0 if isolated.side == "query" else 16.0
    columns = max(1, int((width - 32.0) // _Layout.LEGEND))
    header = 50.0 + -(-heads // columns) * 18.0 + 14.0
    top = header + 8.0
    height = top + max(len(tokens), len(key_tokens), 1) * _Layout.ROW + 16.0
    return _Layout(width, height, columns, header, top, q_x, k_x, texts_x)


def lines_svg(
    tokens: Sequence[str],
    key_tokens: Sequence[str],
    weights: HeadWeights,
    heads: Sequence[int],
    isolated: Isolated | None = None,
    title: str = "",
    threshold: float = THRESHOLD,
) -> str:
    """The lines view as an SVG document: weights is heads × queries × keys; heads are the
    (0-based) heads drawn, in order; isolated keeps one token's lines and prints them."""
    weights = np.asarray(weights, dtype=np.float64)  # (a sequence of heads: stacked)
    check_shapes(tokens, key_tokens, weights, heads, isolated)
    note = f"line opacity = weight; weights below {threshold:g} have no line"
    if isolated is not None:
        labels = tokens if isolated.side == "query" else key_tokens
        note = f"the lines of {isolated.side} “{_short(labels[isolated.index])}” only · {note}"
    least = 32.0 + max(len(note) * 6.3, len(title) * 9.5)  # the title and the note fit
    L = _layout(tokens, key_tokens, len(heads), isolated, least)
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{L.width:.0f}" height="{L.height:.0f}"'
        f' viewBox="0 0 {L.width:.0f} {L.height:.0f}" font-family="{FONT}">',
        f'<rect width="{L.width:.0f}" height="{L.height:.0f}" fill="#ffffff"/>',
        f'<text x="16" y="22" font-size="15" font-weight="bold">{escape(title)}</text>',
        f'<text x="16" y="40" font-size="11" fill="#555555">{escape(note)}</text>',
        '<g id="legend" font-size="11">',
    ]
    for k, h in enumerate(heads):
        x = 16.0 + (k % L.legend_columns) * L.LEGEND
        y = 50.0 + (k // L.legend_columns) * 18.0
        out.append(
            f'<rect x="{x:.1f}" y="{y:.1f}" width="12" height="12" fill="{head_color(h)}"/>'
            f'<text x="{x + 16:.1f}" y="{y + 10:.1f}">head {h + 1}</text>'
        )
    out += [
        "</g>",
        '<g font-size="11" font-style="italic" fill="#555555">'
        f'<text x="{L.q_x:.1f}" y="{L.header:.1f}" text-anchor="end">queries</text>'
        f'<text x="{L.k_x:.1f}" y="{L.header:.1f}">keys</text></g>',
        '<g id="lines" fill="none" stroke-width="1.5">',
    ]
    x1, x2 = L.q_x + 6.0, L.k_x - 6.0
    for c, (h, qs, ks, ws) in enumerate(shown_lines(weights, heads, isolated, threshold)):
        d = strand(c, len(heads), L.ROW)
        out.append(f'<g id="head-{h + 1}" stroke="{head_color(h)}">')
        out += [
            f'<line x1="{x1:.1f}" y1="{L.line_y(i, d):.1f}" x2="{x2:.1f}" y2="{L.line_y(j, d):.1f}"'
            f' stroke-opacity="{min(w, 1.0):.4f}" data-query="{i}" data-key="{j}"/>'
            for i, j, w in zip(qs.tolist(), ks.tolist(), ws.tolist(), strict=True)
        ]
        out.append("</g>")
    out.append("</g>")
    for side, labels, x in (("query", tokens, L.q_x), ("key", key_tokens, L.k_x)):
        anchor = ' text-anchor="end"' if side == "query" else ""
        out.append(f'<g id="{side}-labels" font-size="{L.FONT:.0f}"{anchor}>')
        for k, label in enumerate(labels):
            style = ""
            if isolated is not None and isolated.side == side:
                style = ' font-weight="bold"' if isolated.index == k else f' fill="{MUTED}"'
            out.append(f'<text x="{x:.1f}" y="{L.y(k):.1f}"{style}>{escape(_short(label))}</text>')
        out.append("</g>")
    if isolated is not None:
        out += _weight_texts(weights, heads, isolated, L, threshold)
    out.append("</svg>")
    return "\n".join(out) + "\n"


def isolated_weights(weights: HeadWeights, head: int, isolated: Isolated) -> np.ndarray:
    """The isolated token's weights in one head: a query's row, or a key's column."""
    w = weights[head]
    return w[isolated.index, :] if isolated.side == "query" else w[:, isolated.index]


def _weight_texts(
    weights: np.ndarray, heads: Sequence[int], isolated: Isolated, L: _Layout, threshold: float
) -> list[str]:
    """The isolated lines' weights beside the other column (right of the keys for a query,
    left of the queries for a key): one number in its head's colour per head shown, grey
    where the weight has no line."""
    shown = list(heads[:MAX_WEIGHT_TEXTS])
    columns = [isolated_weights(weights, h, isolated) for h in shown]
    count = weights.shape[2] if isolated.side == "query" else weights.shape[1]
    out = ['<g id="weights" font-size="11">']
    for k in range(count):
        parts = [
            f'<text x="{L.texts_x + c * L.STEP:.1f}" y="{L.y(k):.1f}"'
            f' fill="{head_color(h) if column[k] >= threshold else MUTED}">'
            f"{weight_text(float(column[k]))}</text>"
            for c, (h, column) in enumerate(zip(shown, columns, strict=True))
        ]
        if len(heads) > len(shown):
            x = L.texts_x + len(shown) * L.STEP
            parts.append(f'<text x="{x:.1f}" y="{L.y(k):.1f}" fill="{MUTED}">…</text>')
        out.append("".join(parts))
    out.append("</g>")
    return out
