"""A model's tokenizer, and token labels a learner can read.

Models name their pieces in their own code: GPT-2's byte-level BPE writes a leading space
as ``Ġ`` (and every byte as some printable character), SentencePiece writes it as ``▁``,
WordPiece marks a piece that continues a word with ``##``. Labels show spaces as spaces
and a continued word with ``‿`` (``un ‿believ ‿able``); special tokens keep their names.
The ``tokenizers`` library is imported only when a tokenizer is loaded.
"""

from __future__ import annotations

import json
import unicodedata
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from attnviz.core.io.files import FileFormatError, printable, read_file
from attnviz.core.maths.scenario import LIMITS, ScenarioError
from attnviz.core.models import vocab_files

JOIN = "‿"  # shown before a piece that continues the previous word
_SHOWN = {"\n": "↵", "\r": "␍", "\t": "⇥", " ": " "}


@dataclass(frozen=True)
class Tokens:
    """A text as the model sees it."""

    ids: tuple[int, ...]
    labels: tuple[str, ...]
    special: tuple[bool, ...]  # added by the tokenizer ([CLS], <s>, …), not from the text


@dataclass(frozen=True)
class Tokenizer:
    """A ``tokenizers.Tokenizer`` with no padding or truncation, and how it writes pieces."""

    backend: Any
    byte_level: bool  # GPT-2-style: every character of a piece stands for one byte
    continuing_prefix: str  # WordPiece's "##", or "" when pieces are not marked so
    metaspace: bool = False  # SentencePiece-style: "▁" stands for a space


def load_tokenizer(folder: Path) -> Tokenizer:
    """The tokenizer of a model folder: its ``tokenizer.json``, or the one transformers
    builds from a WordPiece ``vocab.txt`` (``vocab_files``); ScenarioError saying what was
    found and how to fix it otherwise."""
    folder = Path(folder)
    path = folder / "tokenizer.json"
    if path.exists() or path.is_symlink():
        return _described(_from_json(path))
    if (folder / "vocab.txt").exists() or (folder / "vocab.txt").is_symlink():
        return Tokenizer(vocab_files.wordpiece(folder), byte_level=False, continuing_prefix="##")
    raise ScenarioError(vocab_files.no_tokenizer(folder))


def _from_json(path: Path) -> Any:
    from tokenizers import Tokenizer as Backend

    try:
        backend = Backend.from_str(read_file(path).decode("utf-8"))  # a regular file only
    except FileFormatError as e:
        raise ScenarioError(str(e)) from None
    except Exception as e:  # the library raises its own Exception type for a bad file
        raise ScenarioError(
            f"{printable(path)}: not a tokenizer this version can read ({e})"
        ) from e
    return backend


def _described(backend: Any) -> Tokenizer:
    backend.no_padding()  # sentence-transformers' files pad every text to 128 tokens
    backend.no_truncation()
    described = json.loads(backend.to_str())
    prefix = ""
    if described.get("model", {}).get("type") == "WordPiece":
        prefix = described["model"].get("continuing_subword_prefix") or "##"
    parts = json.dumps(
        [described.get(k) for k in ("decoder", "pre_tokenizer", "normalizer")],
        ensure_ascii=False,
    )
    return Tokenizer(backend, "ByteLevel" in parts, prefix, "Metaspace" in parts or "▁" in parts)


def tokenize(tokenizer: Tokenizer, text: str, most: int = LIMITS.tokens) -> Tokens:
    """The tokens of ``text`` (special tokens included), refused beyond ``most``."""
    if not text.strip():
        raise ScenarioError("the text is empty: type a sentence to run through the model")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:  # bytes a terminal passed that are not UTF-8
        code = ord(text[e.start])
        what = f"the byte 0x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"U+{code:04X}"
        raise ScenarioError(f"the text is not UTF-8: character {e.start + 1} is {what}") from None
    encoding = tokenizer.backend.encode(text)
    ids = tuple(int(i) for i in encoding.ids)
    if len(ids) > most:
        raise ScenarioError(f"the text makes {len(ids)} tokens; at most {most} can be imported")
    special = tuple(bool(m) for m in encoding.special_tokens_mask)
    labels = tuple(
        label_text(piece) if is_special else readable(piece, tokenizer)
        for piece, is_special in zip(encoding.tokens, special, strict=True)
    )
    return Tokens(ids, labels, special)


@lru_cache(maxsize=1)
def _byte_of_char() -> dict[str, int]:
    """GPT-2's map from the printable character standing for a byte back to the byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars, extra = list(printable), 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


def readable(piece: str, tokenizer: Tokenizer) -> str:
    """A token's piece as a label: spaces shown as spaces, word continuations as ``‿``."""
    if tokenizer.byte_level:
        table = _byte_of_char()
        if all(c in table for c in piece):
            raw = bytes(table[c] for c in piece)
            try:
                piece = raw.decode("utf-8")
            except UnicodeDecodeError:  # part of a character split over several tokens
                piece = "".join(f"<{b:02X}>" if b >= 0x80 else chr(b) for b in raw)
    if tokenizer.metaspace:
        piece = piece.replace("▁", " ")
    prefix = tokenizer.continuing_prefix
    if prefix and piece.startswith(prefix) and len(piece) > len(prefix):
        piece = JOIN + piece[len(prefix) :]
    return label_text(piece)


def label_text(text: str) -> str:
    """Text fit to be a token label: control, formatting (such as a right-to-left override)
    and invisible characters shown by a symbol or their code point, at most the label
    length attnviz allows."""
    shown = []
    for c in text:
        if c in _SHOWN:
            shown.append(_SHOWN[c])
        elif unicodedata.category(c) in ("Cc", "Cf", "Cs", "Cn", "Co") or c.isspace():
            shown.append(f"<U+{ord(c):04X}>")
        else:
            shown.append(c)
    label = "".join(shown)
    most = LIMITS.token_chars
    return label if len(label) <= most else label[: most - 1] + "…"
