"""Importing a layer from a model folder, the cache or a package, offline, end to end."""

from __future__ import annotations

import hashlib
import json
import sys

import numpy as np
import pytest

from attnviz.core.maths.forward import compute
from attnviz.core.maths.scenario import ScenarioError

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from tiny_models import KINDS, LLAMA_KINDS, WORDS, fake_package, save_tiny  # noqa: E402

from attnviz.core.models.importer import Request, import_model_layer  # noqa: E402
from attnviz.core.models.sources import Cancelled, SourceError, locate  # noqa: E402

TEXT = "the cat sat on the mat"


@pytest.fixture(autouse=True)
def offline(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def reference(folder, layer: int, ids: list[int]) -> np.ndarray:
    """The model's own eager attention weights, loaded and run here independently."""
    model = transformers.AutoModel.from_pretrained(
        folder, dtype=torch.float64, attn_implementation="eager"
    ).eval()
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), output_attentions=True)
    return out.attentions[layer][0].numpy()


@pytest.mark.parametrize("kind", KINDS)
def test_every_layer_of_a_saved_model_imports_and_matches_the_model(kind, tmp_path):
    folder = save_tiny(kind, tmp_path / kind)
    bert = kind in ("bert", "roberta", "distilbert")
    words = TEXT.split()
    ids = [WORDS.index(w) + 3 for w in words]
    if bert:
        ids = [1, *ids, 2]
    layers = json.loads((folder / "config.json").read_text()).get("num_hidden_layers") or 3
    for layer in range(layers):
        got = import_model_layer(Request(str(folder), TEXT, layer))
        s, p = got.scenario, got.provenance
        assert s.tokens == (("[CLS]", *words, "[SEP]") if bert else tuple(words))
        assert got.tokens.special == ((True, *[False] * 6, True) if bert else (False,) * 6)
        assert p.token_ids == tuple(ids) and p.layer == layer and p.layers == layers
        assert (p.kind, p.source, p.text, p.model_type) == ("folder", str(folder), TEXT, kind)
        digest = hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest()
        assert p.files == (("model.safetensors", digest),)
        r = compute(s)
        assert got.agreement_weights <= 1e-12 and got.agreement_output <= 1e-12
        np.testing.assert_allclose(r.weights, p.model_weights, rtol=0, atol=1e-12)
        np.testing.assert_allclose(r.final, p.model_output, rtol=0, atol=1e-12)
        # transformers' own eager attention takes the Llama family's softmax in float32
        tolerance = 1e-6 if kind in LLAMA_KINDS else 1e-12
        np.testing.assert_allclose(r.weights, reference(folder, layer, ids), atol=tolerance)
        assert got.overview.shape == (layers, s.n_heads, s.n, s.n)
        np.testing.assert_allclose(got.overview[layer], p.model_weights, atol=1e-7)


def test_a_float32_import_agrees_to_float32_rounding(tmp_path):
    folder = save_tiny("llama", tmp_path / "llama")
    got = import_model_layer(Request(str(folder), TEXT, 1, dtype="float32"))
    assert 0 < got.agreement_weights <= 1e-5 and got.agreement_output <= 1e-5


def test_wrong_requests_are_refused_with_a_message(tmp_path):
    folder = save_tiny("bert", tmp_path / "bert")
    with pytest.raises(ScenarioError, match="layers 0 to 2"):
        import_model_layer(Request(str(folder), TEXT, 3))
    with pytest.raises(ScenarioError, match="text is empty"):
        import_model_layer(Request(str(folder), "   ", 0))
    with pytest.raises(ScenarioError, match="makes 42 tokens; at most 32"):
        import_model_layer(Request(str(folder), " ".join(["cat"] * 40), 0))
    with pytest.raises(ScenarioError, match="dtype 'float16'"):
        import_model_layer(Request(str(folder), TEXT, 0, dtype="float16"))
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "model_type": "mamba"}))
    with pytest.raises(ScenarioError, match="model type 'mamba'"):
        import_model_layer(Request(str(folder), TEXT, 0))


def test_folders_that_are_not_models_are_named(tmp_path):
    folder = save_tiny("gpt2", tmp_path / "gpt2")
    (folder / "tokenizer.json").unlink()
    with pytest.raises(SourceError, match=r"lacks tokenizer\.json"):
        locate(str(folder))
    (folder / "model.safetensors").rename(folder / "pytorch_model.bin")
    with pytest.raises(SourceError, match="pickled weights"):
        locate(str(folder))
    with pytest.raises(SourceError, match="not a folder"):
        locate(str(folder / "config.json"))


def test_offline_with_nothing_cached_is_one_clear_message():
    with pytest.raises(SourceError, match="not in the Hugging Face cache, and downloads are off"):
        locate("nobody/no-such-model")
    with pytest.raises(SourceError, match="no such folder, and not a model id"):
        locate("not a model id!")


