"""Scenario files (``.attn.json`` and ``.attn.npz``) and matrix files (CSV, ``.npy``).

Loading never executes anything from a file (no pickles), checks every shape and number,
and raises ``FileFormatError`` (one type for every bad file) whose message names the
problem and where, e.g. ``heads[2].W_K: expected 4×2, got 4×3``. Nothing is returned
half-loaded. Every read goes through ``open_regular``: only regular files are read, so a
named pipe or a device never blocks the program. Writes are atomic: a temporary file
named after the target in the same folder, then a rename; the temporary files of a save
that was killed are removed before the next save of the same file.

The file's suffix chooses the form (``is_binary``): ``.attn.json`` (the default) is text,
one matrix row per line. ``.attn.npz`` is for large layers: an uncompressed NumPy ``.npz``
archive (it opens with ``np.load(path, allow_pickle=False)``) whose members are

- ``scenario.json``: a 1-D uint8 array, the UTF-8 bytes of the same JSON document as
  the text form, except that each matrix is the name of the member that holds it;
- the matrices, float64, C order, named by their place in the document:
  ``X`` (n × d_model), ``X_kv`` (m × d_model), ``W_O`` (H·d_k × d_model), ``b_O``
  (d_model); ``heads`` is an object of per-head stacks instead of a list of heads:
  ``heads.W_Q`` (H × d_model × d_k), ``heads.W_K`` and ``heads.W_V`` (the same), and the
  vectors ``heads.b_Q``, ``heads.q_norm``, … (H × d_k); with shared key/value heads
  ``kv_heads.W_K``, ``kv_heads.W_V`` (G × d_model × d_k) and ``kv_heads.b_K``, … (G × d_k);
  ``settings.mask_matrix`` (n × m of 0.0 and 1.0); ``provenance.model_weights``
  (heads × n × n) and ``provenance.model_output`` (n × d_model).

For example ``{"X": "X", "heads": {"W_Q": "heads.W_Q", "W_K": "heads.W_K", "W_V":
"heads.W_V"}, "W_O": "W_O", ...}``. Every member is named exactly once. The reader reads
each member's ``.npy`` header before its data (a 20-byte member cannot ask for
terabytes), checks sizes against ``MAX_NPZ_BYTES`` before reading anything, and refuses
members nobody names. Optional arrays are written when they differ bit for bit from
their neutral value, so the binary form round-trips every bit (−0.0 too).

Version 3 adds ``provenance`` (where an imported layer came from and the model's own
numbers); a file is written as version 3 only when the scenario has one.
"""

from __future__ import annotations

import bisect
import contextlib
import errno
import io
import json
import math
import os
import re
import secrets
import stat
import struct
import tempfile
import time
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from attnviz.core.io.text import TABLE_COLS, parse_table
from attnviz.core.maths.scenario import (
    LIMITS,
    MATRIX_NAMES,
    WEIGHT_NAMES,
    Scenario,
    ScenarioError,
    Settings,
    check_values,
    from_heads,
)
from attnviz.core.models.provenance import Provenance, ProvenanceError

FORMAT = "attnviz-scenario"
VERSION = 3  # the newest this attnviz reads; a save writes the oldest that holds the scenario
VERSIONS = (1, 2, 3)
SUFFIX = ".attn.json"
NPZ_SUFFIX = ".attn.npz"
MAX_FILE_BYTES = 256 * 2**20
MAX_MATRIX_CELLS = 2**24  # per matrix; per head for the stacks of an .attn.npz
MAX_NPZ_BYTES = 2 * 2**30  # the file, and its members unpacked, together
MAX_NPZ_MEMBERS = 32
MAX_NPZ_DOCUMENT = 16 * 2**20  # scenario.json of an .attn.npz
V1_TOP_KEYS = ("format", "version", "tokens", "X", "heads", "W_O", "settings")
V2_TOP_KEYS = ("kv_tokens", "X_kv", "kv_heads", "b_O")
V3_TOP_KEYS = ("provenance",)
TOP_KEYS = set(V1_TOP_KEYS + V2_TOP_KEYS + V3_TOP_KEYS)
V1_SETTINGS = ("projections", "scale", "mask", "positional", "dropout", "dropout_seed", "ablated")
V2_SETTINGS = (
    "window",
    "mask_matrix",
    "causal_alignment",
    "rope_base",
    "rope_style",
    "rope_dims",
    "alibi_slopes",
    "scale_value",
    "qk_norm",
    "qk_norm_eps",
    "softcap",
    "sinks",
)
SETTINGS_KEYS_ORDER = V1_SETTINGS + V2_SETTINGS
SETTINGS_KEYS = set(SETTINGS_KEYS_ORDER)
V1_HEAD_KEYS = ("W_Q", "W_K", "W_V")
Q_HEAD_KEYS = ("W_Q", "b_Q", "q_norm")
KV_HEAD_KEYS = ("W_K", "b_K", "W_V", "b_V", "k_norm")
HEAD_KEYS = ("W_Q", "b_Q", "W_K", "b_K", "W_V", "b_V", "q_norm", "k_norm")
VECTORS = ("b_Q", "b_K", "b_V", "q_norm", "k_norm", "b_O")  # written as one list of numbers
V2_VALUES = {"mask": ("custom",), "positional": ("rope", "alibi")}  # values version 1 lacks
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
_FINITE = float(np.finfo(np.float64).max)  # a check_values limit that refuses only ±inf, NaN
_DEFAULTS = Settings()


class FileFormatError(ScenarioError):
    """A file could not be loaded; the message names the problem and where."""


# Scenario <-> dict --------------------------------------------------------------------


def _rows(a: np.ndarray) -> list[list[float]]:
    return a.tolist()  # type: ignore[no-any-return]


def _in_use(s: Scenario, name: str) -> bool:
    """Whether an optional per-head array differs from its neutral value (0, or 1 for
    norm weights; norm weights also whenever QK-norm is on)."""
    if name.endswith("norm"):
        return s.settings.qk_norm != "none" or bool((getattr(s, name) != 1.0).any())
    return bool(getattr(s, name).any())


def _head_dicts(s: Scenario, names: tuple[str, ...], count: int) -> list[dict[str, Any]]:
    used = [n for n in names if n in WEIGHT_NAMES or _in_use(s, n)]
    return [
        {n: getattr(s, n)[h][0].tolist() if n in VECTORS else _rows(getattr(s, n)[h]) for n in used}
        for h in range(count)
    ]


def scenario_to_dict(s: Scenario) -> dict[str, Any]:
    """Exactly what a save writes: the version-1 fields, and each version-2 field only
    where it is in use."""
    shared = s.kv_heads != s.n_heads
    d: dict[str, Any] = {"format": FORMAT, "version": 1, "tokens": list(s.tokens), "X": _rows(s.X)}
    if s.cross:
        d["kv_tokens"], d["X_kv"] = list(s.key_tokens), _rows(s.X_kv)  # type: ignore[arg-type]
    d["heads"] = _head_dicts(s, Q_HEAD_KEYS if shared else HEAD_KEYS, s.n_heads)
    if shared:
        d["kv_heads"] = _head_dicts(s, KV_HEAD_KEYS, s.kv_heads)
    d["W_O"] = _rows(s.W_O)
    if s.b_O.any():
        d["b_O"] = s.b_O[0].tolist()
    d["settings"] = settings_to_dict(s.settings)
    if s.settings.mask == "custom" and s.mask_matrix is not None:
        d["settings"]["mask_matrix"] = s.mask_matrix.astype(int).tolist()
    if s.provenance is not None:
        d["provenance"] = provenance_to_dict(s.provenance, lambda _, a: a.tolist())
    d["version"] = version_for(s)
    return d


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
    _provenance_fields(d)
    _provenance_shapes(p.model_weights.shape, p.model_output.shape)
    return d


def settings_to_dict(st: Settings) -> dict[str, Any]:
    """Settings as saved; ablated heads are numbered from 1, as everywhere users see them.
    A version-2 setting is written only where it has an effect or differs from its
    default (the window only with a sliding-window mask), so that plain scenarios stay
    version 1."""
    d: dict[str, Any] = {name: getattr(st, name) for name in V1_SETTINGS}
    d["ablated"] = [h + 1 for h in st.ablated]
    for name in V2_SETTINGS:
        value = getattr(st, name, None)
        if name == "window":
            if st.mask == "sliding-window":
                d[name] = value
        elif name != "mask_matrix" and value != getattr(_DEFAULTS, name):
            d[name] = list(value) if isinstance(value, tuple) else value
    return d


