"""Tokenizers of model folders that have no ``tokenizer.json``.

Older BERT checkpoints ship only a WordPiece ``vocab.txt`` (with ``tokenizer_config.json``
and perhaps ``special_tokens_map.json``); transformers builds their fast tokenizer from
it. ``wordpiece(folder)`` builds the same one with the ``tokenizers`` library, as
transformers 5's ``BertTokenizer`` does: vocab.txt read as the ``tokenizers`` library
reads it (one token a line, its id the line number, trailing whitespace dropped, a later
duplicate winning); ``BertNormalizer`` with ``do_lower_case`` (default true),
``strip_accents`` (default: with the lowercasing) and ``tokenize_chinese_chars`` (default
true) from tokenizer_config.json; ``BertPreTokenizer``; WordPiece with the unknown token
and ``##``; the special tokens ([PAD], [UNK], [CLS], [SEP], [MASK] or the config's) and
the config's ``added_tokens_decoder`` matched in the text whole; ``[CLS] $A [SEP]``.
Only the tokenizer classes that are BERT's in transformers 5 are built; any other class
named in tokenizer_config.json is refused by name.

SentencePiece folders (``tokenizer.model``, ``spiece.model``) are refused with the way to
write their tokenizer.json: transformers itself needs the ``sentencepiece`` and
``protobuf`` packages to read them, and what it builds from them depends on the
tokenizer class (T5's ``</s>`` and extra ids, Llama's ``<s>`` and byte fallback, Gemma's
splitting, each class's legacy options), which attnviz does not reproduce.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from attnviz.core.io.files import FileFormatError, printable, read_file
from attnviz.core.maths.scenario import ScenarioError

MAX_VOCAB_BYTES = 16 * 2**20  # the largest WordPiece vocabularies are a few MB
MAX_VOCAB_TOKENS = 1_000_000  # … of a few hundred thousand tokens; a million builds in ~3 s
MAX_CONFIG_BYTES = 16 * 2**20
SENTENCEPIECE = ("tokenizer.model", "spiece.model", "sentencepiece.bpe.model")
LOOKED_FOR = "tokenizer.json, vocab.txt, tokenizer.model and spiece.model"
# transformers 5 classes that are BertTokenizer unchanged (or with the same defaults)
BERT_CLASSES = frozenset(
    {"BertTokenizer", "DistilBertTokenizer", "ConvBertTokenizer"}
    | {"MobileBertTokenizer", "SqueezeBertTokenizer"}
)
# config.json model types whose tokenizer transformers 5 maps to BertTokenizer
BERT_MODEL_TYPES = frozenset(
    {"align", "bark", "bert", "blip", "bros", "chinese_clip", "convbert", "distilbert"}
    | {"electra", "ernie", "flava", "git", "grounding-dino", "layoutlm", "megatron-bert"}
    | {"mm-grounding-dino", "mobilebert", "nezha", "nomic_bert", "qdqbert", "realm"}
    | {"retribert", "squeezebert", "tvp", "vilt", "visual_bert"}
)
SPECIAL = (  # BertTokenizer's special tokens and their defaults
    ("unk_token", "[UNK]"),
    ("sep_token", "[SEP]"),
    ("pad_token", "[PAD]"),
    ("cls_token", "[CLS]"),
    ("mask_token", "[MASK]"),
)
# what Rust's str::trim_end drops (Unicode White_Space), as the tokenizers library reads
_WHITE_SPACE = "\t\n\x0b\x0c\r \x85\xa0\u1680" + "".join(map(chr, range(0x2000, 0x200B)))
_WHITE_SPACE += "\u2028\u2029\u202f\u205f\u3000"


READ = ("tokenizer.json", "vocab.txt")  # the tokenizer files attnviz reads
_FIX = "AutoTokenizer.from_pretrained(folder).save_pretrained(folder)"


def lacking(names: set[str]) -> str:
    """What a folder holding the files ``names`` lacks for a tokenizer ('' when it has
    one), with what was found instead and how to write the missing tokenizer.json."""
    if any(name in names for name in READ):
        return ""
    found = [name for name in SENTENCEPIECE if name in names]
    if found:
        return (
            f"tokenizer.json (its tokenizer is SentencePiece, {found[0]}, which attnviz reads "
            "only as a tokenizer.json: pip install sentencepiece protobuf, then write one with "
            f"transformers' {_FIX})"
        )
    bpe = [name for name in ("vocab.json", "merges.txt") if name in names]
    if bpe:
        return (
            f"tokenizer.json (it has {' and '.join(bpe)}, a BPE tokenizer attnviz reads only "
            f"as a tokenizer.json: write one with transformers' {_FIX})"
        )
    return f"tokenizer.json (or a WordPiece vocab.txt; looked for {LOOKED_FOR})"


def no_tokenizer(folder: Path) -> str:
    """Why ``folder`` has no tokenizer attnviz can read: what was found, what is
    missing and how to fix it."""
    names = {p.name for p in Path(folder).iterdir()} if Path(folder).is_dir() else set()
    return f"{printable(folder)}: lacks {lacking(names - set(READ))}"


def wordpiece(folder: Path) -> Any:
    """The fast tokenizer transformers builds from ``folder``'s vocab.txt (see the module's
    docstring); ScenarioError naming the file and the reason when it cannot."""
    config = _json_object(folder / "tokenizer_config.json")
    _check_class(folder, config)
    vocab = _vocab(folder / "vocab.txt")
    try:
        specials = _special_tokens(folder, config)
        flags = _flags(config)
        added = _added(config)
    except ScenarioError as e:
        raise ScenarioError(f"{printable(folder)}: {e}") from None
    from tokenizers import AddedToken, Tokenizer, decoders, normalizers, pre_tokenizers, processors
    from tokenizers.models import WordPiece

    unk = specials["unk_token"]["content"]
    if unk not in vocab:
        raise ScenarioError(
            f"{printable(folder / 'vocab.txt')}: has no {unk} (the unknown token) among its "
            f"{len(vocab)} tokens"
        )
    backend = Tokenizer(WordPiece(vocab, unk_token=unk, continuing_subword_prefix="##"))
    backend.normalizer = normalizers.BertNormalizer(clean_text=True, **flags)
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.decoder = decoders.WordPiece(prefix="##")
    for token in added:
        backend.add_tokens([AddedToken(**token)])
    backend.add_special_tokens([AddedToken(**token) for token in specials.values()])
    cls, sep = specials["cls_token"]["content"], specials["sep_token"]["content"]
    backend.post_processor = processors.TemplateProcessing(
        single=[cls, "$A", sep],
        pair=[cls, "$A", sep, "$B:1", f"{sep}:1"],
        special_tokens=[(cls, backend.token_to_id(cls)), (sep, backend.token_to_id(sep))],
    )
    return backend


def _json_object(path: Path) -> dict[str, Any]:
    """A JSON file's object ({} when there is no such file)."""
    if not path.exists() and not path.is_symlink():
        return {}
    try:
        data = json.loads(read_file(path, MAX_CONFIG_BYTES).decode("utf-8"))
    except FileFormatError as e:
        raise ScenarioError(str(e)) from None
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise ScenarioError(f"{printable(path)}: not JSON text ({e})") from None
    if not isinstance(data, dict):
        raise ScenarioError(f"{printable(path)}: holds no JSON object")
    return data