def test_an_unreachable_hub_is_a_message_not_a_hang(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    with pytest.raises(SourceError, match="could not fetch it from the Hugging Face Hub"):
        locate("nobody/no-such-model")


def test_a_model_in_the_hugging_face_cache_is_found_by_its_id(tmp_path):
    revision = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--someone--tiny-gpt2"
    save_tiny("gpt2", repo / "snapshots" / revision)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    got = import_model_layer(Request("someone/tiny-gpt2", TEXT, 1))
    assert (got.provenance.kind, got.provenance.source) == ("cache", "someone/tiny-gpt2")
    assert got.agreement_weights <= 1e-12


def test_an_installed_package_bundling_a_zipped_model_is_unpacked_once(tmp_path, monkeypatch):
    folder = save_tiny("bert", tmp_path / "bert")
    entries = {f"{p.name}": p.read_bytes() for p in folder.iterdir()}
    entries["1_Pooling/config.json"] = b"{}"  # sentence-transformers' extra folder
    fake_package(tmp_path / "site", "tiny-bert-model", entries)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    got = import_model_layer(Request("tiny-bert-model", TEXT, 2))
    assert got.provenance.kind == "package" and got.agreement_weights <= 1e-12
    unpacked = locate("tiny-bert-model").folder
    assert unpacked.is_relative_to(tmp_path / "cache" / "attnviz")
    stamp = (unpacked / "model.safetensors").stat().st_mtime_ns
    assert locate("tiny-bert-model").folder == unpacked
    assert (unpacked / "model.safetensors").stat().st_mtime_ns == stamp  # not unpacked again
    assert [p.name for p in unpacked.parent.iterdir() if p.name.startswith(".")] == []
    assert "tiny_bert_model" not in sys.modules


def test_a_package_with_an_unsafe_archive_is_refused_and_leaves_nothing(tmp_path, monkeypatch):
    fake_package(tmp_path / "site", "evil-model", {"config.json": b"{}", "../escape": b"x"})
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    with pytest.raises(SourceError, match="unsafe path"):
        locate("evil-model")
    assert not (tmp_path / "cache" / "escape").exists()
    assert list((tmp_path / "cache" / "attnviz" / "packages").iterdir()) == []


def test_cancelling_stops_the_import(tmp_path):
    folder = save_tiny("gpt2", tmp_path / "gpt2")
    steps = []
    with pytest.raises(Cancelled):
        import_model_layer(
            Request(str(folder), TEXT, 0),
            report=lambda what, _: steps.append(what),
            cancelled=lambda: len(steps) >= 2,
        )
    assert steps == ["Finding the model", "Reading the tokenizer"]


def test_peek_previews_tokens_and_problems_without_reading_weights(tmp_path):
    from attnviz.core.models.importer import peek

    folder = save_tiny("distilbert", tmp_path / "distilbert")
    got = peek(str(folder), "the red cat")
    assert (got.model_type, got.layers, got.problem) == ("distilbert", 3, "")
    assert got.tokens.labels == ("[CLS]", "the", "red", "cat", "[SEP]")
    assert peek(str(folder), "  ").tokens is None
    assert "makes 42 tokens" in peek(str(folder), " ".join(["cat"] * 40)).problem
    (folder / "model.safetensors").write_bytes(b"not read by a peek")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "model_type": "mamba"}))
    assert "model type 'mamba'" in peek(str(folder), "the cat").problem
    with pytest.raises(SourceError, match="not in the Hugging Face cache; no installed package"):
        peek("nobody/nothing", "the cat")  # and nothing is fetched


def test_download_progress_reports_bytes_and_cancel_stops_it():
    from attnviz.core.models.sources import _bar

    seen, stop = [], []
    Bar = _bar(lambda done, total: seen.append((done, total)), lambda: bool(stop))
    bar = Bar(total=2000, unit="B")  # as huggingface_hub makes one per file
    bar.update(500)
    bar.update(700)
    assert seen == [(500, 2000), (1200, 2000)]
    stop.append(True)
    with pytest.raises(Cancelled):
        bar.update(100)
    bar.close()
    assert seen[-1] == (1200, 2000)


# What an adversarial review found -------------------------------------------------------


def test_a_checkpoint_missing_weights_is_refused_not_filled_with_random_numbers(tmp_path):
    from safetensors.numpy import load_file, save_file

    folder = save_tiny("bert", tmp_path / "bert")
    weights = load_file(folder / "model.safetensors")
    name = next(k for k in weights if "layer.1.attention.self.query.weight" in k)
    del weights[name]
    save_file(weights, folder / "model.safetensors")
    with pytest.raises(ScenarioError, match=r"missing: .*layer\.1\.attention\.self\.query"):
        import_model_layer(Request(str(folder), TEXT, 0))

    more = save_tiny("gpt2", tmp_path / "gpt2")  # a config asking for more layers than saved
    config = json.loads((more / "config.json").read_text())
    (more / "config.json").write_text(json.dumps({**config, "n_layer": 5}))
    with pytest.raises(ScenarioError, match="describes 5 layers and the weights hold 3 layers"):
        import_model_layer(Request(str(more), TEXT, 4))


