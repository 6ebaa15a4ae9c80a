"""Heatmap figures as SVG: vector cells for small heatmaps, one embedded image for large.

``spec_for(result, view, head)`` decides what a heatmap shows (values, labels, colour
map); ``to_svg(spec)`` draws it with axis labels and a colour bar. A heatmap of at most
``VECTOR_CELLS`` cells (64 × 64) gets a rectangle per cell, titled with its exact value.
A larger one gets its cells as one PNG image, one pixel per cell, drawn at the cell size
without smoothing (masked cells shaded, leaked cells in the leak colour); the axes,
labels and colour bar stay vector. So the file and the work stay proportional to the
cells, not to the elements an SVG viewer would have to draw. The window exports PNG by
rendering this same SVG, so both formats show the same picture.
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import math
import struct
import xml.etree.ElementTree as ET
import zlib
from dataclasses import dataclass
from html import escape
from typing import Any

import numpy as np

from attnviz.core.figures import colors
from attnviz.core.maths.positions import future_mask
from attnviz.core.maths.results import HEAD_MATRICES, TURNED_MATRICES, Computed
from attnviz.core.maths.scenario import MINUS_INF_MASKS

VIEWS = (*HEAD_MATRICES, *TURNED_MATRICES, "X", "concat", "final")
SQUARE_VIEWS = ("scores", "scaled", "masked", "weights")
KEY_VIEWS = ("K", "V", "K_rot")  # one row per key
TITLES = {
    "Q": "Q = X W_Q",
    "K": "K = X W_K",
    "V": "V = X W_V",
    "Q_rot": "Q as scored",
    "K_rot": "K as scored",
    "scores": "raw scores Q Kᵀ",
    "scaled": "scaled scores",
    "masked": "masked scores",
    "weights": "weights (softmax)",
    "output": "head output",
    "X": "input X",
    "concat": "concat of heads",
    "final": "output (concat W_O)",
}
CAPTIONS = {"concat": "concat", "final": "output"}  # short titles for narrow views
FONT = "DejaVu Sans, Arial, Helvetica, sans-serif"
SVG_NS = "http://www.w3.org/2000/svg"
VECTOR_CELLS = 64 * 64  # up to this many cells, one rectangle per cell; above, one image
SHADE = 110 / 255  # opacity of the hatch grey over a masked cell too small to hatch


@dataclass(frozen=True, eq=False)
class HeatmapSpec:
    """Everything needed to draw one heatmap, independent of how it is drawn."""

    title: str
    values: np.ndarray
    row_labels: tuple[str, ...]
    col_labels: tuple[str, ...]
    row_title: str
    col_title: str
    kind: str
    levels: tuple[float, float]
    caption: str = ""  # the title without the head, for a view that names the head elsewhere
    masked: np.ndarray | None = None  # bool: cells the mask strategy set (hatched)
    leaked: np.ndarray | None = None  # bool: weight that reached a future key (outlined)
    finite: bool = False  # every value but the masked ones is known finite (not looked at)

    def looks_like(self, other: HeatmapSpec) -> bool:
        """Whether other draws as this one does but for the values (the same shape,
        colours, marks and words), which a view compares itself, once."""

        def same(a: np.ndarray | None, b: np.ndarray | None) -> bool:
            return a is b or (a is not None and b is not None and np.array_equal(a, b))

        words = ("title", "row_labels", "col_labels", "row_title", "col_title", "caption")
        return (
            all(getattr(self, w) == getattr(other, w) for w in words)
            and (self.kind, self.levels) == (other.kind, other.levels)
            and self.values.shape == other.values.shape
            and same(self.masked, other.masked)
            and same(self.leaked, other.leaked)
        )

    def hatched(self, index: Any = ...) -> np.ndarray:
        """Cells drawn as masked: those the mask set, and any −∞ (of the cells at index,
        all by default)."""
        hatched = ~np.isfinite(self.values[index])
        shown: np.ndarray = hatched | self.masked[index] if self.masked is not None else hatched
        return shown


# Which views each mask strategy writes into: −∞ or 0 in the scores softmax sees, and
# (all three) the weights of future keys, exactly 0 unless the strategy leaks.
MASKED_VIEWS = {
    "none": (),
    "causal": ("masked", "weights"),
    "causal-zero": ("masked", "weights"),
    "drop-after-softmax": ("weights",),
    "sliding-window": ("masked", "weights"),
    "custom": ("masked", "weights"),
}


def mask_marks(
    mask: str,
    view: str,
    values: np.ndarray,
    causal_intent: bool = False,
    hidden: np.ndarray | None = None,
    zeroed: bool = False,
) -> tuple[np.ndarray | None, np.ndarray | None]:
    """(masked, leaked) cells of a square view under a mask strategy; None where none are.

    ``hidden``: the keys the mask hides (a Result's ``future``; the future keys if not
    given). Leaked weight is weight on a hidden key under a strategy meant to hide it;
    with causal_intent (comparing strategies), weight on the future counts under "none" too.
    ``zeroed``: the weights on the hidden keys are known to be 0 (nothing leaked).
    """
    if view not in SQUARE_VIEWS:
        return None, None
    future = future_mask(len(values)) if hidden is None else hidden
    masked = future if view in MASKED_VIEWS[mask] else None
    leaked = None
    if view == "weights" and (mask != "none" or causal_intent) and not zeroed:
        leaked = future & (values != 0)
    return masked, leaked if leaked is not None and leaked.any() else None


@functools.lru_cache(maxsize=16)
def feature_labels(count: int) -> tuple[str, ...]:
    """Column labels 1, 2, …, count (made once per width, not on every edit)."""
    return tuple(str(j + 1) for j in range(count))


def spec_for(result: Computed, view: str, head: int | None = None) -> HeatmapSpec:
    """The heatmap of one intermediate; head is 0-based for per-head views (a HeadResult
    holds one head alone; a Result every head and the mix)."""
    if view not in VIEWS:
        raise KeyError(f"view {view!r}: expected one of {', '.join(VIEWS)}")
    per_head = view in HEAD_MATRICES or view in TURNED_MATRICES
    values = result.matrix(view, head if per_head else None)
    tokens = tuple(result.keys if view in KEY_VIEWS else result.tokens)
    if view in SQUARE_VIEWS:
        cols, row_title, col_title = tuple(result.keys), "query", "key"
    else:
        cols = feature_labels(values.shape[1])
        row_title, col_title = ("key" if view in KEY_VIEWS else "token"), "feature"
    title = _title(result, view)
    caption = CAPTIONS.get(view, title)
    if per_head:
        title = f"head {head + 1 if head is not None else '?'} · {title}"
    kind = colors.kind_for(view)
    # The masked scores share the scaled scores' colours: a cell the mask left alone keeps
    # its colour from one view to the next.
    coloured = result.matrix("scaled", head) if view == "masked" else values
    extent = None
    if kind != "sequential":
        extent = colors.extent(coloured)
    levels = colors.levels(coloured, kind, extent)
    finite = _finite(result, view, head, extent)
    # Under a −∞ mask (or drop-after-softmax) this engine gives the hidden keys a weight
    # of exactly 0 when the scores are finite (exp(−∞) = 0, or set so): no leak to find.
    zeroed = (
        finite
        and per_head
        and head is not None
        and result.head(head).rule is not None
        and result.settings.mask in (*MINUS_INF_MASKS, "drop-after-softmax")
    )
    masked, leaked = mask_marks(
        result.settings.mask, view, values, hidden=result.future, zeroed=zeroed
    )
    return HeatmapSpec(
        title,
        values,
        tokens,
        cols,
        row_title,
        col_title,
        kind,
        levels,
        caption,
        masked,
        leaked,
        finite,
    )


def _finite(
    result: Computed, view: str, head: int | None, extent: tuple[float, float] | None
) -> bool:
    """Whether every value of the view but the masked ones is known finite without
    looking at each: from its extent (the masked scores: the scaled scores'); the
    weights of this engine's heads from the softmax's row offsets (m, the row maximum:
    finite only when no score the row's softmax saw was +∞ or NaN, and then every
    weight is finite)."""
    if view == "weights" and head is not None:
        h = result.head(head)
        return h.rule is not None and bool(np.isfinite(h.m).all())
    return extent is not None and math.isfinite(extent[0]) and math.isfinite(extent[1])


def _title(result: Computed, view: str) -> str:
    """The view's title, saying what the scenario adds: biases, X_kv, b_O."""
    source = "X_kv" if result.X_kv is not None else "X"
    if view in ("Q", "K", "V"):
        if not result.settings.projections:
            return f"{view} = {source if view != 'Q' else 'X'} (no projections)"
        bias = f" + b_{view}" if f"b_{view}" in result.biases else ""
        return f"{view} = {'X' if view == 'Q' else source} W_{view}{bias}"
    if view in ("Q_rot", "K_rot"):
        st = result.settings
        steps = [
            s for s, on in (("norm", st.qk_norm != "none"), ("RoPE", st.positional == "rope")) if on
        ]
        return f"{view[0]} after {', '.join(steps)}" if steps else TITLES[view]
    if view == "final" and "b_O" in result.biases:
        return "output (concat W_O + b_O)"
    return TITLES[view]


def variant_terms(result: Computed) -> list[tuple[str, str]]:
    """What the scenario adds to the 2017 layer, short and long: biases, QK-norm, RoPE,
    ALiBi, soft-cap, sinks, an alignment (one pair per term in use)."""
    st = result.settings
    terms = []
    if result.biases:
        terms.append(("+ biases", f"biases {', '.join(result.biases)} added"))
    if st.qk_norm == "rms":
        terms.append(("QK-norm", f"Q and K RMS-normalised over d_k (eps {st.qk_norm_eps:g})"))
    elif st.qk_norm == "rms-whole":
        terms.append(
            (
                "QK-norm",
                f"Q and K RMS-normalised over all heads' features (eps {st.qk_norm_eps:g})",
            )
        )
    if st.positional == "rope":
        dims = "all" if st.rope_dims is None else str(st.rope_dims)
        terms.append(
            (
                "RoPE",
                f"Q and K rotated by position (RoPE, "
                f"{'scaled' if st.rope_frequencies else f'base {st.rope_base:g}'}, "
                f"{st.rope_style} pairs, {dims} dims)",
            )
        )
    if st.positional == "alibi":
        terms.append(("ALiBi", "ALiBi adds −slope·|i − j| to the scores"))
    if st.positional == "relative-bias":
        terms.append(
            (
                "T5 bias",
                f"T5's relative bias adds a learned number per bucket of j − i and head "
                f"({st.relative_buckets} buckets)",
            )
        )
    if st.softcap is not None:
        terms.append(
            (
                f"soft-cap {st.softcap:g}",
                f"scores soft-capped: {st.softcap:g}·tanh(s/{st.softcap:g})",
            )
        )
    if st.sinks is not None:
        terms.append(
            ("sink", "a sink logit joins each row's softmax denominator: rows sum below 1")
        )
    if st.causal_alignment == "bottom-right" and result.X_kv is not None:
        terms.append(("bottom-right", "the last query lines up with the last key"))
    return terms


def make_spec(
    title: str,
    values: np.ndarray,
    row_labels: tuple[str, ...],
    col_labels: tuple[str, ...] | None = None,
    row_title: str = "token",
    col_title: str = "feature",
    kind: str = "diverging",
    caption: str = "",
    levels: tuple[float, float] | None = None,
) -> HeatmapSpec:
    """A spec for any matrix (columns numbered from 1 unless labelled; levels from the
    values unless given)."""
    cols = col_labels or numbered(values.shape[1])
    if levels is None:
        levels = colors.levels(values, kind)
    return HeatmapSpec(
        title, values, row_labels, cols, row_title, col_title, kind, levels, caption or title
    )


@functools.lru_cache(maxsize=8)
def numbered(count: int) -> tuple[str, ...]:
    """Labels 1 … count."""
    return tuple(str(j + 1) for j in range(count))


def _hex(rgb: np.ndarray) -> str:
    return "#" + "".join(f"{int(c):02x}" for c in rgb[:3])


def colorbar_ticks(spec: HeatmapSpec) -> list[float]:
    """Low, middle (0 for a diverging map) and high."""
    lo, hi = spec.levels
    return [lo, (lo + hi) / 2, hi] if spec.kind == "sequential" else [lo, 0.0, hi]


def tick_label(v: float) -> str:
    return f"{v:.3g}".replace("-", "−")


@dataclass(frozen=True)
class Layout:
    """Positions of the parts of a figure, in SVG user units (px at scale 1)."""

    cell: float
    label_font: float
    value_font: float  # 0 when cells are too small for values
    left: float
    top: float
    width: float
    height: float
    rotate_cols: bool


def is_raster(spec: HeatmapSpec) -> bool:
    """Whether the figure draws its cells as one image (more than VECTOR_CELLS cells)."""
    return spec.values.size > VECTOR_CELLS


def layout(spec: HeatmapSpec) -> Layout:
    rows, cols = spec.values.shape
    # Image cells may be as small as one unit: a 2048-token figure stays ~2300 units wide.
    cell = min(56.0, max(1.0 if is_raster(spec) else 4.0, 640.0 / max(rows, cols)))
    label_font = min(13.0, max(6.0, cell * 0.6))
    value_font = min(13.0, cell * 0.3) if cell >= 30 else 0.0
    char = 0.62 * label_font
    row_w = max(len(s) for s in spec.row_labels) * char
    col_w = max(len(s) for s in spec.col_labels) * char
    rotate = col_w > cell * 0.9
    left = 30 + row_w + 8
    top = 34 + (col_w if rotate else label_font) + 22
    width = left + cols * cell + 110
    height = top + max(rows * cell, 60.0) + 44  # room for the masked / leaked legend
    return Layout(cell, label_font, value_font, left, top, width, height, rotate)


def _label_every(cell: float, font: float) -> int:
    """Show every k-th tick label so that labels do not overlap."""
    return max(1, math.ceil(font * 1.1 / cell))


def to_svg(spec: HeatmapSpec, cells: bool = True) -> str:
    """The heatmap as an SVG document.

    ``cells=False`` leaves out the image of a raster figure's cells (for a PNG, which
    draws them straight from ``cell_pixels`` into ``cell_box``).
    """
    L = layout(spec)
    masked = spec.hatched()
    out = [
        f'<svg xmlns="{SVG_NS}" xmlns:xlink="http://www.w3.org/1999/xlink"'
        f' width="{L.width:.0f}" height="{L.height:.0f}"'
        f' viewBox="0 0 {L.width:.1f} {L.height:.1f}" font-family="{FONT}">',
        "<defs>",
        '<pattern id="hatch" patternUnits="userSpaceOnUse" width="6" height="6"'
        ' patternTransform="rotate(45)">'
        f'<rect width="6" height="6" fill="{colors.MASKED_FILL}"/>'
        f'<line x1="0" y1="0" x2="0" y2="6" stroke="{colors.MASKED_HATCH}" stroke-width="2"/>'
        "</pattern>",
        '<pattern id="hatch-over" patternUnits="userSpaceOnUse" width="6" height="6"'
        ' patternTransform="rotate(45)">'
        f'<line x1="0" y1="0" x2="0" y2="6" stroke="{colors.MASKED_HATCH}" stroke-width="1.5"/>'
        "</pattern>",
        _gradient(spec.kind),
        "</defs>",
        f'<rect width="{L.width:.1f}" height="{L.height:.1f}" fill="#ffffff"/>',
        f'<text x="{L.left:.1f}" y="22" font-size="15" font-weight="bold">'
        f"{escape(spec.title)}</text>",
    ]
    if not is_raster(spec):
        out += _vector_cells(spec, L, masked)
    elif cells:
        out += _image_cells(spec)
    out += _axes(spec, L)
    out += _colorbar(spec, L, bool(masked.any()), spec.leaked is not None)
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _vector_cells(spec: HeatmapSpec, L: Layout, masked: np.ndarray) -> list[str]:
    """One rectangle per cell, titled with its exact value; hatching, leaks and values."""
    rows, cols = spec.values.shape
    fills = colors.rgb(spec.values, spec.kind, spec.levels)
    out = ['<g id="cells" shape-rendering="crispEdges">']
    hatches = ['<g id="masked" shape-rendering="crispEdges">']
    for i in range(rows):
        y = L.top + i * L.cell
        for j in range(cols):
            v = float(spec.values[i, j])
            finite = math.isfinite(v)
            fill = _hex(fills[i, j]) if finite else "url(#hatch)"
            shown = repr(v) if finite else "−∞"
            label = f"{spec.row_labels[i]} → {spec.col_labels[j]}: {shown}"
            box = f'x="{L.left + j * L.cell:.2f}" y="{y:.2f}" width="{L.cell:.2f}"'
            out.append(
                f'<rect {box} height="{L.cell:.2f}" fill="{fill}"><title>{escape(label)}</title>'
                "</rect>"
            )
            if masked[i, j] and finite:  # set by the mask to a number: hatched over its colour
                hatches.append(f'<rect {box} height="{L.cell:.2f}" fill="url(#hatch-over)"/>')
    out.append("</g>")
    out += [*hatches, "</g>"]
    if spec.leaked is not None:
        out.append(f'<g id="leaks" fill="none" stroke="{colors.LEAK}" stroke-width="2">')
        for i, j in np.argwhere(spec.leaked):
            x, y = L.left + j * L.cell + 1.5, L.top + i * L.cell + 1.5
            size = L.cell - 3
            out.append(f'<rect x="{x:.2f}" y="{y:.2f}" width="{size:.2f}" height="{size:.2f}"/>')
        out.append("</g>")
    if L.value_font:
        out.append(f'<g id="values" font-size="{L.value_font:.1f}" text-anchor="middle">')
        for i in range(rows):
            for j in range(cols):
                finite = math.isfinite(spec.values[i, j])
                color = colors.text_color(fills[i, j]) if finite else "#000000"
                x, y = L.left + (j + 0.5) * L.cell, L.top + (i + 0.5) * L.cell
                text = colors.cell_text(float(spec.values[i, j]))
                out.append(
                    f'<text x="{x:.2f}" y="{y:.2f}" dy="0.35em" fill="{color}">{text}</text>'
                )
        out.append("</g>")
    return out


def cell_pixels(spec: HeatmapSpec) -> np.ndarray:
    """The cells as a (rows, cols, 3) uint8 image, one pixel per cell.

    The colour map, with masked cells shaded by the hatch grey at SHADE opacity (as the
    window shades cells too small to hatch) and leaked cells in the leak colour.
    """
    pixels = np.ascontiguousarray(colors.rgb(spec.values, spec.kind, spec.levels))
    grey = np.array(colors.hex_rgb(colors.MASKED_HATCH))
    shade = np.rint(np.arange(256)[:, None] * (1 - SHADE) + grey * SHADE).astype(np.uint8)
    np.copyto(pixels, shade[pixels, np.arange(3)], where=spec.hatched()[..., None])
    if spec.leaked is not None:
        pixels[spec.leaked] = colors.hex_rgb(colors.LEAK)
    return pixels


def png_bytes(pixels: np.ndarray) -> bytes:
    """An (h, w, 3) uint8 array as an 8-bit RGB PNG file (zlib only, no Qt)."""
    h, w, _ = pixels.shape
    rows = pixels.reshape(h, 3 * w)
    packer = zlib.compressobj(1)  # level 1: several times faster than 6, barely larger
    parts = []
    for top in range(0, h, 256):  # a block of rows at a time: no full copy of the image
        block = rows[top : top + 256]
        raw = np.zeros((len(block), 1 + 3 * w), dtype=np.uint8)  # filter type 0, then bytes
        raw[:, 1:] = block
        parts.append(packer.compress(raw.data))
    idat = b"".join([*parts, packer.flush()])

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(data, zlib.crc32(kind))
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    header = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)  # 8-bit RGB, not interlaced
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")
    )


