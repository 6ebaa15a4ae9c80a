"""Damaged or hostile model folders end in one line that names the problem, before any
weight is loaded: a pipe or a link loop among the files, a config nested too deeply or
claiming layers and shapes the weights do not have, names and text that are not UTF-8."""

from __future__ import annotations

import json
import os
import shutil
import sys

import pytest

pytest.importorskip("transformers")

from hang_guard import within
from offline_hub import offline  # noqa: F401  (autouse)
from tiny_models import save_tiny

from attnviz.cli import main


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    return {
        kind: save_tiny(kind, tmp_path_factory.mktemp(kind) / kind)
        for kind in ("gpt2", "bert", "llama")
    }


@pytest.fixture
def copy(saved, tmp_path):
    def make(kind: str, name: str = "model"):
        target = tmp_path / name
        shutil.copytree(saved[kind], target)
        return target

    return make


def refused(capsys, folder, *more: str) -> str:
    out = os.fsdecode(folder) + "-out.attn.json"
    with within(60):
        code = main(["import", os.fsdecode(folder), "--text", "the cat", "--out", out, *more])
    err = capsys.readouterr().err
    assert code == 2, err
    last = err.splitlines()[-1]  # after the steps' progress lines
    assert last.startswith("attnviz: ") and err.count("attnviz: ") == 1, err
    assert "Traceback" not in err and "above report" not in err
    assert not os.path.exists(out)
    return last


def edit_config(folder, **changes) -> None:
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes")
@pytest.mark.parametrize("name", ["model.safetensors", "config.json", "tokenizer.json"])
def test_a_pipe_among_the_files_is_named_not_waited_on(copy, capsys, name):
    folder = copy("gpt2")
    (folder / name).unlink()
    os.mkfifo(folder / name)
    err = refused(capsys, folder)
    assert name in err and "named pipe" in err


def test_a_link_loop_among_the_weights_is_named(copy, capsys):
    folder = copy("gpt2")
    (folder / "loop.safetensors").symlink_to(folder / "loop.safetensors")
    err = refused(capsys, folder)
    assert "loop.safetensors" in err and "symbolic links" in err


def test_a_config_nested_too_deeply_is_one_line(copy, capsys):
    folder = copy("gpt2")
    config = json.loads((folder / "config.json").read_text())
    text = json.dumps(config)[:-1] + ', "x": ' + "[" * 100_000 + "]" * 100_000 + "}"
    (folder / "config.json").write_text(text)
    assert "nested too deeply" in refused(capsys, folder)


def test_a_config_claiming_a_million_layers_is_refused_before_building_them(copy, capsys):
    folder = copy("gpt2")  # the checkpoint holds 3 layers
    edit_config(folder, n_layer=1_000_000)
    err = refused(capsys, folder)
    assert "1,000,000 layers" in err and "hold 3 layers" in err


def test_a_config_claiming_fewer_layers_than_the_weights_hold_is_refused(copy, capsys):
    folder = copy("gpt2")
    edit_config(folder, n_layer=1)  # transformers would drop layers 1 and 2 in silence
    assert "describes 1 layer and the weights hold 3 layers" in refused(capsys, folder)


@pytest.mark.parametrize(
    ("kind", "change", "named"),
    [
        ("gpt2", {"vocab_size": 60}, "wte.weight has shape 50 × 16, the config gives 60 × 16"),
        ("gpt2", {"n_positions": 64}, "wpe.weight has shape 32 × 16, the config gives 64 × 16"),
        ("bert", {"hidden_size": 32}, "LayerNorm.bias has shape 16, the config gives 32"),
        ("llama", {"head_dim": 8}, "k_proj.weight has shape 8 × 16, the config gives 16 × 16"),
    ],
)  # fmt: skip
def test_mismatched_weights_name_the_tensor_and_both_shapes(copy, capsys, kind, change, named):
    folder = copy(kind)
    edit_config(folder, **change)
    assert named in refused(capsys, folder)


@pytest.mark.skipif(sys.platform == "darwin", reason="macOS names are UTF-8 only")
def test_a_folder_name_that_is_not_utf8_is_named_as_such(copy, capsys, tmp_path):
    folder = copy("gpt2")
    odd = os.path.join(os.fsencode(tmp_path), b"mod\xffel")
    os.rename(folder, odd)
    err = refused(capsys, os.fsdecode(odd))
    assert "not UTF-8" in err and "tokenizer" not in err


def test_text_that_is_not_utf8_is_named(saved, capsys, tmp_path):
    text = os.fsdecode(b"the \xff cat")  # as a terminal passes such bytes in argv
    out = str(tmp_path / "x.attn.json")
    code = main(["import", str(saved["gpt2"]), "--text", text, "--out", out])
    err = capsys.readouterr().err
    assert code == 2 and "not UTF-8: character 5 is the byte 0xff" in err
    assert "Traceback" not in err and not os.path.exists(out)


def test_an_untouched_copy_still_imports(copy, capsys, tmp_path):
    folder = copy("gpt2")
    out = str(tmp_path / "ok.attn.json")
    assert main(["import", str(folder), "--text", "the cat", "--out", out]) == 0
    assert os.path.exists(out)