def version_for(s: Scenario) -> int:
    """3 with a provenance; else 1, unless the scenario uses something only version 2
    can hold."""
    if s.provenance is not None:
        return 3
    optional = (n for n in HEAD_KEYS if n not in WEIGHT_NAMES)
    uses_v2 = (
        s.cross
        or s.kv_heads != s.n_heads
        or s.b_O.any()
        or any(_in_use(s, n) for n in optional)
        or set(settings_to_dict(s.settings)) & set(V2_SETTINGS)
        or any(getattr(s.settings, k) in values for k, values in V2_VALUES.items())
    )
    return 2 if uses_v2 else 1


def clip(value: Any, width: int = 40) -> str:
    """repr(value) in at most width characters: a cut one ends in "…", quotes closed."""
    text = repr(value)
    if len(text) <= width:
        return text
    if isinstance(value, (str, bytes)):
        return text[: width - 2] + "…" + text[-1]
    return text[: width - 1] + "…"


def _name(key: str) -> str:
    """A key from a file as it can appear in a one-line message."""
    return key if key.isidentifier() and len(key) <= 40 else clip(key)


def _shape(shape: tuple[int, ...], width: int = 60) -> str:
    text = "×".join(map(str, shape))
    return text if len(text) <= width else text[: width - 1] + "…"


def _matrix(where: str, value: Any, limit: float = LIMITS.abs_value) -> np.ndarray:
    """A list of equal-length rows of finite numbers within ±limit, as a float64 array.

    A row is a list, or a float64 array when the JSON reader converted it already.
    """
    if not isinstance(value, list) or not value:
        raise FileFormatError(f"{where}: expected a non-empty list of rows")
    width = None
    for r, row in enumerate(value):
        if not isinstance(row, (list, np.ndarray)):
            raise FileFormatError(f"{where}[{r + 1}]: expected a row (a list of numbers)")
        if width is None:
            width = len(row)
        elif len(row) != width:
            raise FileFormatError(f"{where}: row {r + 1} has {len(row)} numbers, row 1 has {width}")
        if isinstance(row, list) and not set(map(type, row)) <= {int, float}:
            c = next(c for c, v in enumerate(row) if type(v) not in (int, float))
            raise FileFormatError(
                f"{where}[{r + 1},{c + 1}]: expected a number, "
                f"got {type(row[c]).__name__} {clip(row[c])}"
            )
    if not width:
        raise FileFormatError(f"{where}: rows are empty")
    if len(value) * width > MAX_MATRIX_CELLS:
        raise FileFormatError(f"{where}: {len(value)}×{width} is over {MAX_MATRIX_CELLS} cells")
    try:
        array = np.array(value, dtype=np.float64)
    except OverflowError:
        raise FileFormatError(f"{where}: a number is too large") from None
    _check_values(where, array, limit)
    array.flags.writeable = False  # so that the Scenario keeps it without a copy
    return array


def _check_values(where: str, array: np.ndarray, limit: float = LIMITS.abs_value) -> None:
    try:
        check_values(where, array, limit)
    except ScenarioError as e:
        raise FileFormatError(str(e)) from None


def _expect_shape(where: str, array: Any, shape: tuple[int, ...]) -> None:
    """array (or a shape) must have shape."""
    got = array if isinstance(array, tuple) else array.shape
    if got != shape:
        raise FileFormatError(f"{where}: expected {_shape(shape)}, got {_shape(got)}")


def _settings(value: Any, version: int = VERSION) -> Settings:
    if not isinstance(value, dict):
        raise FileFormatError("settings: expected an object")
    if version < 2:
        newer = sorted(set(value) & set(V2_SETTINGS))
        if newer:
            raise FileFormatError(f"settings.{newer[0]}: needs version 2 (the file says 1)")
        for name, values in V2_VALUES.items():
            if value.get(name) in values:
                raise FileFormatError(
                    f"settings.{name}: {value[name]!r} needs version 2 (the file says 1)"
                )
    unknown = sorted(set(value) - SETTINGS_KEYS)
    if unknown:
        raise FileFormatError(
            f"settings.{_name(unknown[0])}: unknown setting; "
            f"known: {', '.join(SETTINGS_KEYS_ORDER)}"
        )
    value = {k: v for k, v in value.items() if k != "mask_matrix"}
    if "ablated" in value:
        heads = value["ablated"]
        if not isinstance(heads, list) or any(type(h) is not int or h < 1 for h in heads):
            raise FileFormatError("settings.ablated: expected a list of head numbers from 1")
        if len(set(heads)) != len(heads):
            raise FileFormatError(f"settings.ablated: head numbers {clip(heads)} repeat")
        value = {**value, "ablated": tuple(sorted(h - 1 for h in heads))}
    for name in ("alibi_slopes", "sinks"):
        if name in value:
            numbers = value[name]
            if not isinstance(numbers, list) or not all(type(v) in (int, float) for v in numbers):
                raise FileFormatError(f"settings.{name}: expected a list of numbers, one per head")
            value = {**value, name: tuple(float(v) for v in numbers)}
    for name in ("dropout", "rope_base", "scale_value", "qk_norm_eps", "softcap"):
        if name in value and type(value[name]) is int:
            try:
                value = {**value, name: float(value[name])}
            except OverflowError:
                raise FileFormatError(f"settings.{name}: the number is too large") from None
    try:
        return Settings(**value)
    except ScenarioError as e:
        raise FileFormatError(str(e)) from None


def _vector(where: str, value: Any, length: int) -> np.ndarray:
    """A list of length finite numbers, as a 1 × length float64 array."""
    if isinstance(value, np.ndarray):  # the row reader converted it already
        value = value.tolist()
    if not isinstance(value, list) or not all(type(v) in (int, float) for v in value):
        raise FileFormatError(f"{where}: expected a list of {length} numbers")
    if len(value) != length:
        raise FileFormatError(f"{where}: expected {length} numbers, got {len(value)}")
    try:
        array = np.array([value], dtype=np.float64)
    except OverflowError:
        raise FileFormatError(f"{where}: a number is too large") from None
    try:
        check_values(where, array[0])
    except ScenarioError as e:
        raise FileFormatError(str(e)) from None
    return array


def _tokens(where: str, tokens: Any) -> list[str]:
    if not isinstance(tokens, list) or not tokens:
        raise FileFormatError(f"{where}: expected a non-empty list of text labels")
    if len(tokens) > LIMITS.tokens:
        raise FileFormatError(f"{where}: {len(tokens)} tokens; the limit is {LIMITS.tokens}")
    for i, t in enumerate(tokens):
        if not isinstance(t, str):
            raise FileFormatError(f"{where}[{i + 1}]: expected text, got {clip(t)}")
    return tokens


def _heads(
    where: str,
    heads: Any,
    required: tuple[str, ...],
    allowed: tuple[str, ...],
    d_model: int,
    d_k: int | None,
) -> tuple[list[dict[str, np.ndarray]], int]:
    """Parse a list of head objects: matrices d_model × d_k, vectors of d_k."""
    if not isinstance(heads, list) or not heads:
        raise FileFormatError(f"{where}: expected a non-empty list of heads")
    if len(heads) > LIMITS.heads:
        raise FileFormatError(f"{where}: {len(heads)} heads; the limit is {LIMITS.heads}")
    parsed = []
    for h, head in enumerate(heads):
        at = f"{where}[{h + 1}]"
        if not isinstance(head, dict):
            raise FileFormatError(f"{at}: expected an object with {', '.join(required)}")
        extra = sorted(set(head) - set(allowed))
        missing = [n for n in required if n not in head]
        if extra or missing:
            problem = f"{_name(extra[0])}: unknown field" if extra else f"{missing[0]}: missing"
            raise FileFormatError(f"{at}.{problem}")
        mats = {}
        for name in allowed:
            if name not in head:
                continue
            if name in VECTORS:
                continue
            m = _matrix(f"{at}.{name}", head[name])
            d_k = m.shape[1] if d_k is None else d_k
            _expect_shape(f"{at}.{name}", m, (d_model, d_k))
            mats[name] = m
        assert d_k is not None
        for name in allowed:
            if name in head and name in VECTORS:
                mats[name] = _vector(f"{at}.{name}", head[name], d_k)
        parsed.append(mats)
    assert d_k is not None
    return parsed, d_k


