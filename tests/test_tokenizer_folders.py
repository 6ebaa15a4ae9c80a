"""Model folders without a tokenizer.json: a WordPiece vocab.txt is read as transformers
reads it; a SentencePiece model, or nothing, is refused saying what was found and how to
fix it. The expected ids come from transformers (its pure-Python BERT tokenizer, and
``AutoTokenizer`` on the same folder), never from attnviz."""

from __future__ import annotations

import json
import os
import random

import pytest

from attnviz.core.maths.scenario import ScenarioError
from attnviz.core.models.tokens import JOIN, load_tokenizer, tokenize

transformers = pytest.importorskip("transformers")
pytest.importorskip("torch")

from offline_hub import offline  # noqa: E402, F401  (autouse)
from tiny_models import WORDS, save_tiny  # noqa: E402

from attnviz.core.models.importer import Request, import_model_layer, peek  # noqa: E402
from attnviz.core.models.sources import SourceError, locate  # noqa: E402

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
PIECES = [
    *"abcdefghijklmnopqrstuvwxyz",
    *"ABCDEFGHIJKLMNOPQRSTUVWXYZ",
    *[f"##{c}" for c in "abcdefghijklmnopqrstuvwxyz"],
    *"!?.,;:'\"()-[]",
    *"中国人好",
    "hello", "Hello", "world", "World", "##s", "##ing", "un", "##believ", "##able",
    "the", "The", "cafe", "café", "Café", "é", "É", "e", "##é", "naive", "naïve", "resume",
    "résumé", "over", "##lap", "mask", "straße", "strasse",
]  # fmt: skip
TEXTS = [
    "Hello, world!",
    "The café is unbelievable; naïve résumé?",
    "HELLO WORLD (overlap) — Straße",
    "中国人 said hello to the world.",
    "zzqx unknownword xyz!!",
    "the [MASK] is [mask] here",
    "  tabs\tand\nnewlines  ",
    "Émigré CAFÉ über",
]


ACCENTS = {"strip_accents": True}


def vocab_lines(seed: int = 39) -> list[str]:
    """SPECIAL and PIECES in a seeded order (so no id follows from a piece's place in
    PIECES), with the special tokens where BERT has them."""
    pieces = list(PIECES)
    random.Random(seed).shuffle(pieces)
    return ["[PAD]", *pieces[:7], "[UNK]", "[CLS]", "[SEP]", "[MASK]", *pieces[7:]]