def cell_box(spec: HeatmapSpec) -> tuple[float, float, float, float]:
    """Where the cells lie in the figure: x, y, width, height in SVG units."""
    L = layout(spec)
    rows, cols = spec.values.shape
    return L.left, L.top, cols * L.cell, rows * L.cell


def _image_cells(spec: HeatmapSpec) -> list[str]:
    """Every cell in one embedded PNG, one pixel per cell, scaled up without smoothing."""
    x, y, width, height = cell_box(spec)
    data = base64.b64encode(png_bytes(cell_pixels(spec))).decode("ascii")
    return [
        '<g id="cells">',
        f'<image x="{x:.2f}" y="{y:.2f}" width="{width:.2f}"'
        f' height="{height:.2f}" preserveAspectRatio="none"'
        ' image-rendering="optimizeSpeed"'  # no smoothing: Qt, Inkscape, browsers (crisp)
        f' xlink:href="data:image/png;base64,{data}"/>',
        "</g>",
    ]


def svg_size(svg: str) -> tuple[float, float]:
    """The width and height of an SVG document; ValueError unless it is well-formed XML.

    Every export checks its SVG this way before writing it, so a figure that an XML
    parser would refuse is an error, never a file.
    """
    try:
        root = ET.fromstring(svg)
    except ET.ParseError as e:
        raise ValueError(f"the image is not well-formed SVG ({e})") from None
    try:
        if root.tag != f"{{{SVG_NS}}}svg":
            raise ValueError
        width, height = float(root.get("width", "")), float(root.get("height", ""))
    except ValueError:
        raise ValueError("the image is not an SVG document with a width and height") from None
    return width, height


