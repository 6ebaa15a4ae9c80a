"""The ``provenance`` of a scenario file (format version 3): where an imported layer came
from and the model's own numbers, written and checked field by field.

Each form stores the model's two arrays its own way (nested lists in .attn.json, named
members in .attn.npz and snapshots); ``provenance_to_dict`` takes a writer for them, and
the readers check the other fields with ``provenance_fields``, the arrays' shapes with
``provenance_shapes`` and build the ``Provenance`` with ``make_provenance``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import numpy as np

from attnviz.core.io.checks import (
    FileFormatError,
    check_numbers,
    clip,
    expect_shape,
    key_text,
    matrix_field,
    number,
    shape_text,
)
from attnviz.core.maths.scenario import LIMITS
from attnviz.core.provenance import Provenance, ProvenanceError

PROVENANCE_KEYS = (
    "source",
    "kind",
    "model_type",
    "layer",
    "layers",
    "text",
    "token_ids",
    "model_weights",
    "model_output",
    "files",
)
PROVENANCE_TEXTS = {"source": 4096, "kind": 16, "model_type": 256, "text": 2**19}  # most chars
PROVENANCE_FILES = 256  # at most, each name at most FILE_NAME_CHARS
FILE_NAME_CHARS = 256
MOST_LAYERS = 100_000  # a model's layers, as a provenance may say
_FINITE = float(np.finfo(np.float64).max)  # a check_numbers limit that refuses only ±inf, NaN


def provenance_to_dict(p: Provenance, matrix: Callable[[str, np.ndarray], Any]) -> dict[str, Any]:
    """A provenance as saved; ``matrix(where, array)`` gives what stands for each of the
    model's arrays (nested lists, or a member's name). Refuses (FileFormatError) what
    could not be loaded back, e.g. a text over the length limit."""
    d = {
        "source": p.source,
        "kind": p.kind,
        "model_type": p.model_type,
        "layer": p.layer,
        "layers": p.layers,
        "text": p.text,
        "token_ids": list(p.token_ids),
        "model_weights": matrix("provenance.model_weights", p.model_weights),
        "model_output": matrix("provenance.model_output", p.model_output),
        "files": dict(p.files),
    }
    if len(d["files"]) != len(p.files):
        raise FileFormatError("provenance.files: a file name appears twice")
    provenance_fields(d)
    provenance_shapes(p.model_weights.shape, p.model_output.shape)
    return d


def provenance_chars() -> int:
    """The most characters of text a provenance within the limits holds."""
    return sum(PROVENANCE_TEXTS.values()) + PROVENANCE_FILES * (FILE_NAME_CHARS + 64)


def _text(where: str, value: Any, most: int) -> str:
    """A string of at most most characters that can be written back as UTF-8."""
    if not isinstance(value, str):
        raise FileFormatError(f"{where}: expected text, got {clip(value)}")
    if len(value) > most:
        raise FileFormatError(f"{where}: {len(value):,} characters; the limit is {most:,}")
    lone = re.search("[\ud800-\udfff]", value)
    if lone:
        raise FileFormatError(
            f"{where}: holds U+{ord(lone.group()):04X}, a lone surrogate (not text)"
        )
    return value


def provenance_fields(value: Any) -> dict[str, Any]:
    """Check a provenance object's fields (its arrays apart) and return them as the
    ``Provenance`` arguments, but for model_weights and model_output."""
    if not isinstance(value, dict):
        raise FileFormatError("provenance: expected an object")
    unknown = sorted(set(value) - set(PROVENANCE_KEYS))
    if unknown:
        raise FileFormatError(f"provenance.{key_text(unknown[0])}: unknown field")
    missing = [k for k in PROVENANCE_KEYS if k not in value]
    if missing:
        raise FileFormatError(f"provenance.{missing[0]}: missing")
    fields: dict[str, Any] = {
        key: _text(f"provenance.{key}", value[key], most) for key, most in PROVENANCE_TEXTS.items()
    }
    fields["layers"] = number(value["layers"], "provenance.layers", 1, MOST_LAYERS, True)
    fields["layer"] = number(value["layer"], "provenance.layer", 0, fields["layers"] - 1, True)
    ids = value["token_ids"]
    if not isinstance(ids, list):
        raise FileFormatError(
            f"provenance.token_ids: expected a list of token ids, got {clip(ids)}"
        )
    if len(ids) > LIMITS.tokens:
        raise FileFormatError(
            f"provenance.token_ids: {len(ids)} ids; the limit is {LIMITS.tokens} tokens"
        )
    where = "provenance.token_ids"
    fields["token_ids"] = tuple(
        number(t, f"{where}[{i + 1}]", 0, 2**63 - 1, True, what="a token id")
        for i, t in enumerate(ids)
    )
    files = value["files"]
    if not isinstance(files, dict):
        raise FileFormatError(
            f"provenance.files: expected an object (file name: SHA-256), got {clip(files)}"
        )
    if len(files) > PROVENANCE_FILES:
        raise FileFormatError(
            f"provenance.files: {len(files)} files; the limit is {PROVENANCE_FILES}"
        )
    for name, digest in files.items():
        at = f"provenance.files[{clip(name)}]"
        _text(at, name, FILE_NAME_CHARS)
        _text(at, digest, 64)
    fields["files"] = tuple(files.items())
    return fields


def provenance_shapes(weights: tuple[int, ...], output: tuple[int, ...]) -> None:
    """The model's weights (heads × n × n) and output (n × d_model) within LIMITS."""
    lim = LIMITS
    where = "provenance.model_weights"
    if len(weights) != 3 or weights[1] != weights[2]:
        raise FileFormatError(f"{where}: expected heads × n × n, got {shape_text(weights)}")
    heads, n, _ = weights
    if not (1 <= heads <= lim.heads and 1 <= n <= lim.tokens):
        raise FileFormatError(
            f"{where}: {shape_text(weights)}; expected 1 to {lim.heads} heads of 1 to "
            f"{lim.tokens} tokens"
        )
    if heads * n * n > lim.score_cells:
        raise FileFormatError(f"{where}: {shape_text(weights)} is over {lim.score_cells} cells")
    where = "provenance.model_output"
    if len(output) != 2 or output[0] != n:
        raise FileFormatError(
            f"{where}: expected {n} rows (one per token), got {shape_text(output)}"
        )
    if not 1 <= output[1] <= lim.d_model:
        raise FileFormatError(f"{where}: {output[1]} columns; expected 1 to {lim.d_model}")