def write_folder(folder, config=None, lines=None):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.txt").write_text("\n".join(lines or vocab_lines()) + "\n", encoding="utf-8")
    if config is not None:
        (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def slow_ids(folder, **options) -> list[list[int]]:
    """transformers' pure-Python BERT tokenizer (BasicTokenizer + WordpieceTokenizer)."""
    from transformers.models.bert.tokenization_bert_legacy import BertTokenizerLegacy

    slow = BertTokenizerLegacy(str(folder / "vocab.txt"), **options)
    return [slow(text)["input_ids"] for text in TEXTS]


def auto_ids(folder) -> list[list[int]]:
    """What transformers 5 builds from the folder for a BERT model."""
    auto = transformers.BertTokenizer.from_pretrained(str(folder))
    return [auto(text)["input_ids"] for text in TEXTS]


def attnviz_ids(folder) -> list[list[int]]:
    tokenizer = load_tokenizer(folder)
    return [list(tokenize(tokenizer, text).ids) for text in TEXTS]


@pytest.mark.parametrize(
    ("config", "options"),
    [
        (None, {}),
        ({"do_lower_case": True}, {"do_lower_case": True}),
        ({"do_lower_case": False}, {"do_lower_case": False}),
        ({"strip_accents": False}, {"strip_accents": False}),
        ({"do_lower_case": False, "strip_accents": True}, {"do_lower_case": False} | ACCENTS),
        ({"tokenize_chinese_chars": False}, {"tokenize_chinese_chars": False}),
    ],
)  # fmt: skip
def test_a_vocab_txt_gives_transformers_ids(tmp_path, config, options):
    folder = write_folder(tmp_path / "bert", config)
    got = attnviz_ids(folder)
    assert got == auto_ids(folder)
    # the slow tokenizer leaves "[mask]" alone when lowercasing, as the fast one does not
    texts = [i for i, t in enumerate(TEXTS) if "[mask]" not in t]
    slow = slow_ids(folder, **options)
    assert [got[i] for i in texts] == [slow[i] for i in texts]


def test_do_lower_case_false_keeps_case_and_accents(tmp_path):
    lower = load_tokenizer(write_folder(tmp_path / "lower", {"do_lower_case": True}))
    cased = load_tokenizer(write_folder(tmp_path / "cased", {"do_lower_case": False}))
    vocab = {w: i for i, w in enumerate(vocab_lines())}
    text = "Hello Café"
    assert tokenize(lower, text).ids == (
        vocab["[CLS]"],
        vocab["hello"],
        vocab["cafe"],
        vocab["[SEP]"],
    )
    assert tokenize(cased, text).ids == (
        vocab["[CLS]"],
        vocab["Hello"],
        vocab["Café"],
        vocab["[SEP]"],
    )


def test_labels_and_special_tokens(tmp_path):
    tokens = tokenize(load_tokenizer(write_folder(tmp_path / "bert")), "unbelievable worlds")
    assert tokens.labels == (
        "[CLS]",
        "un",
        f"{JOIN}believ",
        f"{JOIN}able",
        "world",
        f"{JOIN}s",
        "[SEP]",
    )
    assert tokens.special == (True, False, False, False, False, False, True)


def test_a_folder_saved_by_transformers_without_its_tokenizer_json(tmp_path):
    """tokenizer_config.json with added_tokens_decoder, and special tokens of its own."""
    from transformers import BertTokenizer

    lines = [line if line != "[UNK]" else "<unk>" for line in vocab_lines()]
    vocab = {w: i for i, w in enumerate(lines)}
    folder = tmp_path / "saved"
    BertTokenizer(vocab=vocab, unk_token="<unk>", do_lower_case=False).save_pretrained(folder)
    expected = auto_ids(folder)
    (folder / "tokenizer.json").unlink()
    write_folder(folder, lines=lines)  # transformers 5 saves no vocab.txt: as older ones did
    assert attnviz_ids(folder) == expected == auto_ids(folder)
    assert vocab["<unk>"] in [
        i for ids in expected for i in ids
    ]  # the renamed unknown token counts


def test_vocab_lines_are_read_as_the_tokenizers_library_reads_them(tmp_path):
    """Trailing spaces dropped, CRLF line ends, a later duplicate wins."""
    lines = vocab_lines()
    odd = [*lines[:20], "hello  ", "world\r", *lines[20:], "cafe"]
    folder = tmp_path / "odd"
    folder.mkdir()
    (folder / "vocab.txt").write_bytes("\n".join(odd).encode())  # no final newline
    assert attnviz_ids(folder) == auto_ids(folder)


def test_a_model_with_a_vocab_txt_imports(tmp_path):
    folder = save_tiny("bert", tmp_path / "bert")
    (folder / "tokenizer.json").unlink()
    (folder / "vocab.txt").write_text("\n".join(["[UNK]", "[CLS]", "[SEP]", *WORDS]) + "\n")
    assert locate(str(folder)).folder == folder
    text = " ".join(WORDS[:5]).upper()
    assert peek(str(folder), text).problem == ""
    imported = import_model_layer(Request(str(folder), text, 0))
    assert imported.tokens.ids == (1, *range(3, 8), 2)
    assert max(imported.agreement_weights, imported.agreement_output) <= 1e-5


@pytest.mark.parametrize("name", ["tokenizer.model", "spiece.model"])
def test_a_sentencepiece_folder_is_refused_saying_how_to_fix_it(tmp_path, name):
    folder = save_tiny("bert", tmp_path / "t5")
    (folder / "tokenizer.json").unlink()
    (folder / name).write_bytes(b"\x0a\x0b\x0a\x05<unk>\x15\x00\x00\x00\x00\x18\x02")
    with pytest.raises(ScenarioError) as e:
        load_tokenizer(folder)
    with pytest.raises(SourceError) as located:
        locate(str(folder))
    with pytest.raises(SourceError) as peeked:
        peek(str(folder), "the cat")
    for message in (str(e.value), str(located.value), str(peeked.value)):
        assert f"SentencePiece, {name}" in message
        assert "tokenizer.json" in message
        assert "pip install sentencepiece protobuf" in message
        assert "save_pretrained" in message


def test_no_tokenizer_at_all_lists_what_was_looked_for(tmp_path):
    folder = save_tiny("bert", tmp_path / "none")
    (folder / "tokenizer.json").unlink()
    with pytest.raises(ScenarioError) as e:
        load_tokenizer(folder)
    with pytest.raises(SourceError) as located:
        locate(str(folder))
    for message in (str(e.value), str(located.value)):
        for name in ("tokenizer.json", "vocab.txt", "tokenizer.model", "spiece.model"):
            assert name in message
    (folder / "vocab.json").write_text("{}")
    (folder / "merges.txt").write_text("")
    with pytest.raises(ScenarioError, match=r"has vocab\.json and merges\.txt, a BPE tokenizer"):
        load_tokenizer(folder)


@pytest.mark.parametrize(
    ("contents", "config", "message"),
    [
        (b"[UNK]\n\xff\xfehi\n", None, r"vocab\.txt: not UTF-8 text \(the byte 0xff at offset 6"),
        (b"", None, r"vocab\.txt: holds no tokens"),
        (b"hello\nworld\n", None, r"vocab\.txt: has no \[UNK\] \(the unknown token\) among its 2"),
        (b"[UNK]\n", {"tokenizer_class": "MPNetTokenizer"}, "tokenizer_class 'MPNetTokenizer'"),
        (b"[UNK]\n", {"do_lower_case": "yes"}, "do_lower_case is 'yes', not true or false"),
        (b"[UNK]\n", {"unk_token": 3}, "bad: tokenizer_config.json's unk_token is not a token"),
        (b"[UNK]\n", {"cls_token": ""}, "cls_token is not a token"),
        (b"[UNK]\n", [], r"tokenizer_config\.json: holds no JSON object"),
    ],
)  # fmt: skip
def test_bad_vocab_files_are_named(tmp_path, contents, config, message):
    folder = tmp_path / "bad"
    folder.mkdir()
    (folder / "vocab.txt").write_bytes(contents)
    if config is not None:
        (folder / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(ScenarioError, match=message):
        load_tokenizer(folder)


def test_another_model_types_vocab_txt_is_refused_by_name(tmp_path):
    folder = write_folder(tmp_path / "mpnet")
    (folder / "config.json").write_text(json.dumps({"model_type": "mpnet"}))
    with pytest.raises(ScenarioError, match="model_type 'mpnet' is not supported"):
        load_tokenizer(folder)


def test_a_huge_or_special_vocab_txt_is_refused_without_reading_it(tmp_path):
    folder = tmp_path / "huge"
    folder.mkdir()
    with open(folder / "vocab.txt", "wb") as f:
        f.truncate(2**40)  # sparse: a terabyte that takes no room
    with pytest.raises(ScenarioError, match=r"vocab\.txt: larger than"):
        load_tokenizer(folder)
    (folder / "vocab.txt").write_text("[UNK]\n" + "x\n" * 1_000_000)
    with pytest.raises(
        ScenarioError, match=r"vocab\.txt: holds 1,000,001 tokens; .* at most 1,000,000"
    ):
        load_tokenizer(folder)
    if hasattr(os, "mkfifo"):
        (folder / "vocab.txt").unlink()
        os.mkfifo(folder / "vocab.txt")  # a read would block forever
        with pytest.raises(ScenarioError, match=r"vocab\.txt.*not a regular file"):
            load_tokenizer(folder)


def test_the_catalog_offers_vocab_txt_models_and_names_sentencepiece_ones(tmp_path, monkeypatch):
    from tiny_models import fake_package

    from attnviz.core.models.catalog import available_models

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    config = json.dumps({"model_type": "bert", "num_hidden_layers": 2}).encode()
    common = {"config.json": config, "model.safetensors": b"\0" * 100}
    snapshot = tmp_path / "hub" / "models--old--bert" / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    for name, data in {**common, "vocab.txt": b"[UNK]\n"}.items():
        (snapshot / name).write_bytes(data)
    (snapshot.parent.parent / "refs").mkdir()
    (snapshot.parent.parent / "refs" / "main").write_text("0" * 40)
    site = tmp_path / "site"
    fake_package(site, "wordpiece-model", {**common, "vocab.txt": b"[UNK]\n"})
    fake_package(site, "spiece-model", {**common, "spiece.model": b"\n"})
    monkeypatch.syspath_prepend(str(site))

    got = {a.source: a.problem for a in available_models()}
    assert got["old/bert"] == got["wordpiece-model"] == ""
    assert "SentencePiece, spiece.model" in got["spiece-model"]
    assert "pip install sentencepiece protobuf" in got["spiece-model"]


def test_special_tokens_missing_from_the_vocab_get_transformers_ids(tmp_path):
    folder = write_folder(tmp_path / "short", lines=["[UNK]", "[CLS]", "hello", "[SEP]"])
    reference = transformers.BertTokenizer.from_pretrained(str(folder))
    tokenizer = load_tokenizer(folder)
    for text in ("hello [MASK] [PAD] [SEP] x", "[PAD][MASK]hello"):
        assert list(tokenize(tokenizer, text).ids) == reference(text)["input_ids"]
