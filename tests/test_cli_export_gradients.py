"""attnviz export --view d<view>: a gradient heatmap, titled as the Pipeline's, each cell
autograd's gradient (backward_reference.py) for the scenario's own loss."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import backward_reference as ref  # noqa: E402
from test_cli_export import SVG, cells  # noqa: E402

from attnviz.cli import main  # noqa: E402
from attnviz.core.io.files import save_scenario  # noqa: E402
from attnviz.core.maths.scenario import Scenario, Settings  # noqa: E402
from attnviz.core.presets import make_preset, worked_example  # noqa: E402


def autograd(s: Scenario) -> dict:
    """Every intermediate of the layer in torch, after L.backward() for s's own loss."""
    leaves, inter = ref.forward(s, None)
    st = s.settings
    X = np.asarray(s.X)
    T = {"previous-token": np.concatenate([X[:1], X[:-1]]), "copy-self": X,
         "first-token": np.repeat(X[:1], len(X), axis=0)}[st.loss_target]  # fmt: skip
    ref.loss_of(s, inter["final"], leaves["X"], st.loss, T, st.loss_cell).backward()
    return inter


def exported(tmp_path, s: Scenario, view: str, head: int, capsys) -> tuple[str, np.ndarray]:
    """The SVG's title and its cells' values (their tooltips), as a matrix."""
    path, out = tmp_path / "s.attn.json", tmp_path / "g.svg"
    save_scenario(path, s)
    assert main(["export", str(path), "--view", view, "--head", str(head), "--out", str(out)]) == 0
    assert capsys.readouterr().out.startswith(f"wrote {out}")
    root, rects = cells(out)
    texts = [t.text for t in root.iter(f"{SVG}text")]
    values = [float(title.rsplit(": ", 1)[1]) for _, title in rects]
    rows = len({r.get("y") for r, _ in rects})
    return " ".join(texts), np.array(values).reshape(rows, -1)


@pytest.mark.parametrize(
    ("s", "view", "head", "title"),
    [
        (worked_example(), "dweights", 2, "head 2 · dL/dweights"),
        (
            worked_example(Settings(mask="causal-zero", loss="cell", loss_cell=(3, 1))),
            "dmasked",
            1,
            "head 1 · dL/dmasked",
        ),
        (
            make_preset("llama-style").with_settings(loss="next-token"),
            "dQ_rot",
            3,
            "head 3 · dL/dQ_rot",
        ),
        (make_preset("llama-style"), "dV", 2, "head 2 · dL/dV"),
        (worked_example(Settings(loss_target="first-token")), "dconcat", 1, "dL/dconcat"),
        (worked_example(Settings(loss="next-token")), "dfinal", 1, "dL/dfinal"),
    ],
)
def test_gradient_svg_cells_are_autograd_s(tmp_path, capsys, s, view, head, title):
    text, values = exported(tmp_path, s, view, head, capsys)
    assert title in text
    inter = autograd(s)
    name = view[1:]
    tensor = inter[name] if name in ("concat", "final") else inter[name][head - 1]
    want = tensor.grad.numpy()
    np.testing.assert_allclose(values, want, rtol=0, atol=1e-12 * np.abs(want).max())


def test_gradient_png_is_written(tmp_path, capsys):
    out = tmp_path / "g.png"
    assert main(["export", "--view", "dscores", "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "(head 1 · dL/dscores)" in capsys.readouterr().out


def test_a_bad_view_is_one_line_listing_the_gradients_too(tmp_path, capsys):
    assert main(["export", "--view", "dwieghts", "--out", str(tmp_path / "x.svg")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    for name in ("weights", "dweights", "dQ", "dscores", "dconcat", "dfinal"):
        assert f" {name}," in err or err.rstrip().endswith(f" {name}")
    assert not (tmp_path / "x.svg").exists()