@pytest.mark.parametrize(
    "content", [b"", b"abcd", b"\x10\x00\x00\x00\x00\x00\x00\x00[1, 2, 3]       "]
)
def test_a_damaged_safetensors_header_is_named(tmp_path, content):
    folder = save_tiny("gpt2", tmp_path / "gpt2")
    (folder / "model.safetensors").write_bytes(content)
    with pytest.raises(ScenarioError, match=r"model\.safetensors: not a safetensors file"):
        import_model_layer(Request(str(folder), TEXT, 0))


def test_a_tokenizer_that_does_not_match_the_model_is_named(tmp_path):
    folder = save_tiny("bert", tmp_path / "bert")
    tokenizer = json.loads((folder / "tokenizer.json").read_text())
    tokenizer["model"]["vocab"]["cat"] = 4000
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer))
    with pytest.raises(ScenarioError, match="token 'cat' has id 4000; the model's vocabulary"):
        import_model_layer(Request(str(folder), TEXT, 0))


def test_zero_layers_and_typos_in_local_paths_are_named(tmp_path, monkeypatch):
    folder = save_tiny("bert", tmp_path / "bert")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 0}))
    with pytest.raises(ScenarioError, match="number of layers is 0"):
        import_model_layer(Request(str(folder), TEXT, 0))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SourceError, match="bertt: no such folder"):
        locate("bert/bertt")  # "bert" is a folder here: not a Hub id
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    with pytest.raises(SourceError, match="a link that leads to no folder"):
        locate("loop")


def test_changed_weights_are_read_again_not_served_from_memory(tmp_path):
    folder = save_tiny("gpt2", tmp_path / "gpt2")
    first = import_model_layer(Request(str(folder), TEXT, 0))
    other = save_tiny("gpt2", tmp_path / "other")  # the same seed: change the weights
    from safetensors.numpy import load_file, save_file

    weights = load_file(other / "model.safetensors")
    for k in weights:
        if k.endswith("c_attn.weight"):
            weights[k] = weights[k] * 2
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    second = import_model_layer(Request(str(folder), TEXT, 0))
    np.testing.assert_allclose(second.scenario.W_Q, 2 * first.scenario.W_Q, rtol=1e-12)
    assert second.provenance.files != first.provenance.files


def test_qwen2_windows_only_the_layers_its_config_names(tmp_path):
    import torch

    torch.manual_seed(3)
    config = transformers.Qwen2Config(
        vocab_size=50,
        hidden_size=16,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=32,
        max_position_embeddings=64,
        use_sliding_window=True,
        sliding_window=2,
        max_window_layers=1,
    )
    folder = tmp_path / "qwen2"
    transformers.Qwen2Model(config).save_pretrained(folder)
    from tiny_models import word_tokenizer

    word_tokenizer(False).save(str(folder / "tokenizer.json"))
    masks = []
    for layer in range(3):
        got = import_model_layer(Request(str(folder), TEXT, layer))
        assert got.agreement_weights <= 1e-12
        masks.append((got.scenario.settings.mask, got.scenario.settings.window))
    types = config.layer_types
    expected = [
        ("sliding-window", 2) if t == "sliding_attention" else ("causal", None) for t in types
    ]
    assert [(m, w if m == "sliding-window" else None) for m, w in masks] == expected
    assert {m for m, _ in masks} == {"causal", "sliding-window"}  # both kinds were tried


def test_a_corrupt_bundled_zip_and_concurrent_unpacking(tmp_path, monkeypatch):
    import threading

    fake_package(tmp_path / "site", "broken-model", {})
    (tmp_path / "site" / "broken_model" / "model.zip").write_bytes(b"not a zip at all")
    folder = save_tiny("bert", tmp_path / "bert")
    fake_package(
        tmp_path / "site", "tiny-model", {p.name: p.read_bytes() for p in folder.iterdir()}
    )
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    with pytest.raises(SourceError, match=r"bundled model\.zip is not a readable zip"):
        locate("broken-model")
    found, errors = [], []

    def one():
        try:
            found.append(locate("tiny-model").folder)
        except Exception as e:
            errors.append(e)

    threads = [threading.Thread(target=one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(set(found)) == 1
    assert (found[0] / "model.safetensors").read_bytes() == (
        folder / "model.safetensors"
    ).read_bytes()


def test_labels_escape_invisible_characters_and_keep_a_literal_metaspace():
    from attnviz.core.models.tokens import Tokenizer, label_text, readable

    assert label_text("a\u202eb\u200b") == "a<U+202E>b<U+200B>"
    gpt2 = Tokenizer(backend=None, byte_level=True, continuing_prefix="")
    assert readable("âĸģ", gpt2) == "▁"  # GPT-2's bytes of "▁" are not a space
    sentencepiece = Tokenizer(backend=None, byte_level=False, continuing_prefix="", metaspace=True)
    assert readable("▁cat", sentencepiece) == " cat"
