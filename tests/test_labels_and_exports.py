"""Token labels that terminals and XML can carry, and exports that are checked and bounded.

No Qt here. PNGs are decoded with the small reader below (written from the PNG
specification); expected colours are interpolated from the documented colour stops.
"""

from __future__ import annotations

import base64
import json
import struct
import xml.etree.ElementTree as ET
import zlib

import numpy as np
import pytest

from attnviz.cli import main
from attnviz.core.figures import colors
from attnviz.core.figures.figure import (
    VECTOR_CELLS,
    HeatmapSpec,
    layout,
    make_spec,
    png_bytes,
    spec_for,
    svg_size,
    to_svg,
)
from attnviz.core.io.files import (
    FileFormatError,
    load_scenario,
    load_snapshot,
    save_scenario,
    save_snapshot,
    scenario_to_dict,
)
from attnviz.core.maths.forward import compute
from attnviz.core.maths.positions import future_mask
from attnviz.core.maths.scenario import Scenario, ScenarioError, insert_token
from attnviz.core.presets import make_preset, worked_example

SVG = "{http://www.w3.org/2000/svg}"
XLINK = "{http://www.w3.org/1999/xlink}"

# Labels no scenario may hold: control characters (Cc), non-characters, lone surrogates.
BAD_LABELS = [
    ("\x1b[31mred", 0x1B),
    ("bell\x07", 0x07),
    ("a\x00b", 0x00),
    ("tab\there", 0x09),
    ("two\nlines", 0x0A),
    ("del\x7f", 0x7F),
    ("next\x85line", 0x85),
    ("\ufffe", 0xFFFE),
    ("x\uffff", 0xFFFF),
    ("\ufdd0", 0xFDD0),
    ("\ufdef", 0xFDEF),
    ("\U0001fffe", 0x1FFFE),
    ("\U0010ffff", 0x10FFFF),
    ("\ud800", 0xD800),
]
GOOD_LABELS = ["säß 🐈", "<&>\"'", "\ufffd", "a b", "👩\u200d💻", "\u00a0", "\ufdcf", "\ufdf0", ""]


def with_label(label: str, at: int = 1) -> Scenario:
    s = worked_example()
    tokens = list(s.tokens)
    tokens[at] = label
    return s.with_tokens(tokens)


# The rule, in the scenario: every way in is refused, naming the token. ------------------


@pytest.mark.parametrize(("label", "code"), BAD_LABELS)
def test_scenarios_refuse_unprintable_token_labels(label, code):
    with pytest.raises(ScenarioError) as caught:
        with_label(label)
    message = str(caught.value)
    assert message.startswith("tokens[2] ")
    assert f"U+{code:04X}" in message
    assert all(ch.isprintable() for ch in message), repr(message)  # shown escaped


@pytest.mark.parametrize(("label", "code"), BAD_LABELS[:4])
def test_inserting_a_token_with_such_a_label_is_refused(label, code):
    with pytest.raises(ScenarioError, match=f"tokens\\[1\\].*U\\+{code:04X}"):
        insert_token(worked_example(), 0, label)


@pytest.mark.parametrize("label", GOOD_LABELS)
def test_printable_labels_are_kept_and_exported(label, tmp_path, capsys):
    s = with_label(label)
    assert s.tokens[1] == label
    path = tmp_path / "s.attn.json"
    save_scenario(path, s)
    out = tmp_path / "w.svg"
    assert main(["export", str(path), "--view", "weights", "--out", str(out)]) == 0
    root = ET.parse(out).getroot()
    labels = [t.text or "" for t in root.iter(f"{SVG}text")]
    assert labels.count(label) == 2 or label == ""  # a row and a column label


@pytest.mark.parametrize(("label", "code"), BAD_LABELS)
def test_files_with_such_labels_do_not_load(label, code, tmp_path):
    data = scenario_to_dict(worked_example())
    data["tokens"][2] = label
    path = tmp_path / "bad.attn.json"
    path.write_text(json.dumps(data), "utf-8")  # ASCII JSON: \u escapes, even surrogates
    with pytest.raises(FileFormatError) as caught:
        load_scenario(path)
    assert "tokens[3]" in str(caught.value) and f"U+{code:04X}" in str(caught.value)


def test_snapshots_with_such_labels_do_not_load(tmp_path):
    path = tmp_path / "autosave.npz"
    save_snapshot(path, worked_example())
    with np.load(path) as archive:
        arrays = dict(archive)
    arrays["tokens"] = np.array(["she", "s\x1baw", "the", "cat"])
    np.savez(path, **arrays)
    with pytest.raises(FileFormatError, match="U\\+001B"):
        load_snapshot(path)