def _document(data: Any) -> int:
    """Check the top of a document (format, version, which fields); its version."""
    if not isinstance(data, dict):
        raise FileFormatError("expected a JSON object at the top")
    if data.get("format") != FORMAT:
        raise FileFormatError(f"format: expected {FORMAT!r}, got {clip(data.get('format'))}")
    version = data.get("version")
    if type(version) is not int or version not in VERSIONS:
        readable = ", ".join(map(str, VERSIONS[:-1])) + f" and {VERSIONS[-1]}"
        raise FileFormatError(
            f"version: {clip(version, 20)} is not supported (this attnviz reads {readable})"
        )
    unknown = sorted(set(data) - TOP_KEYS)
    if unknown:
        raise FileFormatError(f"{_name(unknown[0])}: unknown field")
    for needs, keys in ((2, V2_TOP_KEYS), (3, V3_TOP_KEYS)):
        newer = [k for k in keys if k in data]
        if version < needs and newer:
            raise FileFormatError(f"{newer[0]}: needs version {needs} (the file says {version})")
    for key in ("tokens", "X", "heads", "W_O"):
        if key not in data:
            raise FileFormatError(f"{key}: missing")
    return version


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


def _provenance_fields(value: Any) -> dict[str, Any]:
    """Check a provenance object's fields (its arrays apart) and return them as the
    ``Provenance`` arguments, but for model_weights and model_output."""
    if not isinstance(value, dict):
        raise FileFormatError("provenance: expected an object")
    unknown = sorted(set(value) - set(PROVENANCE_KEYS))
    if unknown:
        raise FileFormatError(f"provenance.{_name(unknown[0])}: unknown field")
    missing = [k for k in PROVENANCE_KEYS if k not in value]
    if missing:
        raise FileFormatError(f"provenance.{missing[0]}: missing")
    fields: dict[str, Any] = {
        key: _text(f"provenance.{key}", value[key], most) for key, most in PROVENANCE_TEXTS.items()
    }
    for key in ("layer", "layers"):
        number = value[key]
        if type(number) is not int or number < 0:
            raise FileFormatError(
                f"provenance.{key}: expected a whole number from 0, got {clip(number)}"
            )
        fields[key] = number
    ids = value["token_ids"]
    if not isinstance(ids, list):
        raise FileFormatError(
            f"provenance.token_ids: expected a list of token ids, got {clip(ids)}"
        )
    if len(ids) > LIMITS.tokens:
        raise FileFormatError(
            f"provenance.token_ids: {len(ids)} ids; the limit is {LIMITS.tokens} tokens"
        )
    for i, t in enumerate(ids):
        if type(t) is not int or not 0 <= t < 2**63:
            raise FileFormatError(
                f"provenance.token_ids[{i + 1}]: expected a token id (a whole number "
                f"from 0), got {clip(t)}"
            )
    fields["token_ids"] = tuple(ids)
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


def _provenance_shapes(weights: tuple[int, ...], output: tuple[int, ...]) -> None:
    """The model's weights (heads × n × n) and output (n × d_model) within LIMITS."""
    lim = LIMITS
    where = "provenance.model_weights"
    if len(weights) != 3 or weights[1] != weights[2]:
        raise FileFormatError(f"{where}: expected heads × n × n, got {_shape(weights)}")
    heads, n, _ = weights
    if not (1 <= heads <= lim.heads and 1 <= n <= lim.tokens):
        raise FileFormatError(
            f"{where}: {_shape(weights)}; expected 1 to {lim.heads} heads of 1 to {lim.tokens} "
            "tokens"
        )
    if heads * n * n > lim.score_cells:
        raise FileFormatError(f"{where}: {_shape(weights)} is over {lim.score_cells} cells")
    where = "provenance.model_output"
    if len(output) != 2 or output[0] != n:
        raise FileFormatError(f"{where}: expected {n} rows (one per token), got {_shape(output)}")
    if not 1 <= output[1] <= lim.d_model:
        raise FileFormatError(f"{where}: {output[1]} columns; expected 1 to {lim.d_model}")


def _make_provenance(fields: dict[str, Any], weights: np.ndarray, output: np.ndarray) -> Provenance:
    """A Provenance from checked fields and arrays; FileFormatError naming the field."""
    _check_values("provenance.model_weights", weights, _FINITE)
    _check_values("provenance.model_output", output, _FINITE)
    try:
        return Provenance(**fields, model_weights=weights, model_output=output)
    except ProvenanceError as e:
        raise FileFormatError(str(e)) from None


def _cube(where: str, value: Any) -> np.ndarray:
    """A non-empty list of equal-shaped matrices of finite numbers, as a 3-D array."""
    if not isinstance(value, list) or not value:
        raise FileFormatError(f"{where}: expected a non-empty list of matrices, one per head")
    if len(value) > LIMITS.heads:
        raise FileFormatError(f"{where}: {len(value)} heads; the limit is {LIMITS.heads}")
    mats = [_matrix(f"{where}[{h + 1}]", m, _FINITE) for h, m in enumerate(value)]
    for h, m in enumerate(mats):
        _expect_shape(f"{where}[{h + 1}]", m, mats[0].shape)
    return np.stack(mats)


def _provenance_from_json(value: Any) -> Provenance:
    fields = _provenance_fields(value)
    weights = _cube("provenance.model_weights", value["model_weights"])
    output = _matrix("provenance.model_output", value["model_output"], _FINITE)
    _provenance_shapes(weights.shape, output.shape)
    return _make_provenance(fields, weights, output)


def scenario_from_dict(data: Any) -> Scenario:
    """Check and convert a parsed .attn.json document."""
    version = _document(data)
    tokens = _tokens("tokens", data["tokens"])
    X = _matrix("X", data["X"])
    n, d_model = len(tokens), X.shape[1]
    _expect_shape("X", X, (n, d_model))
    extra: dict[str, Any] = {}
    if ("kv_tokens" in data) != ("X_kv" in data):
        raise FileFormatError("X_kv: cross-attention needs both kv_tokens and X_kv")
    if "X_kv" in data:
        kv_tokens = _tokens("kv_tokens", data["kv_tokens"])
        X_kv = _matrix("X_kv", data["X_kv"])
        _expect_shape("X_kv", X_kv, (len(kv_tokens), d_model))
        extra.update(kv_tokens=kv_tokens, X_kv=X_kv)
    m = len(extra.get("kv_tokens", tokens))

    shared = "kv_heads" in data
    if version == 1 and isinstance(data["heads"], list):
        for h, head in enumerate(data["heads"]):
            newer = (
                [k for k in HEAD_KEYS if k not in V1_HEAD_KEYS and k in head]
                if isinstance(head, dict)
                else []
            )
            if newer:
                raise FileFormatError(
                    f"heads[{h + 1}].{newer[0]}: needs version 2 (the file says 1)"
                )
    allowed = (Q_HEAD_KEYS if shared else HEAD_KEYS) if version >= 2 else V1_HEAD_KEYS
    required = ("W_Q",) if shared else V1_HEAD_KEYS
    heads, d_k = _heads("heads", data["heads"], required, allowed, d_model, None)
    kv_heads = None
    if shared:
        kv_heads, _ = _heads(
            "kv_heads", data["kv_heads"], ("W_K", "W_V"), KV_HEAD_KEYS, d_model, d_k
        )
        if len(heads) % len(kv_heads):
            raise FileFormatError(
                f"kv_heads: {len(kv_heads)} key/value heads do not divide {len(heads)} query heads"
            )
    W_O = _matrix("W_O", data["W_O"])
    _expect_shape("W_O", W_O, (len(heads) * d_k, d_model))
    if "b_O" in data:
        extra["b_O"] = _vector("b_O", data["b_O"], d_model)
    settings_value = data.get("settings", {})
    settings = _settings(settings_value, version)
    if settings.mask == "custom":
        if "mask_matrix" not in settings_value:
            raise FileFormatError("settings.mask_matrix: missing (the custom mask needs it)")
        mask = _matrix("settings.mask_matrix", settings_value["mask_matrix"])
        _expect_shape("settings.mask_matrix", mask, (n, m))
        extra["mask_matrix"] = mask
    elif "mask_matrix" in settings_value:
        raise FileFormatError(
            f"settings.mask_matrix: only for the custom mask (mask is {settings.mask!r})"
        )
    if "provenance" in data:
        extra["provenance"] = _provenance_from_json(data["provenance"])
    try:
        return from_heads(tokens, X, heads, W_O, settings, kv_heads, **extra)
    except ScenarioError as e:
        raise FileFormatError(str(e)) from None


