"""attnviz export: the window's heatmap images, headless; and attnviz FILE."""

import subprocess
import sys
import xml.etree.ElementTree as ET

import numpy as np
import pytest
import reference as ref

from attnviz.cli import main

SVG = "{http://www.w3.org/2000/svg}"


def cells(path):
    root = ET.parse(path).getroot()
    group = next(g for g in root.iter(f"{SVG}g") if g.get("id") == "cells")
    return root, [(r, r.find(f"{SVG}title").text) for r in group.iter(f"{SVG}rect")]


def test_svg_export_holds_every_weight(tmp_path, capsys):
    out = tmp_path / "w.svg"
    assert main(["export", "--view", "weights", "--head", "2", "--out", str(out)]) == 0
    _, rects = cells(out)
    weights, _, _ = ref.multi_head(ref.X, ref.W_Q, ref.W_K, ref.W_V, ref.W_O)
    tokens = ["she", "saw", "the", "cat"]
    assert len(rects) == 16
    for k, (_, title) in enumerate(rects):
        i, j = divmod(k, 4)
        where, value = title.split(": ")
        assert where == f"{tokens[i]} → {tokens[j]}"
        assert float(value) == pytest.approx(weights[1][i, j], abs=1e-15)


def test_masked_cells_are_hatched_and_named(tmp_path, capsys):
    out = tmp_path / "m.svg"
    assert main(["export", "--view", "masked", "--out", str(out)]) == 0
    _, rects = cells(out)
    masked = [(r.get("fill"), t) for r, t in rects if t.endswith("−∞")]
    assert len(masked) == 6  # above the diagonal of a 4×4 causal mask
    assert all(fill == "url(#hatch)" for fill, _ in masked)


def test_png_export_size_follows_scale(tmp_path, capsys):
    svg, png = tmp_path / "q.svg", tmp_path / "q.png"
    assert (
        main(["export", "--preset", "stage-3-projections", "--view", "Q", "--out", str(svg)]) == 0
    )
    root = ET.parse(svg).getroot()
    width, height = float(root.get("width")), float(root.get("height"))
    args = ["export", "--preset", "stage-3-projections", "--view", "Q", "--scale", "1.5"]
    assert main([*args, "--out", str(png)]) == 0
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    w, h = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert (w, h) == (round(width * 1.5), round(height * 1.5))


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--view", "nope", "--out", "x.svg"], "--view"),
        (["--view", "Q", "--out", "x.gif"], "--format"),
        (["--view", "Q", "--head", "3", "--out", "x.svg"], "--head 3"),
        (["--view", "Q", "--scale", "0", "--out", "x.png"], "--scale"),
        (["--view", "Q", "--out", "/no/such/folder/x.svg"], "/no/such/folder"),
    ],
)
def test_bad_export_requests(capsys, tmp_path, monkeypatch, args, needle):
    monkeypatch.chdir(tmp_path)
    assert main(["export", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err


def test_export_matches_the_engine_for_a_file(tmp_path, capsys):
    from attnviz.core.io.files import save_scenario
    from attnviz.core.maths.scenario import Settings
    from attnviz.core.presets import worked_example

    path = tmp_path / "s.attn.json"
    save_scenario(path, worked_example(Settings(mask="none", scale=False)))
    out = tmp_path / "s.svg"
    assert main(["export", str(path), "--view", "scores", "--out", str(out)]) == 0
    _, rects = cells(out)
    Q, K = ref.X @ ref.W_Q[0], ref.X @ ref.W_K[0]
    values = np.array([float(t.split(": ")[1]) for _, t in rects]).reshape(4, 4)
    np.testing.assert_allclose(values, Q @ K.T, atol=1e-15)


def test_window_command_refuses_a_missing_file(tmp_path):
    run = subprocess.run(
        [sys.executable, "-m", "attnviz", str(tmp_path / "missing.attn.json")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2 and "no such file" in run.stderr and "Traceback" not in run.stderr


def test_code_command_prints_a_script_that_reproduces_the_output(tmp_path, capsys):
    assert main(["code", "--mask", "causal-zero"]) == 0
    script = tmp_path / "s.py"
    script.write_text(capsys.readouterr().out, "utf-8")
    run = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    lines = run.stdout.splitlines()
    rows = lines[lines.index("output") + 1 :]
    _, _, final = ref.multi_head(ref.X, ref.W_Q, ref.W_K, ref.W_V, ref.W_O, "causal-zero")
    got = np.array([[float(v) for v in row.strip("[]").split(",")] for row in rows])
    np.testing.assert_allclose(got, final, atol=1e-14)


def group(root, name: str) -> list:
    found = [g for g in root.iter(f"{SVG}g") if g.get("id") == name]
    return list(found[0].iter(f"{SVG}rect")) if found else []


@pytest.mark.parametrize(
    ("mask", "view", "hatched_over", "leaks"),
    [
        ("causal", "masked", 0, 0),  # −∞: hatched grey cells, nothing set to a number
        ("causal-zero", "masked", 6, 0),  # six future scores set to 0, hatched over colour
        ("causal-zero", "weights", 6, 6),  # their weights: hatched, and every one leaked
        ("causal", "weights", 6, 0),  # weight exactly 0: hatched, nothing leaked
        ("drop-after-softmax", "masked", 0, 0),  # scores untouched before softmax
        ("drop-after-softmax", "weights", 6, 0),
        ("none", "weights", 0, 0),
    ],
)
def test_svg_marks_masked_and_leaked_cells(tmp_path, capsys, mask, view, hatched_over, leaks):
    out = tmp_path / "m.svg"
    assert main(["export", "--view", view, "--mask", mask, "--out", str(out)]) == 0
    root, rects = cells(out)
    assert len(group(root, "masked")) == hatched_over
    outlined = group(root, "leaks")
    assert len(outlined) == leaks
    if leaks:  # the outlines sit on the future keys, and their weights are not zero
        w = ref.head(ref.X, ref.W_Q[0], ref.W_K[0], ref.W_V[0], mask)[1]
        cell = float(rects[1][0].get("width"))
        left, top = float(rects[0][0].get("x")), float(rects[0][0].get("y"))
        for r in outlined:
            i = int((float(r.get("y")) - top) // cell)
            j = int((float(r.get("x")) - left) // cell)
            assert j > i and w[i, j] > 0
        assert "leaked" in out.read_text()


@pytest.mark.parametrize("view", ["weights", "masked", "X", "final"])
def test_large_exports_embed_the_cells_as_one_image(tmp_path, capsys, view):
    n = 100  # 10,000 score cells: over the 64 × 64 cells drawn one by one
    args = ["export", "--preset", "gpt2-small", "--n", str(n), "--view", view]
    svg, png = tmp_path / "big.svg", tmp_path / "big.png"
    assert main([*args, "--out", str(svg)]) == 0
    root = ET.parse(svg).getroot()
    assert len(list(root.iter(f"{SVG}image"))) == 1 and not list(root.iter(f"{SVG}title"))
    cells = n * (n if view in ("weights", "masked") else 768)
    assert svg.stat().st_size < 4 * cells + 200_000
    assert main([*args, "--scale", "0.5", "--out", str(png)]) == 0
    data = png.read_bytes()
    w, h = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert (w, h) == (round(float(root.get("width")) * 0.5), round(float(root.get("height")) * 0.5))
    assert capsys.readouterr().out.count("wrote") == 2