def bad_file(tmp_path, label: str = "\x1b[2J\x1b[31mred\x07"):
    data = scenario_to_dict(worked_example())
    data["tokens"][1] = label
    path = tmp_path / "bad.attn.json"
    path.write_text(json.dumps(data, ensure_ascii=False), "utf-8")
    return path


@pytest.mark.parametrize(
    "command",
    [
        ["compute"],
        ["compute", "--format", "json"],
        ["explain", "--matrix", "weights", "--head", "1", "--row", "1", "--col", "1"],
        ["code"],
        ["export", "--view", "weights", "--out", "{out}.svg"],
        ["export", "--view", "weights", "--out", "{out}.png"],
    ],
)
def test_commands_refuse_such_files_without_printing_escapes(command, tmp_path, capsys):
    path = bad_file(tmp_path)
    out = str(tmp_path / "fig")
    argv = [command[0], str(path), *(a.replace("{out}", out) for a in command[1:])]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and "tokens[2]" in captured.err
    assert "\x1b" not in captured.err and "\x07" not in captured.err
    assert "U+001B" in captured.err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.attn.json"]


def test_error_messages_escape_control_characters(tmp_path, capsys):
    missing = tmp_path / "a\x1b[31mb.attn.json"
    assert main([str(missing)]) == 2  # the window command, on a file that is not there
    err = capsys.readouterr().err
    assert "\x1b" not in err and "a\\x1b[31mb.attn.json: no such file" in err
    assert main(["compute", str(missing)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "\x1b" not in err and "\\x1b" in err


# Every export checks what it wrote. ------------------------------------------------------


def test_svg_size_reads_well_formed_svg_only():
    assert svg_size('<svg xmlns="http://www.w3.org/2000/svg" width="30" height="20"/>') == (
        30.0,
        20.0,
    )
    for broken in (
        '<svg xmlns="http://www.w3.org/2000/svg" width="3" height="2"><text>\x1b</text></svg>',
        '<svg xmlns="http://www.w3.org/2000/svg" width="3" height="2"><text>a</svg>',
        '<html width="3" height="2"/>',
        '<svg xmlns="http://www.w3.org/2000/svg"/>',
        "",
    ):
        with pytest.raises(ValueError, match="SVG"):
            svg_size(broken)


def test_a_malformed_figure_is_an_error_not_a_file(tmp_path, capsys, monkeypatch):
    import attnviz.core.figures.figure as figure

    spec = make_spec("t", np.eye(2), ("ok", "\x1b"))  # past the scenario's check
    monkeypatch.setattr(figure, "to_svg", lambda _: to_svg(spec))
    out = tmp_path / "w.svg"
    assert main(["export", "--view", "weights", "--out", str(out)]) == 2
    captured = capsys.readouterr()
    assert "wrote" not in captured.out and "not well-formed" in captured.err
    assert not list(tmp_path.iterdir())


# Large heatmaps: one image of the cells, one pixel each. ---------------------------------


def read_png(data: bytes) -> np.ndarray:
    """An 8-bit RGB PNG (filters None and Up) as an (h, w, 3) uint8 array; checks CRCs."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, header = 8, b"", None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        body = data[pos + 8 : pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length : pos + 12 + length])
        assert crc == zlib.crc32(kind + body), kind
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    assert kind == b"IEND" and header is not None
    w, h, depth, colour, _, _, interlace = header
    assert (depth, colour, interlace) == (8, 2, 0)
    raw = np.frombuffer(zlib.decompress(idat), np.uint8).reshape(h, 1 + 3 * w)
    rows = np.zeros((h, 3 * w), np.uint8)
    above = np.zeros(3 * w, np.uint8)
    for y in range(h):
        kind_of_filter, line = raw[y, 0], raw[y, 1:]
        assert kind_of_filter in (0, 2)
        rows[y] = line if kind_of_filter == 0 else line + above  # uint8: modulo 256
        above = rows[y]
    return rows.reshape(h, w, 3)


def colour_map(values: np.ndarray, table: tuple[str, ...], lo: float, hi: float) -> np.ndarray:
    """Linear interpolation between evenly spaced stops (floats, 0–255)."""
    stops = np.array([[int(c[k : k + 2], 16) for k in (1, 3, 5)] for c in table], float)
    pos = np.clip((values - lo) / (hi - lo), 0, 1) * (len(stops) - 1)
    i = np.minimum(pos.astype(int), len(stops) - 2)
    f = (pos - i)[..., None]
    return stops[i] * (1 - f) + stops[i + 1] * f


def hex_rgb(colour: str) -> np.ndarray:
    return np.array([int(colour[k : k + 2], 16) for k in (1, 3, 5)], float)


def near(pixels: np.ndarray, expected: np.ndarray) -> None:
    """Equal but for the colour map's 1024 levels (at most 2 steps of 255)."""
    np.testing.assert_allclose(pixels.astype(float), expected, rtol=0, atol=2)


def shaded(rgb: np.ndarray) -> np.ndarray:
    """The hatch grey at 110/255 over rgb: masked cells too small to hatch."""
    a = 110 / 255
    return rgb * (1 - a) + hex_rgb(colors.MASKED_HATCH) * a


def embedded(svg: str) -> tuple[ET.Element, ET.Element, np.ndarray]:
    """The root, the one <image> and its decoded pixels."""
    root = ET.fromstring(svg)
    images = list(root.iter(f"{SVG}image"))
    assert len(images) == 1
    href = images[0].get(f"{XLINK}href")
    assert href.startswith("data:image/png;base64,")
    return root, images[0], read_png(base64.b64decode(href.split(",", 1)[1]))


def test_png_bytes_reads_back_exactly():
    rng = np.random.default_rng(1)
    pixels = rng.integers(0, 256, (300, 53, 3), dtype=np.uint8)  # blocks of 256 rows
    np.testing.assert_array_equal(read_png(png_bytes(pixels)), pixels)


@pytest.mark.parametrize(
    ("shape", "image"), [((64, 64), False), ((65, 64), True), ((2, 2048), False), ((3, 2048), True)]
)
def test_up_to_4096_cells_are_vector_and_more_are_one_image(shape, image):
    values = np.random.default_rng(2).normal(size=shape)
    spec = make_spec("t", values, tuple(f"r{i}" for i in range(shape[0])))
    root = ET.fromstring(to_svg(spec))
    cells = next(g for g in root.iter(f"{SVG}g") if g.get("id") == "cells")
    assert values.size > VECTOR_CELLS if image else values.size <= VECTOR_CELLS
    assert len(list(cells.iter(f"{SVG}image"))) == int(image)
    assert len(list(cells.iter(f"{SVG}rect"))) == (0 if image else values.size)


def test_a_2048_token_figure_is_one_bounded_image_of_the_colour_map():
    n = 2048
    rng = np.random.default_rng(3)
    values = rng.uniform(-4.0, 4.0, (n, n))
    values[future_mask(n)] = -np.inf
    tokens = tuple(f"t{i + 1}" for i in range(n))
    spec = HeatmapSpec("big", values, tokens, tokens, "query", "key", "diverging", (-4.0, 4.0))
    svg = to_svg(spec)
    # The old figure was 515 MB; now at most 4 bytes a cell (base64 of raw RGB) and labels.
    assert len(svg.encode()) < 4 * n * n + 500_000
    root, image, pixels = embedded(svg)
    assert sum(1 for _ in root.iter()) < 2_000  # labels every few cells, not one per cell
    assert pixels.shape == (n, n, 3)
    L = layout(spec)
    assert L.cell == 1.0 and float(image.get("width")) == n and float(image.get("height")) == n
    assert (float(image.get("x")), float(image.get("y"))) == (round(L.left, 2), round(L.top, 2))
    assert image.get("image-rendering") == "optimizeSpeed"  # one pixel per cell, no blur
    lower = ~future_mask(n)
    expected = colour_map(values[lower], colors.DIVERGING, -4.0, 4.0)
    near(pixels[lower], expected)
    # −∞ is the masked grey, shaded; every one of them.
    grey = np.rint(shaded(hex_rgb(colors.MASKED_FILL)))
    assert (pixels[future_mask(n)] == grey).all()
    # And exactly the documented colour map, colors.rgb, on the kept cells.
    np.testing.assert_array_equal(pixels[lower], colors.rgb(values, "diverging", (-4, 4))[lower])


@pytest.mark.parametrize("mask", ["causal", "causal-zero", "drop-after-softmax", "none"])
def test_masked_and_leaked_cells_show_in_the_image(mask):
    s = make_preset("gpt2-small", 80, 0).with_settings(mask=mask)  # 6400 cells: an image
    result = compute(s)
    future = future_mask(80)
    weights = result.matrix("weights", 0)
    _, _, pixels = embedded(to_svg(spec_for(result, "weights", 0)))
    colour = colour_map(weights, colors.SEQUENTIAL, 0.0, 1.0)
    leaked = future & (weights != 0) if mask != "none" else np.zeros_like(future)
    masked = future & ~leaked if mask != "none" else np.zeros_like(future)
    plain = ~future if mask != "none" else np.ones_like(future)
    near(pixels[plain], colour[plain])
    near(pixels[masked], shaded(colour[masked]))
    assert (pixels[leaked] == hex_rgb(colors.LEAK)).all()
    assert leaked.any() == (mask == "causal-zero")
    legend = [
        t.text for t in ET.fromstring(to_svg(spec_for(result, "weights", 0))).iter(f"{SVG}text")
    ]
    assert ("leaked" in legend) == (mask == "causal-zero")
    assert ("masked" in legend) == (mask != "none")


def test_masked_scores_set_to_zero_are_shaded_in_the_image():
    result = compute(make_preset("gpt2-small", 80, 0).with_settings(mask="causal-zero"))
    spec = spec_for(result, "masked", 0)
    _, _, pixels = embedded(to_svg(spec))
    future = future_mask(80)
    lo, hi = spec.levels
    zero = shaded(colour_map(np.zeros(1), colors.DIVERGING, lo, hi)[0])
    near(pixels[future], np.broadcast_to(zero, (future.sum(), 3)))
    scaled = result.matrix("scaled", 0)
    near(pixels[~future], colour_map(scaled, colors.DIVERGING, lo, hi)[~future])


def test_screen_colours_are_the_colour_map_and_grey_for_anything_not_finite():
    """colors.argb (the window's pixels) against the map interpolated here, for finite
    values, values past the levels, huge ones, ±∞ and NaN (grey), in one matrix."""
    rng = np.random.default_rng(8)
    values = rng.uniform(-5.0, 5.0, (40, 30))
    specials = [np.inf, -np.inf, np.nan, 1e308, -1e308, 7.0]
    for k, v in enumerate(specials):
        values[3 * k, k] = v
    words = colors.argb(values, "diverging", (-4.0, 4.0))
    got = np.stack([(words >> 16) & 255, (words >> 8) & 255, words & 255], axis=-1)
    assert ((words >> 24) == 255).all()
    finite = np.isfinite(values)
    expected = colour_map(np.where(finite, values, 0), colors.DIVERGING, -4.0, 4.0)
    near(got[finite], expected[finite])
    assert (got[~finite] == hex_rgb(colors.MASKED_FILL)).all()
    assert (~finite).sum() == 3


def test_the_masked_view_shares_the_scaled_views_levels_and_any_new_array_gets_its_own():
    def nice(top: float) -> float:  # the smallest of 1, 1.5, 2, … 8 × 10^k at least top
        steps = (1, 1.5, 2, 2.5, 3, 4, 5, 6, 8)
        return min(c * 10.0**e for e in range(-4, 6) for c in steps if c * 10.0**e >= top)

    s = make_preset("gpt2-small", n=24)
    result = compute(s)
    top = float(np.abs(result.heads[2].scaled).max())
    for view in ("scaled", "masked", "masked"):  # the masked view's −∞ are not counted
        assert spec_for(result, view, 2).levels == pytest.approx((-nice(top), nice(top)))
    edited = compute(s.with_cells("W_Q", 2, 0, 0, np.array([[40.0]])))
    top = float(np.abs(edited.heads[2].scaled).max())
    for view in ("masked", "scaled"):  # a new array: its own levels, not the last ones
        assert spec_for(edited, view, 2).levels == pytest.approx((-nice(top), nice(top)))


@pytest.mark.parametrize("kind, lims", [("diverging", (-2.0, 2.0)), ("sequential", (0.0, 1.0))])
def test_numbers_are_black_on_light_cells_and_white_on_dark_ones(kind, lims):
    """The text colour the window prints a cell's number in (colors.dark_text_on): black
    where the cell's colour has a relative luminance above one half (by hand, from the
    documented colours), black on the grey of anything not finite."""
    rng = np.random.default_rng(4)
    values = rng.uniform(-3.0, 3.0, (30, 20))
    values[0, :4] = [np.inf, -np.inf, np.nan, 1e300]
    fills = colors.rgb(values, kind, lims).astype(float)
    luminance = (0.2126 * fills[..., 0] + 0.7152 * fills[..., 1] + 0.0722 * fills[..., 2]) / 255
    expected = (luminance > 0.5) | ~np.isfinite(values)
    got = colors.dark_text_on(values, kind, lims)
    np.testing.assert_array_equal(got, expected)
    assert 0 < got.sum() < got.size  # both colours occur


def test_an_array_written_again_has_its_colour_scale_found_afresh():
    """Views remember the extremes of read-only arrays; one made writeable and changed is
    looked at again, not taken for the array it was."""
    result = compute(make_preset("gpt2-small", n=8))
    X = result.X
    assert not X.flags.writeable
    top = spec_for(result, "X").levels[1]
    X.flags.writeable = True
    X[0, 0] = 1000 * top
    assert spec_for(result, "X").levels[1] >= 1000 * top
