"""`attnviz import --layer all|0-5|3`: several layers from one load of the model in one
.attn.npz (version 5), --dtype model, --weights-only, and the text from --text,
--text-file or standard input. Expected numbers come from the model itself, run here by
transformers (eager attention, float64 or the checkpoint's own precision)."""

from __future__ import annotations

import io
import sys

import numpy as np
import pytest

from attnviz.cli import main
from attnviz.core.io.files import FileFormatError, load_scenario
from attnviz.core.io.layers_files import load_layers
from attnviz.core.maths.forward import compute

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from offline_hub import offline  # noqa: E402, F401  (autouse)
from tiny_models import save_tiny, tiny, word_tokenizer  # noqa: E402

TEXT = "the big dog ran to the house"


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    return save_tiny("bert", tmp_path_factory.mktemp("models") / "bert")


def own_attention(folder, dtype, text=TEXT):
    """Every layer's attention weights, by transformers' own eager attention in dtype."""
    ids = word_tokenizer(True).encode(text).ids
    model = transformers.AutoModel.from_pretrained(
        str(folder), dtype=dtype, attn_implementation="eager"
    ).eval()
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), output_attentions=True)
    return [a[0].double().numpy() for a in out.attentions]


def test_all_layers_from_one_run_in_one_file(bert, tmp_path, capsys):
    out = tmp_path / "all.attn.npz"
    assert main(["import", str(bert), "--text", TEXT, "--layer", "all", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "imported layers 0-2 of 3" in printed and "in one run" in printed
    stack = load_layers(out)
    assert stack.stored == (0, 1, 2) and not stack.weights_only
    reference = own_attention(bert, torch.float64)
    for k, s in zip(stack.stored, stack.scenarios, strict=True):
        assert s.provenance.layer == k and s.tokens == stack.run.tokens
        np.testing.assert_allclose(compute(s).weights, reference[k], rtol=0, atol=1e-12)
    np.testing.assert_allclose(stack.every_layer(), np.stack(reference), rtol=0, atol=1e-7)
    with pytest.raises(FileFormatError, match=r"holds layers 0-2 of .*open it in the window"):
        load_scenario(out)


def test_a_range_keeps_the_overview_of_every_layer(bert, tmp_path):
    out = tmp_path / "r.attn.npz"
    assert main(["import", str(bert), "--text", TEXT, "--layer", "1-2", "--out", str(out)]) == 0
    stack = load_layers(out)
    assert stack.stored == (1, 2)
    with np.load(out) as archive:  # NumPy alone opens it
        assert archive["overview"].shape == (3, 4, 9, 9)
        assert archive["overview"].dtype == np.float32
    reference = own_attention(bert, torch.float64)
    np.testing.assert_allclose(stack.every_layer()[0], reference[0], rtol=0, atol=1e-7)


def test_one_layer_stays_a_scenario_file(bert, tmp_path):
    out = tmp_path / "one.attn.json"
    assert main(["import", str(bert), "--text", TEXT, "--layer", "2", "--out", str(out)]) == 0
    assert load_scenario(out).provenance.layer == 2


def test_weights_only_from_standard_input(bert, tmp_path, monkeypatch, capsys):
    out = tmp_path / "w.attn.npz"
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(TEXT.encode())))
    argv = ["import", str(bert), "-", "--layer", "0,2", "--weights-only", "--out", str(out)]
    assert main(argv) == 0
    assert "weights only" in capsys.readouterr().out
    reference = own_attention(bert, torch.float64)
    with np.load(out) as archive:
        assert not any(name.endswith(".X") or "W_Q" in name for name in archive.files)
        for k in (0, 2):
            weights = archive[f"layers.{k}.weights"]
            assert weights.dtype == np.float32
            np.testing.assert_array_equal(weights, reference[k].astype(np.float32))
    stack = load_layers(out)
    assert stack.weights_only and stack.run.text == TEXT


def test_a_weights_only_file_cannot_be_computed_or_edited(bert, tmp_path, capsys):
    out = tmp_path / "w.attn.npz"
    argv = ["import", str(bert), "--text", TEXT, "--layer", "1", "--weights-only"]
    assert main([*argv, "--out", str(out)]) == 0
    capsys.readouterr()
    for command in (["compute"], ["export", "--view", "weights", "--out", str(tmp_path / "a.svg")]):
        assert main([*command, str(out)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0
        assert "--weights-only" in err and "no matrices to compute or edit" in err


def test_dtype_model_keeps_the_checkpoints_own_precision(tmp_path, capsys):
    folder = tmp_path / "bf16"
    tiny("bert", torch.bfloat16).save_pretrained(folder)
    word_tokenizer(True).save(str(folder / "tokenizer.json"))
    out = tmp_path / "m.attn.npz"
    argv = ["import", str(folder), "--text", TEXT, "--layer", "all", "--dtype", "model"]
    assert main([*argv, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    stack = load_layers(out)
    assert stack.native == "bfloat16" and stack.dtype == "float64"
    native = own_attention(folder, torch.bfloat16)
    exact = own_attention(folder, torch.float64)
    for i, k in enumerate(stack.stored):
        np.testing.assert_array_equal(stack.native_weights[i], native[k].astype(np.float32))
        np.testing.assert_allclose(stack.weights[i], exact[k], rtol=0, atol=1e-12)
        assert stack.native_gap(i) == pytest.approx(np.abs(native[k] - exact[k]).max(), abs=1e-12)
    worst = max(np.abs(n - e).max() for n, e in zip(native, exact, strict=True))
    assert worst > 1e-4  # bfloat16 is visibly not float64
    assert f"own precision (bfloat16) differs from float64 by up to {worst:.1e}" in printed


def test_the_text_comes_from_one_place_only(bert, tmp_path, capsys):
    text_file = tmp_path / "t.txt"
    text_file.write_bytes(b"\xef\xbb\xbf" + TEXT.encode())
    out = tmp_path / "f.attn.npz"
    argv = ["import", str(bert), "--text-file", str(text_file), "--layer", "all"]
    assert main([*argv, "--out", str(out)]) == 0
    assert load_layers(out).run.text == TEXT
    capsys.readouterr()
    cases = [
        (["--layer", "0"], "give the text once: --text T, --text-file FILE or - "
         "(standard input); none was given"),
        (["--text", "a", "--text-file", str(text_file)], "give the text once"),
        (["nonsense", "--text", "a"], "unexpected argument 'nonsense'; give - to read"),
        (["--text-file", str(tmp_path / "missing.txt")], "--text-file"),
        (["--text", "x" * (2**19 + 1)], "--text: 524,289 characters; an import takes at most"),
        (["--text", "a", "--layer", "2-1"], "2-1: the range runs backwards"),
        (["--text", "a", "--layer", "first"], "expected all, a layer (3), a range (0-5)"),
        (["--text", "a", "--layer", "0-9"], "layer 9: the model has layers 0 to 2"),
        (["--text", "a", "--layer", "all", "--out", str(tmp_path / "x.attn.json")],
         "name it *.attn.npz"),
    ]  # fmt: skip
    for extra, message in cases:
        assert main(["import", str(bert), *extra]) == 2
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert message in err, (extra, err)
    assert not (tmp_path / "x.attn.json").exists()