def scenario_to_json(s: Scenario) -> str:
    """Human-readable JSON: one matrix row per line."""

    def matrix(rows: list[list[float]], indent: str) -> str:
        # repr of each float is what json writes for it, in a fraction of the time.
        inner = f",\n{indent}  ".join("[" + ", ".join(map(repr, r)) + "]" for r in rows)
        return f"[\n{indent}  {inner}\n{indent}]"

    def value(key: str, v: Any, indent: str) -> str:
        if key in VECTORS:
            return "[" + ", ".join(map(repr, v)) + "]"
        if key in ("X", "X_kv", "W_O", *WEIGHT_NAMES):
            return matrix(v, indent)
        return json.dumps(v, ensure_ascii=False)

    def provenance(p: dict[str, Any]) -> str:
        lines = []
        for k, v in p.items():
            if k == "model_weights":
                cubes = ",\n".join(f"      {matrix(m, '      ')}" for m in v)
                text = f"[\n{cubes}\n    ]"
            elif k == "model_output":
                text = matrix(v, "    ")
            else:
                text = json.dumps(v, ensure_ascii=False)
            lines.append(f'    "{k}": {text}')
        return "{\n" + ",\n".join(lines) + "\n  }"

    def heads(items: list[dict[str, Any]]) -> str:
        return ",\n".join(
            "    {\n"
            + ",\n".join(f'      "{k}": {value(k, v, "      ")}' for k, v in head.items())
            + "\n    }"
            for head in items
        )

    d = scenario_to_dict(s)
    settings = dict(d["settings"])
    mask = settings.pop("mask_matrix", None)
    parts = []
    for key, v in d.items():
        if key in ("heads", "kv_heads"):
            parts.append(f'  "{key}": [\n{heads(v)}\n  ]')
        elif key == "settings":
            text = json.dumps(settings)
            if mask is not None:
                text = text[:-1] + f', "mask_matrix": {matrix(mask, "  ")}}}'
            parts.append(f'  "settings": {text}')
        elif key == "provenance":
            parts.append(f'  "provenance": {provenance(v)}')
        else:
            parts.append(f'  "{key}": {value(key, v, "  ")}')
    return "{\n" + ",\n".join(parts) + "\n}\n"


# JSON text ----------------------------------------------------------------------------


def _constant(name: str) -> float:
    """NaN and ±Infinity parse as floats, so that the matrix check names their cell."""
    return float(name)


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise FileFormatError(f"{_name(key)}: appears twice")
        out[key] = value
    return out


def _provenance_chars() -> int:
    """The most characters of text a provenance within the limits holds."""
    return sum(PROVENANCE_TEXTS.values()) + PROVENANCE_FILES * (FILE_NAME_CHARS + 64)


def _most_containers() -> int:
    """The most lists and objects a scenario within LIMITS holds, counting every
    character of its token labels and provenance texts as a bracket (a label may hold
    "[" or "{")."""
    lim = LIMITS
    rows = 3 * lim.tokens + 3 * lim.heads * lim.d_model + lim.heads * lim.d_k  # X, X_kv, mask
    matrices = 4 + 3 * lim.heads
    vectors = 5 * lim.heads + 4  # biases and norm weights; b_O, slopes, sinks, ablated
    others = 5 + 2 * lim.heads  # document, tokens, heads lists, settings; each head
    # the model's weights (a list of matrices) and output, token ids, files, the object
    provenance = lim.heads * (lim.tokens + 1) + lim.tokens + 6
    labels = 2 * lim.tokens * lim.token_chars + _provenance_chars()
    return rows + matrices + vectors + others + provenance + labels


def _most_quotes() -> int:
    """The most quotation marks a scenario within LIMITS holds (a label may hold \")."""
    lim = LIMITS
    keys = len(TOP_KEYS) + len(SETTINGS_KEYS) + 2 * len(HEAD_KEYS) * lim.heads
    strings = 1 + keys + 6 + 2 * lim.tokens  # the format, string settings and labels
    provenance = len(PROVENANCE_KEYS) + len(PROVENANCE_TEXTS) + 2 * PROVENANCE_FILES
    labels = 2 * lim.tokens * lim.token_chars + _provenance_chars()
    return 2 * (strings + provenance) + labels


def _count(text: str | bytes, chars: str) -> int:
    """How many of chars text holds, counted by C loops (no copy)."""
    if isinstance(text, bytes):
        return sum(text.count(c.encode()) for c in chars)
    return sum(text.count(c) for c in chars)


def _check_counts(text: str | bytes) -> None:
    """Refuse, before parsing, text with more lists, objects or strings than any scenario
    within the limits: json.loads would build tens of bytes of objects per character."""
    containers, most = _count(text, "[{"), _most_containers()
    if containers > most:
        raise FileFormatError(
            f"{containers:,} lists and objects; a scenario within the limits has at most {most:,}"
        )
    quotes, most = _count(text, '"'), _most_quotes()
    if quotes > most:
        raise FileFormatError(
            f"{quotes:,} quotation marks; a scenario within the limits has at most {most:,}"
        )


# A list of numbers inside a list (a matrix row): "[" or "," then "[" with no string,
# list or object in it; or a string (group 2 empty), skipped so that text such as
# "a, [1]" in a label is never taken for a row. A string runs to its closing quote or
# to the end of the text, and the character classes cannot backtrack, so matching is
# linear.
_ROW = re.compile(r'"(?:[^"\\]|\\[\s\S])*+(?:"|\\?\Z)|([\[,]\s*)(\[[^\[\]{}"]*\])')
_MOST_BAD_ROWS = 64


class _Rows:
    """Matrix rows parsed one at a time into float64 arrays.

    json.loads of a whole file builds a Python float per number (about 32 bytes for
    "0.5,"). Here each row is parsed alone and kept as an array, and the text handed to
    json.loads holds {key: k} in its place (row k), with a key no file can guess: peak
    memory stays a small multiple of the file. A row that is not all numbers (or not
    valid JSON) is left in the text, so that the usual checks name its cell, or its
    line and column (``where`` maps a position in the new text back to the file).
    """

    def __init__(self, text: str) -> None:
        self.key = f"row-{secrets.token_hex(8)}"
        self.arrays: list[np.ndarray] = []
        self._moves: list[tuple[int, int]] = []  # (end in the new text, end in the file)
        pieces: list[str] = []
        done = length = bad = 0  # file consumed up to done; length of the new text so far
        for match in _ROW.finditer(text):
            if match.group(2) is None:
                continue  # a string
            start, end = match.span(2)
            row = match.group(2)
            if row.count(",") >= 16 * TABLE_COLS:  # longer rows are refused with their name
                raise FileFormatError(
                    f"line {_line(text, start)}: a row of {row.count(',') + 1:,} values; "
                    f"a row has at most {TABLE_COLS:,}"
                )
            array = _numbers_row(row)
            if array is None:
                bad += 1
                if bad > _MOST_BAD_ROWS:
                    raise FileFormatError(
                        f"line {_line(text, start)}: more than {_MOST_BAD_ROWS} rows "
                        "that are not lists of numbers"
                    )
                continue
            pieces += [text[done:start], f'{{"{self.key}": {len(self.arrays)}}}']
            length += len(pieces[-2]) + len(pieces[-1])
            done = end
            self.arrays.append(array)
            self._moves.append((length, end))
        pieces.append(text[done:])
        self.text = "".join(pieces)

    def hook(self, pairs: list[tuple[str, Any]]) -> Any:
        """object_pairs_hook: a placeholder becomes its row; other objects as usual."""
        if len(pairs) == 1 and pairs[0][0] == self.key:
            return self.arrays[pairs[0][1]]
        return _no_duplicates(pairs)

    def where(self, pos: int) -> int:
        """The file position of position pos of the new text (outside placeholders)."""
        i = bisect.bisect_right(self._moves, (pos, math.inf)) - 1
        return pos if i < 0 else self._moves[i][1] + pos - self._moves[i][0]