def _axes(spec: HeatmapSpec, L: Layout) -> list[str]:
    rows, cols = spec.values.shape
    step = _label_every(L.cell, L.label_font)
    out = [f'<g id="axes" font-size="{L.label_font:.1f}" fill="#222222">']
    for i in range(0, rows, step):
        y = L.top + (i + 0.5) * L.cell
        out.append(
            f'<text x="{L.left - 6:.1f}" y="{y:.2f}" dy="0.35em" text-anchor="end">'
            f"{escape(spec.row_labels[i])}</text>"
        )
    for j in range(0, cols, step):
        x = L.left + (j + 0.5) * L.cell
        label = escape(spec.col_labels[j])
        if L.rotate_cols:
            out.append(
                f'<text transform="translate({x:.2f},{L.top - 6:.1f}) rotate(-90)"'
                f' dy="0.35em">{label}</text>'
            )
        else:
            out.append(f'<text x="{x:.2f}" y="{L.top - 6:.1f}" text-anchor="middle">{label}</text>')
    grid_mid_y = L.top + rows * L.cell / 2
    out.append(
        f'<text transform="translate(14,{grid_mid_y:.1f}) rotate(-90)" text-anchor="middle"'
        f' font-style="italic" font-size="12">{escape(spec.row_title)}</text>'
    )
    out.append(
        f'<text x="{L.left + cols * L.cell / 2:.1f}" y="42" text-anchor="middle"'
        f' font-style="italic" font-size="12">{escape(spec.col_title)}</text>'
    )
    out.append("</g>")
    return out