def make_provenance(fields: dict[str, Any], weights: np.ndarray, output: np.ndarray) -> Provenance:
    """A Provenance from checked fields and arrays; FileFormatError naming the field."""
    check_numbers("provenance.model_weights", weights, _FINITE)
    check_numbers("provenance.model_output", output, _FINITE)
    try:
        return Provenance(**fields, model_weights=weights, model_output=output)
    except ProvenanceError as e:
        raise FileFormatError(str(e)) from None


def provenance_from_json(value: Any) -> Provenance:
    """The provenance of an .attn.json document: its arrays as nested lists."""
    fields = provenance_fields(value)
    weights = _cube("provenance.model_weights", value["model_weights"])
    output = matrix_field("provenance.model_output", value["model_output"], _FINITE)
    provenance_shapes(weights.shape, output.shape)
    return make_provenance(fields, weights, output)


def _cube(where: str, value: Any) -> np.ndarray:
    """A non-empty list of equal-shaped matrices of finite numbers, as a 3-D array."""
    if not isinstance(value, list) or not value:
        raise FileFormatError(f"{where}: expected a non-empty list of matrices, one per head")
    if len(value) > LIMITS.heads:
        raise FileFormatError(f"{where}: {len(value)} heads; the limit is {LIMITS.heads}")
    mats = [matrix_field(f"{where}[{h + 1}]", m, _FINITE) for h, m in enumerate(value)]
    for h, m in enumerate(mats):
        expect_shape(f"{where}[{h + 1}]", m, mats[0].shape)
    return np.stack(mats)