def _check_class(folder: Path, config: dict[str, Any]) -> None:
    """Refuse a vocab.txt whose tokenizer transformers would not build as BERT's."""
    named = config.get("tokenizer_class")
    if named is not None:
        name = str(named).removesuffix("Fast")
        if name not in BERT_CLASSES:
            raise ScenarioError(
                f"{printable(folder)}: tokenizer_class {printable(str(named))!r} with a "
                "vocab.txt is not supported (attnviz builds only BERT's WordPiece tokenizer "
                "from one): add the model's tokenizer.json"
            )
        return
    model_type = _json_object(folder / "config.json").get("model_type")
    if model_type is not None and model_type not in BERT_MODEL_TYPES:
        raise ScenarioError(
            f"{printable(folder)}: a vocab.txt for model_type {printable(str(model_type))!r} "
            "is not supported (attnviz builds only BERT's WordPiece tokenizer from one): add "
            "the model's tokenizer.json"
        )


def _vocab(path: Path) -> dict[str, int]:
    """vocab.txt as the tokenizers library reads it (``WordPiece.read_file``)."""
    try:
        data = read_file(path, MAX_VOCAB_BYTES)
    except FileFormatError as e:
        raise ScenarioError(str(e)) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ScenarioError(
            f"{printable(path)}: not UTF-8 text (the byte 0x{data[e.start]:02x} at offset "
            f"{e.start})"
        ) from None
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()  # the newline that ends the last line
    if not lines:
        raise ScenarioError(f"{printable(path)}: holds no tokens")
    if len(lines) > MAX_VOCAB_TOKENS:
        raise ScenarioError(
            f"{printable(path)}: holds {len(lines):,} tokens; attnviz reads at most "
            f"{MAX_VOCAB_TOKENS:,}"
        )
    return {line.rstrip(_WHITE_SPACE): i for i, line in enumerate(lines)}