def _gradient(kind: str) -> str:
    table = colors.SEQUENTIAL if kind == "sequential" else colors.DIVERGING
    parts = ['<linearGradient id="bar" x1="0" y1="1" x2="0" y2="0">']
    for k, color in enumerate(table):
        parts.append(f'<stop offset="{k / (len(table) - 1):.4f}" stop-color="{color}"/>')
    parts.append("</linearGradient>")
    return "".join(parts)


def _colorbar(spec: HeatmapSpec, L: Layout, any_masked: bool, any_leaked: bool) -> list[str]:
    rows, cols = spec.values.shape
    x = L.left + cols * L.cell + 20
    height = max(rows * L.cell, 60.0)
    lo, hi = spec.levels
    ticks = colorbar_ticks(spec)
    out = [
        '<g id="colorbar" font-size="11" fill="#222222">',
        f'<rect x="{x:.1f}" y="{L.top:.1f}" width="14" height="{height:.1f}" fill="url(#bar)"'
        ' stroke="#666666" stroke-width="0.5"/>',
    ]
    for t in ticks:
        y = L.top + (hi - t) / (hi - lo) * height
        out.append(f'<path d="M{x + 14:.1f},{y:.1f}h4" stroke="#666666"/>')
        out.append(f'<text x="{x + 21:.1f}" y="{y:.1f}" dy="0.35em">{tick_label(t)}</text>')
    y = L.top + height + 6
    image = is_raster(spec)  # the swatches look like the cells: vectors, or image pixels
    if any_masked:
        fill = f'"{colors.MASKED_HATCH}" fill-opacity="{SHADE:.3f}"' if image else '"url(#hatch)"'
        out.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="14" height="10" fill={fill}/>')
        out.append(f'<text x="{x + 18:.1f}" y="{y + 5:.1f}" dy="0.35em">masked</text>')
        y += 16
    if any_leaked:
        out.append(
            f'<rect x="{x:.1f}" y="{y:.1f}" width="14" height="10" fill="{colors.LEAK}"/>'
            if image
            else f'<rect x="{x + 1:.1f}" y="{y + 1:.1f}" width="12" height="8" fill="none"'
            f' stroke="{colors.LEAK}" stroke-width="2"/>'
        )
        out.append(f'<text x="{x + 18:.1f}" y="{y + 5:.1f}" dy="0.35em">leaked</text>')
    out.append("</g>")
    return out


GRADIENT_VIEWS = (*HEAD_MATRICES, *TURNED_MATRICES)  # the per-head views with a gradient


def gradient_spec(value: HeatmapSpec, gradient: np.ndarray, view: str, head: int,
                  mask: str, hidden: np.ndarray | None) -> HeatmapSpec:  # fmt: skip
    """The heatmap of dL/d(view) beside the view's own (``value``): its labels and hatched
    cells, a diverging map of its own levels. Under the zero mask the gradient that the
    scores softmax sees pass to hidden keys is outlined, as leaked weight is: it flows to
    the future keys (under −∞ it is exactly 0 there)."""
    spec = make_spec(
        f"head {head + 1} · dL/d{view}",
        gradient,
        value.row_labels,
        value.col_labels,
        value.row_title,
        value.col_title,
        "diverging",
        f"dL/d{view}",
    )
    leaked = None
    if mask == "causal-zero" and view == "masked" and hidden is not None:
        leaked = hidden & (gradient != 0)
    return dataclasses.replace(
        spec, masked=value.masked, leaked=leaked if leaked is not None and leaked.any() else None
    )