def _line(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def _numbers_row(row: str) -> np.ndarray | None:
    """A JSON list of numbers as float64, or None if it holds anything else."""
    try:
        values = json.loads(row, parse_constant=_constant)
        if set(map(type, values)) <= {int, float}:
            return np.array(values, dtype=np.float64)
    except (ValueError, OverflowError):  # JSONDecodeError is a ValueError
        pass
    return None


def scenario_from_json(text: str | bytes) -> Scenario:
    """Parse and check .attn.json text."""
    if len(text) > MAX_FILE_BYTES:
        raise FileFormatError(f"larger than {MAX_FILE_BYTES // 2**20} MiB")
    if isinstance(text, bytes) and text.startswith(b"PK\x03\x04"):
        raise FileFormatError("a zip archive, not JSON text: name it .attn.npz to open it")
    _check_counts(text)
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8-sig")  # a byte order mark is allowed, as in CSV
        except UnicodeDecodeError as e:
            raise FileFormatError(f"not UTF-8 text (byte {e.start + 1})") from None
    text = text.removeprefix("\ufeff")
    rows = _Rows(text)
    try:
        data = json.loads(rows.text, parse_constant=_constant, object_pairs_hook=rows.hook)
    except json.JSONDecodeError as e:
        pos = rows.where(e.pos)
        line, column = _line(text, pos), pos - text.rfind("\n", 0, pos)
        raise FileFormatError(f"not valid JSON: {e.msg} at line {line}, column {column}") from None
    except RecursionError:
        raise FileFormatError("nested too deeply to be a scenario") from None
    except ValueError as e:  # e.g. an integer with too many digits
        if isinstance(e, FileFormatError):
            raise
        raise FileFormatError(f"not valid JSON: {e}") from None
    return scenario_from_dict(data)


# .attn.npz: the binary form (layout in the module docstring) ---------------------------

_DOCUMENT = "scenario.json"
_NPY_HEADER_MOST = 16 * 2**10  # bytes: numpy itself refuses headers over 10,000
_ZIP_INDEX_MOST = 2**20  # bytes of central directory: MAX_NPZ_MEMBERS entries need far less
_EPOCH = (1980, 1, 1, 0, 0, 0)  # every member's date: the same scenario, the same bytes


def is_binary(path: str | os.PathLike[str]) -> bool:
    """Whether path names the binary form: any name ending in .npz (as .attn.npz does)."""
    return os.fsdecode(os.fspath(path)).lower().endswith(".npz")


def _put(members: dict[str, np.ndarray]) -> Callable[[str, np.ndarray], str]:
    """A matrix writer for the *_to_dict functions: keeps the array, returns its name."""

    def put(name: str, array: np.ndarray) -> str:
        members[name] = array
        return name

    return put


def _neutral_bits(s: Scenario, name: str) -> bool:
    """Whether an optional array holds its neutral value (0.0, or 1.0 for norm weights)
    bit for bit, so that leaving it out loses nothing (−0.0 is not neutral here)."""
    array = getattr(s, name)
    return bool(array.tobytes() == np.full(array.shape, 1.0 if "norm" in name else 0.0).tobytes())


def scenario_to_npz_parts(s: Scenario) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The document of an .attn.npz (each matrix replaced by its member's name) and the
    members by name."""
    members: dict[str, np.ndarray] = {}
    put = _put(members)
    shared = s.kv_heads != s.n_heads
    optional = False  # an optional array is written: version 2 at least (−0.0 biases too)

    def stacks(where: str, names: tuple[str, ...]) -> dict[str, str]:
        nonlocal optional
        out = {}
        for name in names:
            array = getattr(s, name)
            if name not in WEIGHT_NAMES:
                if not _in_use(s, name) and _neutral_bits(s, name):
                    continue
                optional, array = True, array[:, 0, :]
            out[name] = put(f"{where}.{name}", array)
        return out

    d: dict[str, Any] = {"format": FORMAT, "version": 1, "tokens": list(s.tokens)}
    d["X"] = put("X", s.X)
    if s.X_kv is not None:
        d["kv_tokens"], d["X_kv"] = list(s.key_tokens), put("X_kv", s.X_kv)
    d["heads"] = stacks("heads", Q_HEAD_KEYS if shared else HEAD_KEYS)
    if shared:
        d["kv_heads"] = stacks("kv_heads", KV_HEAD_KEYS)
    d["W_O"] = put("W_O", s.W_O)
    if not _neutral_bits(s, "b_O"):
        optional = True
        d["b_O"] = put("b_O", s.b_O[0])
    d["settings"] = settings_to_dict(s.settings)
    if s.settings.mask == "custom" and s.mask_matrix is not None:
        d["settings"]["mask_matrix"] = put("settings.mask_matrix", s.mask_matrix)
    if s.provenance is not None:
        d["provenance"] = provenance_to_dict(s.provenance, put)
    d["version"] = max(version_for(s), 2 if optional else 1)
    return d, members


def _write_npz(f: BinaryIO, document: dict[str, Any], members: dict[str, np.ndarray]) -> None:
    """Stream an uncompressed .npz to f: each array goes from memory to the file once."""
    text = json.dumps(document, ensure_ascii=False).encode("utf-8")
    arrays = {_DOCUMENT: np.frombuffer(text, dtype=np.uint8), **members}
    with zipfile.ZipFile(f, "w", zipfile.ZIP_STORED) as archive:
        for name, array in arrays.items():
            info = zipfile.ZipInfo(name + ".npy", date_time=_EPOCH)
            info.external_attr = 0o644 << 16
            data = np.ascontiguousarray(array)
            with archive.open(info, "w", force_zip64=True) as member:
                header = np.lib.format.header_data_from_array_1_0(data)
                np.lib.format.write_array_header_1_0(member, header)
                member.write(data.data.cast("B"))


@dataclass(frozen=True)
class _Member:
    """One array of an .attn.npz: its zip entry and its .npy header."""

    key: str  # the entry's name less ".npy": what the document names
    info: zipfile.ZipInfo
    start: int  # where a stored entry's bytes begin in the file; -1 for deflated ones
    header: bytes  # the .npy header, magic included
    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    fortran: bool


def _member_text(key: str) -> str:
    return f"member {clip(key)}"


class _Archive:
    """An .attn.npz open for reading. Opening checks the zip index, the entries' sizes
    (unpacked, against MAX_NPZ_BYTES) and every .npy header against its entry's size, all
    before any array's data is read; ``take`` checks what the document names."""

    def __init__(self, f: BinaryIO) -> None:
        self.f = f
        self.size = f.seek(0, os.SEEK_END)
        if self.size > MAX_NPZ_BYTES:
            raise FileFormatError(f"larger than {_size_text(MAX_NPZ_BYTES)}")
        f.seek(0)
        magic = f.read(4)
        if magic.lstrip(b"\xef\xbb\xbf \t\r\n")[:1] == b"{":
            raise FileFormatError("JSON text, not an .npz archive: name it .attn.json to open it")
        if magic not in (b"PK\x03\x04", b"PK\x05\x06"):
            raise FileFormatError("not an .attn.npz archive (not a zip file)")
        self._check_index()
        try:
            self.zip = zipfile.ZipFile(f)
            infos = self.zip.infolist()
        except Exception as e:  # zipfile can raise almost anything on a damaged index
            raise FileFormatError(f"damaged: not a readable zip archive ({_reason(e)})") from None
        total = 0
        for info in infos:  # sizes first: nothing is read from a zip bomb
            total += info.file_size
            if info.file_size > MAX_NPZ_BYTES or total > MAX_NPZ_BYTES:
                raise FileFormatError(
                    f"{_member_text(info.filename.removesuffix('.npy'))}: unpacks to "
                    f"{_size_text(info.file_size)}; "
                    f"an .attn.npz unpacks to at most {_size_text(MAX_NPZ_BYTES)} in all"
                )
        self.members: dict[str, _Member] = {}
        for info in infos:
            if not info.filename.endswith(".npy"):
                raise FileFormatError(
                    f"{_member_text(info.filename)}: not an .npy array (an .attn.npz holds "
                    f"{_DOCUMENT} and the arrays it names)"
                )
            key = info.filename[:-4]
            if key in self.members:
                raise FileFormatError(f"{_member_text(key)}: appears twice")
            self.members[key] = self._header(key, info)
        self.named: dict[str, str] = {}  # member key: the field that names it

    def _check_index(self) -> None:
        """Refuse, before zipfile reads it, an index that is missing or too large."""
        tail = min(self.size, 22 + 0xFFFF)  # the end record and the longest comment
        self.f.seek(self.size - tail)
        data = self.f.read(tail)
        at = data.rfind(b"PK\x05\x06")
        if at < 0 or len(data) - at < 22:
            raise FileFormatError("damaged or cut short: the zip index at its end is missing")
        entries, index_bytes = struct.unpack_from("<HL", data, at + 10)
        if entries > MAX_NPZ_MEMBERS:
            raise FileFormatError(
                f"{entries:,} members; an .attn.npz holds at most {MAX_NPZ_MEMBERS}"
            )
        if index_bytes > _ZIP_INDEX_MOST:
            raise FileFormatError(f"damaged: its zip index says it is {index_bytes:,} bytes")

    def _start(self, key: str, info: zipfile.ZipInfo) -> int:
        """Where a stored entry's bytes begin, from its local header."""
        self.f.seek(info.header_offset)
        local = self.f.read(30)
        if len(local) < 30 or local[:4] != b"PK\x03\x04":
            raise FileFormatError(f"{_member_text(key)}: damaged (its zip entry is missing)")
        name_bytes, extra_bytes = struct.unpack_from("<HH", local, 26)
        start = info.header_offset + 30 + name_bytes + extra_bytes
        if info.compress_size != info.file_size:
            raise FileFormatError(f"{_member_text(key)}: damaged (a stored entry of two sizes)")
        if start + info.compress_size > self.size:
            raise FileFormatError(f"{_member_text(key)}: cut short")
        return start

    def _header(self, key: str, info: zipfile.ZipInfo) -> _Member:
        """Read and check a member's .npy header: its shape must fit the entry's size."""
        name = _member_text(key)
        if info.flag_bits & 0x1:
            raise FileFormatError(f"{name}: encrypted")
        most = min(info.file_size, _NPY_HEADER_MOST)
        if info.compress_type == zipfile.ZIP_STORED:
            start = self._start(key, info)
            self.f.seek(start)
            prefix = self.f.read(most)
        elif info.compress_type == zipfile.ZIP_DEFLATED:
            start = -1
            try:
                with self.zip.open(info) as entry:
                    prefix = entry.read(most)
            except Exception as e:  # a damaged entry fails in zipfile or zlib
                raise FileFormatError(f"{name}: damaged ({_reason(e)})") from None
        else:
            raise FileFormatError(
                f"{name}: compressed by method {info.compress_type}; attnviz reads "
                "stored and deflated members"
            )
        f = io.BytesIO(prefix)
        try:
            version = np.lib.format.read_magic(f)
            width = {(1, 0): 2, (2, 0): 4}.get(version)
            if width is None:
                raise ValueError(f"format version {version[0]}.{version[1]} is not supported")
            length = int.from_bytes(prefix[8 : 8 + width], "little")
            if length > 10_000:
                raise ValueError(f"a header of {length:,} bytes (at most 10,000)")
            read_header = (
                np.lib.format.read_array_header_1_0
                if version == (1, 0)
                else np.lib.format.read_array_header_2_0
            )
            shape, fortran, dtype = read_header(f)
        except Exception as e:  # numpy's header parser can raise almost anything on junk
            raise FileFormatError(f"{name}: not a .npy array: {_reason(e)}") from None
        if dtype.hasobject:
            raise FileFormatError(f"{name}: holds Python objects (pickles are never loaded)")
        if not all(type(d) is int and d >= 0 for d in shape):
            raise FileFormatError(f"{name}: not a .npy array: shape {clip(shape)}")
        header = prefix[: f.tell()]
        declared = math.prod(shape) * dtype.itemsize
        if declared != info.file_size - len(header):
            raise FileFormatError(
                f"{name}: its header declares {_shape(shape)} {dtype} values "
                f"({declared:,} bytes), the member holds {info.file_size - len(header):,}"
            )
        return _Member(key, info, start, header, shape, dtype, bool(fortran))

    def document(self) -> Any:
        """The parsed scenario.json."""
        m = self.members.get(_DOCUMENT)
        if m is None:
            raise FileFormatError(f"no {_DOCUMENT} member: not an attnviz scenario archive")
        if m.dtype != np.uint8 or len(m.shape) != 1:
            raise FileFormatError(
                f"{_DOCUMENT}: expected UTF-8 bytes (a 1-D uint8 array), "
                f"got {m.dtype} values of shape {clip(m.shape)}"
            )
        if m.info.file_size > MAX_NPZ_DOCUMENT:
            raise FileFormatError(f"{_DOCUMENT}: larger than {_size_text(MAX_NPZ_DOCUMENT)}")
        raw = self.read(m).tobytes()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise FileFormatError(f"{_DOCUMENT}: not UTF-8 text (byte {e.start + 1})") from None
        _check_counts(text)
        try:
            return json.loads(text, parse_constant=_constant, object_pairs_hook=_no_duplicates)
        except json.JSONDecodeError as e:
            raise FileFormatError(
                f"{_DOCUMENT}: not valid JSON: {e.msg} at line {e.lineno}, column {e.colno}"
            ) from None
        except RecursionError:
            raise FileFormatError(f"{_DOCUMENT}: nested too deeply to be a scenario") from None
        except ValueError as e:
            if isinstance(e, FileFormatError):
                raise
            raise FileFormatError(f"{_DOCUMENT}: not valid JSON: {e}") from None

    def take(self, where: str, ref: Any, axes: str) -> _Member:
        """The float64 member that field where names, with len(axes) dimensions."""
        if not isinstance(ref, str):
            raise FileFormatError(
                f"{where}: expected the name of an array in the archive, got {clip(ref)}"
            )
        if ref == _DOCUMENT:
            raise FileFormatError(f"{where}: names {_DOCUMENT}, the document, not an array")
        m = self.members.get(ref)
        if m is None:
            raise FileFormatError(f"{where}: names {clip(ref)}, which the archive does not hold")
        if ref in self.named:
            raise FileFormatError(f"{where}: names {clip(ref)}, as {self.named[ref]} does")
        self.named[ref] = where
        if m.dtype.kind != "f" or m.dtype.itemsize != 8:
            raise FileFormatError(f"{where}: holds {m.dtype} values; expected float64")
        ndim = axes.count("×") + 1
        if len(m.shape) != ndim:
            got = _shape(m.shape) if m.shape else "a single number"
            raise FileFormatError(f"{where}: expected {ndim}-D ({axes}), got {got}")
        if 0 in m.shape:
            raise FileFormatError(f"{where}: a {_shape(m.shape)} array holds no numbers")
        cells = math.prod(m.shape[-2:])
        if cells > MAX_MATRIX_CELLS:
            per = " per head" if ndim == 3 else ""
            raise FileFormatError(
                f"{where}: {_shape(m.shape)} is over {MAX_MATRIX_CELLS} cells{per}"
            )
        return m

    def check_all_named(self) -> None:
        unnamed = sorted(set(self.members) - set(self.named) - {_DOCUMENT})
        if unnamed:
            raise FileFormatError(
                f"{_member_text(unnamed[0])}: not named by {_DOCUMENT} (an .attn.npz holds "
                "only the arrays its document names)"
            )

    def read(self, m: _Member) -> np.ndarray:
        """A member's array, read-only, C order, native byte order; the CRC is checked."""
        count = math.prod(m.shape)
        if m.start >= 0:
            array = np.empty(count, dtype=m.dtype)
            view = array.data.cast("B")
            self.f.seek(m.start + len(m.header))
            done = 0
            while done < len(view):
                got = self.f.readinto(view[done:])  # type: ignore[attr-defined]
                if not got:
                    raise FileFormatError(f"{_member_text(m.key)}: cut short")
                done += got
            if zlib.crc32(view, zlib.crc32(m.header)) != m.info.CRC:
                raise FileFormatError(
                    f"{_member_text(m.key)}: damaged (its CRC-32 checksum does not match)"
                )
        else:
            try:
                with self.zip.open(m.info) as entry:
                    raw = entry.read()  # zipfile stops at file_size and checks the CRC
            except Exception as e:
                raise FileFormatError(f"{_member_text(m.key)}: damaged ({_reason(e)})") from None
            if len(raw) != m.info.file_size:
                raise FileFormatError(f"{_member_text(m.key)}: cut short")
            array = np.frombuffer(raw, dtype=m.dtype, count=count, offset=len(m.header))
        array = array.reshape(m.shape, order="F" if m.fortran else "C")
        if m.fortran or not m.dtype.isnative:
            array = np.ascontiguousarray(array, dtype=m.dtype.newbyteorder("="))
        array.flags.writeable = False  # so that the Scenario keeps it without a copy
        return array


def _npz_heads(
    archive: _Archive,
    where: str,
    value: Any,
    names: tuple[tuple[str, ...], tuple[str, ...]],
    version: int,
    d_model: int,
    d_k: int | None,
) -> tuple[dict[str, _Member], int, int]:
    """The per-head stacks an .attn.npz document names: (members, heads, d_k)."""
    required, allowed = names
    if not isinstance(value, dict):
        raise FileFormatError(
            f"{where}: expected an object naming the per-head stacks, e.g. "
            f'{{"W_Q": "{where}.W_Q", ...}}'
        )
    newer = [k for k in value if k in HEAD_KEYS and k not in V1_HEAD_KEYS]
    if version < 2 and newer:
        raise FileFormatError(f"{where}.{newer[0]}: needs version 2 (the file says 1)")
    extra = sorted(set(value) - set(allowed))
    missing = [n for n in required if n not in value]
    if extra or missing:
        problem = f"{_name(extra[0])}: unknown field" if extra else f"{missing[0]}: missing"
        raise FileFormatError(f"{where}.{problem}")
    stacks: dict[str, _Member] = {}
    count = None
    for name in sorted((n for n in allowed if n in value), key=lambda n: n in VECTORS):
        at = f"{where}.{name}"
        if name in VECTORS:
            m = archive.take(at, value[name], "heads × d_k")
            assert count is not None and d_k is not None  # a matrix came first
            _expect_shape(at, m.shape, (count, d_k))
        else:
            m = archive.take(at, value[name], "heads × d_model × d_k")
            count = m.shape[0] if count is None else count
            d_k = m.shape[2] if d_k is None else d_k
            if m.shape[0] > LIMITS.heads:
                raise FileFormatError(f"{at}: {m.shape[0]} heads; the limit is {LIMITS.heads}")
            _expect_shape(at, m.shape, (count, d_model, d_k))
        stacks[name] = m
    assert count is not None and d_k is not None
    return stacks, count, d_k


def _scenario_from_archive(archive: _Archive) -> Scenario:
    data = archive.document()
    version = _document(data)
    take = archive.take
    tokens = _tokens("tokens", data["tokens"])
    n = len(tokens)
    plan = {"X": take("X", data["X"], "n × d_model")}
    d_model = plan["X"].shape[1]
    _expect_shape("X", plan["X"].shape, (n, d_model))
    labels: dict[str, Any] = {}
    if ("kv_tokens" in data) != ("X_kv" in data):
        raise FileFormatError("X_kv: cross-attention needs both kv_tokens and X_kv")
    m = n
    if "X_kv" in data:
        labels["kv_tokens"] = tuple(_tokens("kv_tokens", data["kv_tokens"]))
        m = len(labels["kv_tokens"])
        plan["X_kv"] = take("X_kv", data["X_kv"], "m × d_model")
        _expect_shape("X_kv", plan["X_kv"].shape, (m, d_model))
    shared = "kv_heads" in data
    allowed = (Q_HEAD_KEYS if shared else HEAD_KEYS) if version >= 2 else V1_HEAD_KEYS
    required = ("W_Q",) if shared else V1_HEAD_KEYS
    heads, h, d_k = _npz_heads(
        archive, "heads", data["heads"], (required, allowed), version, d_model, None
    )
    plan.update(heads)
    if shared:
        names = (("W_K", "W_V"), KV_HEAD_KEYS)
        kv, g, _ = _npz_heads(archive, "kv_heads", data["kv_heads"], names, version, d_model, d_k)
        if h % g:
            raise FileFormatError(f"kv_heads: {g} key/value heads do not divide {h} query heads")
        plan.update(kv)
    plan["W_O"] = take("W_O", data["W_O"], "heads·d_k × d_model")
    _expect_shape("W_O", plan["W_O"].shape, (h * d_k, d_model))
    if "b_O" in data:
        plan["b_O"] = take("b_O", data["b_O"], "d_model")
        _expect_shape("b_O", plan["b_O"].shape, (d_model,))
    settings_value = data.get("settings", {})
    settings = _settings(settings_value, version)
    if settings.mask == "custom":
        if "mask_matrix" not in settings_value:
            raise FileFormatError("settings.mask_matrix: missing (the custom mask needs it)")
        mask = take("settings.mask_matrix", settings_value["mask_matrix"], "n × m")
        _expect_shape("settings.mask_matrix", mask.shape, (n, m))
        plan["mask_matrix"] = mask
    elif "mask_matrix" in settings_value:
        raise FileFormatError(
            f"settings.mask_matrix: only for the custom mask (mask is {settings.mask!r})"
        )
    model = None
    if "provenance" in data:
        fields = _provenance_fields(data["provenance"])
        cube = take("provenance.model_weights", data["provenance"]["model_weights"], "h × n × n")
        out = take("provenance.model_output", data["provenance"]["model_output"], "n × d_model")
        _provenance_shapes(cube.shape, out.shape)
        model = (fields, cube, out)
    archive.check_all_named()

    arrays: dict[str, Any] = {name: archive.read(member) for name, member in plan.items()}
    for name in VECTORS:
        if name in arrays:  # stored as heads × d_k (d_model for b_O), held as heads × 1 × d_k
            a = arrays[name]
            arrays[name] = a.reshape(1, -1) if a.ndim == 1 else a.reshape(a.shape[0], 1, -1)
    provenance = None
    if model is not None:
        fields, cube, out = model
        provenance = _make_provenance(fields, archive.read(cube), archive.read(out))
    try:
        return Scenario(
            tokens=tuple(tokens), settings=settings, provenance=provenance, **labels, **arrays
        )
    except ScenarioError as e:
        raise FileFormatError(str(e)) from None


def scenario_from_npz(f: BinaryIO) -> Scenario:
    """Read and check an .attn.npz from a binary file open for reading (seekable)."""
    try:
        return _scenario_from_archive(_Archive(f))
    except OSError as e:
        raise FileFormatError(f"cannot read: {e.strerror or e}") from None


# Paths: names for messages, reading regular files only ---------------------------------

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a named pipe"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)
_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)


def printable(path: str | os.PathLike[str]) -> str:
    """A path as text for messages, titles and menus: bytes that are not UTF-8 show as "�"."""
    return os.fsencode(path).decode("utf-8", "replace")


def _not_regular(mode: int) -> str:
    """What a file of this mode is, when it is not a regular file ("" when it is)."""
    if stat.S_ISREG(mode):
        return ""
    kind = next((name for is_kind, name in _KINDS if is_kind(mode)), "a special file")
    return f"{kind}, not a regular file"


def _size_text(n: int) -> str:
    return f"{n // 2**20} MiB" if n >= 2**20 else f"{n // 2**10} KiB"


def open_regular(path: str | os.PathLike[str]) -> BinaryIO:
    """Open path for reading if it is a regular file; FileFormatError naming it otherwise.

    Never blocks: the file is opened non-blocking and checked on the opened descriptor,
    so a pipe swapped in after the first check is refused too.
    """
    name = printable(path)
    try:
        kind = _not_regular(os.stat(path).st_mode)  # a device is not even opened
        fd = -1 if kind else os.open(path, _OPEN_FLAGS)
    except OSError as e:
        raise FileFormatError(f"{name}: cannot read: {e.strerror or e}") from None
    except ValueError:  # a NUL byte in the name
        raise FileFormatError(f"{name}: cannot read: not a valid file name") from None
    if kind:
        raise FileFormatError(f"{name}: cannot read: {kind}")
    try:
        kind = _not_regular(os.fstat(fd).st_mode)
        if kind:
            raise FileFormatError(f"{name}: cannot read: {kind}")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_file(path: str | os.PathLike[str], limit: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of a regular file of at most limit bytes; FileFormatError otherwise."""
    with open_regular(path) as f:
        try:
            size = os.fstat(f.fileno()).st_size
            chunks = [] if size > limit else [f.read(size + 1)]
            while chunks and chunks[-1] and sum(map(len, chunks)) <= limit:
                chunks.append(f.read(2**20))  # it grew, or says 0 bytes as /proc files do
        except OSError as e:
            raise FileFormatError(f"{printable(path)}: cannot read: {e.strerror or e}") from None
    data = b"".join([c for c in chunks if c])  # one chunk is returned as is, not copied
    if size > limit or len(data) > limit:
        raise FileFormatError(f"{printable(path)}: larger than {_size_text(limit)}")
    return data


def _with_path(path: str | os.PathLike[str], load: Callable[[], Any]) -> Any:
    try:
        return load()
    except FileFormatError as e:
        raise FileFormatError(f"{printable(Path(path).name)}: {e}") from None


def load_scenario(path: str | os.PathLike[str]) -> Scenario:
    """Read a scenario file, .attn.npz (binary) or .attn.json (text) by its suffix;
    raises FileFormatError naming the file and the problem."""
    if is_binary(path):
        with open_regular(path) as f:
            return _with_path(path, lambda: scenario_from_npz(f))  # type: ignore[no-any-return]
    data = read_file(path)
    return _with_path(path, lambda: scenario_from_json(data))  # type: ignore[no-any-return]


# Atomic writes, and the temporary files of killed saves ---------------------------------

STARTED = time.time()  # temporary files older than this process are no save of ours
_TEMP_TAIL = re.compile(r"([1-9][0-9]{0,9})-[a-z0-9_]{8}\.tmp")


def _temp_prefix(path: str | os.PathLike[str]) -> str:
    """ ".<name>.attnviz-": how every temporary file written for path starts."""
    name = os.fsencode(os.path.basename(os.path.abspath(path)))[:120]  # room in NAME_MAX
    return "." + os.fsdecode(name) + ".attnviz-"


def _alive(pid: int) -> bool:
    """Whether a process with this id runs (assumed so where that cannot be asked)."""
    if pid == os.getpid() or os.name != "posix":  # on Windows os.kill would end it
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (OSError, OverflowError):
        return True  # e.g. another user's process
    return True


def remove_stale_temps(path: str | os.PathLike[str]) -> list[str]:
    """Remove what killed saves of path left: our temporary files (named after path,
    regular, ours) whose process is gone or that are older than this process.

    Returns the names removed; anything else in the folder is never touched.
    """
    folder = os.path.dirname(os.path.abspath(path))
    prefix = _temp_prefix(path)
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    removed = []
    for name in names:
        tail = _TEMP_TAIL.fullmatch(name[len(prefix) :]) if name.startswith(prefix) else None
        if tail is None:
            continue
        full = os.path.join(folder, name)
        with contextlib.suppress(OSError):
            st = os.lstat(full)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != getattr(os, "getuid", lambda: 0)():
                continue
            if _alive(int(tail[1])) and st.st_mtime >= STARTED:
                continue  # a save in progress
            os.unlink(full)
            removed.append(name)
    return removed


def _mode_for(path: str | os.PathLike[str]) -> int:
    """Keep an existing file's permissions; a new file gets the usual 0o666 less the umask."""
    try:
        return os.stat(path).st_mode & 0o777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def atomic_write(path: str | os.PathLike[str], data: bytes | Callable[[BinaryIO], None]) -> None:
    """Write data (bytes, or what ``data(file)`` writes) to a temporary file in the same
    folder, then rename it over path.

    Refuses (OSError) a path that is a directory, device or pipe: the rename would replace it.
    """
    try:
        kind = _not_regular(os.stat(path).st_mode)
    except (OSError, ValueError):
        kind = ""  # a new file, or a name that open will refuse below
    if kind:
        raise OSError(errno.EINVAL, kind, os.fspath(path))
    folder = os.path.dirname(os.path.abspath(path))
    remove_stale_temps(path)
    prefix = f"{_temp_prefix(path)}{os.getpid()}-"
    fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=".tmp", dir=folder)
    try:
        os.fchmod(fd, _mode_for(path))
        with os.fdopen(fd, "wb") as f:
            if isinstance(data, bytes):
                f.write(data)
            else:
                data(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def save_scenario(path: str | os.PathLike[str], s: Scenario) -> None:
    """Write s atomically, as .attn.npz (binary) or .attn.json (text) by the suffix."""
    if is_binary(path):
        document, members = scenario_to_npz_parts(s)
        atomic_write(path, lambda f: _write_npz(f, document, members))
    else:
        atomic_write(path, scenario_to_json(s).encode("utf-8"))


# Matrices: CSV and .npy ---------------------------------------------------------------


def matrix_from_csv(text: str) -> np.ndarray:
    """Comma-separated rows of numbers (blank lines ignored) as a float64 array.

    ``text.parse_table`` reads it, with sep "," and rows named by their line in the file;
    rows and columns are counted before any line is split, so a file larger than any
    matrix a scenario holds is refused without building objects for its cells. Any
    problem is a FileFormatError.
    """
    try:
        return parse_table(text, sep=",", max_cells=MAX_MATRIX_CELLS, by_line=True)
    except ValueError as e:
        raise FileFormatError(str(e)) from None


def matrix_to_csv(a: np.ndarray) -> str:
    """Rows of comma-separated numbers that read back exactly."""
    return "".join(",".join(repr(float(v)) for v in row) + "\n" for row in np.asarray(a))


def _reason(e: BaseException) -> str:
    """What numpy, zipfile or json said, in one line; never advice to load pickles."""
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    if "pickle" in text.lower():
        return "holds Python objects (pickles are never loaded)"
    return text[:200] + "…" if len(text) > 200 else text


def _npy(data: bytes) -> np.ndarray:
    f = io.BytesIO(data)
    try:
        version = np.lib.format.read_magic(f)
        header = (
            np.lib.format.read_array_header_1_0(f)
            if version == (1, 0)
            else np.lib.format.read_array_header_2_0(f)
        )
    except Exception as e:  # numpy's header parser can raise almost anything on junk
        raise FileFormatError(f"not a .npy array: {_reason(e)}") from None
    shape, _, dtype = header
    if not all(type(d) is int for d in shape):
        raise FileFormatError(f"not a .npy array: shape {clip(shape)}")
    if dtype.hasobject:
        raise FileFormatError("holds Python objects (pickles are never loaded)")
    if dtype.kind not in "fiu":
        raise FileFormatError(f"holds {dtype} values; expected real numbers")
    if len(shape) != 2:
        raise FileFormatError(f"expected a 2-D matrix, got shape {shape}")
    if 0 in shape:
        raise FileFormatError(f"a {_shape(shape)} matrix holds no numbers")
    if math.prod(shape) > MAX_MATRIX_CELLS:
        raise FileFormatError(f"{_shape(shape)} is over {MAX_MATRIX_CELLS} cells")
    try:
        f.seek(0)
        array = np.load(f, allow_pickle=False)
    except (ValueError, OSError, EOFError) as e:
        raise FileFormatError(f"cannot read the array: {_reason(e)}") from None
    array = array.astype(np.float64)
    try:
        check_values("matrix", array)
    except ScenarioError as e:
        raise FileFormatError(str(e)) from None
    return array


def load_matrix(path: str | os.PathLike[str]) -> np.ndarray:
    """A matrix from .csv or .npy (chosen by suffix); FileFormatError on any problem."""
    suffix = Path(path).suffix.lower()
    if suffix not in (".csv", ".npy"):
        raise FileFormatError(f"{Path(path).name}: expected a .csv or .npy file")
    data = read_file(path)
    if suffix == ".npy":
        return _with_path(path, lambda: _npy(data))  # type: ignore[no-any-return]

    def csv() -> np.ndarray:
        try:
            return matrix_from_csv(data.decode("utf-8-sig"))
        except UnicodeDecodeError as e:
            raise FileFormatError(f"not UTF-8 text (byte {e.start + 1})") from None

    return _with_path(path, csv)  # type: ignore[no-any-return]


def save_matrix(path: str | os.PathLike[str], a: np.ndarray) -> None:
    """Write a matrix as .csv or .npy (chosen by suffix), atomically; never a pickle."""
    suffix = Path(path).suffix.lower()
    if suffix == ".npy":
        buffer = io.BytesIO()
        np.save(buffer, np.asarray(a, dtype=np.float64), allow_pickle=False)
        atomic_write(path, buffer.getvalue())
    elif suffix == ".csv":
        atomic_write(path, matrix_to_csv(a).encode("utf-8"))
    else:
        raise FileFormatError(f"{Path(path).name}: expected a .csv or .npy file")


# Snapshots: the window's autosave, binary so that large scenarios save in milliseconds ---


def save_snapshot(path: str | os.PathLike[str], s: Scenario) -> None:
    """Write s as an .npz archive of plain arrays (no pickles), atomically."""
    buffer = io.BytesIO()
    settings = settings_to_dict(s.settings)
    labels: dict[str, Any] = {"tokens": np.array(s.tokens, dtype=np.str_)}
    if s.kv_tokens is not None:
        labels["kv_tokens"] = np.array(s.kv_tokens, dtype=np.str_)
    arrays: dict[str, Any] = {**labels, **s.arrays()}
    if s.provenance is not None:
        provenance = provenance_to_dict(s.provenance, _put(arrays))
        arrays["provenance"] = np.array(json.dumps(provenance))
    np.savez(buffer, settings=np.array(json.dumps(settings)), **arrays)
    atomic_write(path, buffer.getvalue())


def load_snapshot(path: str | os.PathLike[str]) -> Scenario:
    """Read a snapshot written by save_snapshot; FileFormatError on any problem."""
    name = printable(Path(path).name)
    with open_regular(path) as f:
        try:
            if f.read(4) != b"PK\x03\x04":
                raise FileFormatError(f"{name}: not an attnviz snapshot (not an .npz archive)")
            f.seek(0)
            with np.load(f, allow_pickle=False) as archive:
                arrays = {k: archive[k] for k in MATRIX_NAMES if k in archive.files}
                labels = {
                    k: tuple(str(t) for t in archive[k].tolist())
                    for k in ("tokens", "kv_tokens")
                    if k in archive.files
                }
                settings = _settings(json.loads(str(archive["settings"])))
                provenance = None
                if "provenance" in archive.files:
                    provenance = _snapshot_provenance(archive)
            return Scenario(
                settings=settings,
                provenance=provenance,
                **labels,  # type: ignore[arg-type]
                **arrays,
            )
        except FileFormatError:
            raise
        except Exception as e:  # a damaged archive can fail in zipfile, numpy or json
            raise FileFormatError(f"{name}: not a readable snapshot: {_reason(e)}") from None


def _snapshot_provenance(archive: Any) -> Provenance:
    """The provenance a snapshot holds: a JSON member naming the arrays beside it."""
    value = json.loads(str(archive["provenance"]))
    fields = _provenance_fields(value)
    arrays = []
    for key in ("model_weights", "model_output"):
        ref = value[key]
        if not isinstance(ref, str) or ref not in archive.files:
            raise FileFormatError(f"provenance.{key}: names {clip(ref)}, which is not there")
        arrays.append(np.asarray(archive[ref], dtype=np.float64))
    _provenance_shapes(arrays[0].shape, arrays[1].shape)
    return _make_provenance(fields, *arrays)