def _token(value: object, what: str) -> dict[str, Any]:
    """An added token's settings, from a string or a saved AddedToken."""
    if isinstance(value, str) and value:
        return {"content": value}
    if isinstance(value, dict) and isinstance(value.get("content"), str) and value["content"]:
        keys = ("lstrip", "rstrip", "single_word", "normalized")
        return {"content": value["content"], **{k: bool(value[k]) for k in keys if k in value}}
    raise ScenarioError(f"{what} is not a token (a non-empty string, or an object with one)")


def _special_tokens(folder: Path, config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The special tokens as transformers 5 reads them: tokenizer_config.json, overridden
    by a special_tokens_map.json when the config saves no added_tokens_decoder."""
    given = dict(config)
    if not config.get("added_tokens_decoder"):
        given.update(_json_object(folder / "special_tokens_map.json"))
    tokens = {}
    for key, default in SPECIAL:
        value = given.get(key, default)
        if value is None:
            value = default
        settings = {"normalized": False, **_token(value, f"tokenizer_config.json's {key}")}
        tokens[key] = {**settings, "special": True}
    return tokens


def _added(config: dict[str, Any]) -> list[dict[str, Any]]:
    """tokenizer_config.json's added_tokens_decoder, in the order of their ids."""
    saved = config.get("added_tokens_decoder") or {}
    if not isinstance(saved, dict):
        raise ScenarioError("tokenizer_config.json's added_tokens_decoder is not an object")
    tokens = []
    for key, value in sorted(saved.items(), key=lambda kv: _id(kv[0])):
        token = _token(value, f"tokenizer_config.json's added token {printable(str(key))}")
        special = isinstance(value, dict) and bool(value.get("special", False))
        tokens.append({**token, "special": special})
    return tokens


def _id(key: str) -> int:
    try:
        return int(key)
    except ValueError:
        raise ScenarioError(
            f"tokenizer_config.json's added_tokens_decoder has the id {printable(key)!r}, "
            "not a number"
        ) from None


def _flags(config: dict[str, Any]) -> dict[str, Any]:
    """BertNormalizer's settings from tokenizer_config.json."""
    flags = {"lowercase": True, "handle_chinese_chars": True, "strip_accents": None}
    for key, name in (
        ("do_lower_case", "lowercase"),
        ("tokenize_chinese_chars", "handle_chinese_chars"),
        ("strip_accents", "strip_accents"),
    ):
        value = config.get(key, flags[name])
        if not (isinstance(value, bool) or (value is None and key == "strip_accents")):
            raise ScenarioError(
                f"tokenizer_config.json's {key} is {printable(repr(value))}, not true or false"
            )
        flags[name] = value
    return flags
