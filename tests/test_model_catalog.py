"""The models on this machine that the Import dialog offers: installed packages and the
local Hugging Face cache, each judged from its config alone (no weights, no network)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from tiny_models import fake_package

from attnviz.core.models.catalog import available_models, cached_models, hub_cache

REVISION = "0123456789abcdef0123456789abcdef01234567"
BERT = {"model_type": "bert", "num_hidden_layers": 3, "max_position_embeddings": 64}
WEIGHTS = b"\0" * 1000  # never read: only its size counts
TOKENIZER = b'{"model": {}}'


@pytest.fixture(autouse=True)
def machine(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def model_files(config: dict | bytes, tokenizer: bool = True) -> dict[str, bytes]:
    text = config if isinstance(config, bytes) else json.dumps(config).encode()
    files = {"config.json": text, "model.safetensors": WEIGHTS}
    if tokenizer:
        files["tokenizer.json"] = TOKENIZER
    return files


def cache_entry(hub: Path, model_id: str, files: dict[str, bytes], main: bool = True) -> Path:
    """A model in the hub cache layout: blobs, a snapshot of links to them, refs/main."""
    repo = hub / f"models--{model_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / REVISION
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir()
    for name, data in files.items():
        blob = repo / "blobs" / f"{name}.blob"
        blob.write_bytes(data)
        (snapshot / name).symlink_to(blob)
    if main:
        (repo / "refs").mkdir()
        (repo / "refs" / "main").write_text(REVISION)
    return snapshot


def test_cached_models_are_listed_with_their_type_size_and_verdict(tmp_path):
    hub = tmp_path / "hub"
    assert hub_cache() == hub
    cache_entry(hub, "someone/tiny-bert", model_files(BERT))
    # a T5 whose encoder would attend causally: refused by name
    refused = {"model_type": "t5", "num_layers": 6, "is_decoder": True}
    cache_entry(hub, "google/t5-small", model_files(refused))
    cache_entry(hub, "broken/garbage", model_files(b"{not json"))
    cache_entry(hub, "half/no-tokenizer", model_files(BERT, tokenizer=False))
    pinned = cache_entry(hub, "pinned/model", model_files(BERT), main=False)
    (hub / "datasets--someone--data" / "snapshots").mkdir(parents=True)  # not a model
    (hub / "models--nothing--here").mkdir()  # an entry with no snapshot

    got = {a.source: a for a in cached_models()}
    assert set(got) == {
        "someone/tiny-bert",
        "google/t5-small",
        "broken/garbage",
        "half/no-tokenizer",
        str(pinned),  # no refs/main: the importer finds it as a folder, not by its id
    }
    bert = got["someone/tiny-bert"]
    assert (bert.kind, bert.model_type, bert.layers, bert.problem) == ("cache", "bert", 3, "")
    assert bert.size == len(json.dumps(BERT)) + len(WEIGHTS) + len(TOKENIZER)
    assert bert.where == hub / "models--someone--tiny-bert" / "snapshots" / REVISION
    t5 = got["google/t5-small"]
    assert t5.model_type == "t5" and "is_decoder true is not supported" in t5.problem
    assert got["broken/garbage"].model_type == "?"
    assert "not readable JSON" in got["broken/garbage"].problem
    assert "lacks tokenizer.json" in got["half/no-tokenizer"].problem
    assert got[str(pinned)].problem == ""
    assert len(cached_models(limit=2)) == 2  # a large cache is read only so far


def test_an_installed_package_bundling_a_model_is_listed_without_unpacking_it(
    tmp_path, monkeypatch
):
    site = tmp_path / "site"
    fake_package(site, "tiny-bert-model", {f"model/{k}": v for k, v in model_files(BERT).items()})
    fake_package(site, "t5-model", model_files({"model_type": "t5", "is_decoder": True}))
    fake_package(site, "pickled-model", {"config.json": json.dumps(BERT).encode(), "w.bin": b"1"})
    fake_package(site, "not-a-model", {"config.json": b"{}", "readme.txt": b"settings"})
    monkeypatch.syspath_prepend(str(site))

    got = {a.source: a for a in available_models() if a.kind == "package"}
    assert "not-a-model" not in got  # a config.json with no weights beside it
    bert = got["tiny-bert-model"]
    assert (bert.model_type, bert.layers, bert.problem) == ("bert", 3, "")
    assert bert.where == site / "tiny_bert_model" / "model.zip"
    assert bert.size == bert.where.stat().st_size
    assert "is_decoder" in got["t5-model"].problem
    assert "pickled" in got["pickled-model"].problem
    assert not (tmp_path / "cache" / "attnviz").exists()  # nothing unpacked
    assert "tiny_bert_model" not in sys.modules  # nor imported


def test_listing_imports_neither_torch_nor_transformers(tmp_path):
    cache_entry(tmp_path / "hub", "someone/tiny-bert", model_files(BERT))
    script = (
        "import sys\n"
        "from attnviz.core.models.catalog import available_models\n"
        "found = available_models()\n"
        "assert any(a.source == 'someone/tiny-bert' for a in found), found\n"
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "[]"
