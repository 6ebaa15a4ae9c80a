"""Scenario files (``.attn.json``) and matrix files (CSV, ``.npy``).

Loading never executes anything from a file (no pickles), checks every shape and number,
and raises ``FileFormatError`` (one type for every bad file) whose message names the
problem and where, e.g. ``heads[2].W_K: expected 4×2, got 4×3``. Nothing is returned
half-loaded. Every read goes through ``open_regular``: only regular files are read, so a
named pipe or a device never blocks the program. Writes are atomic: a temporary file
named after the target in the same folder, then a rename; the temporary files of a save
that was killed are removed before the next save of the same file.
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
import tempfile
import time
from collections.abc import Callable
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

FORMAT = "attnviz-scenario"
VERSION = 2  # the newest this attnviz reads; a save writes 1 unless a version-2 field is used
VERSIONS = (1, 2)
SUFFIX = ".attn.json"
MAX_FILE_BYTES = 256 * 2**20
MAX_MATRIX_CELLS = 2**24
V1_TOP_KEYS = ("format", "version", "tokens", "X", "heads", "W_O", "settings")
V2_TOP_KEYS = ("kv_tokens", "X_kv", "kv_heads", "b_O")
TOP_KEYS = set(V1_TOP_KEYS + V2_TOP_KEYS)
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
    d["version"] = version_for(s)
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
    """1, unless the scenario uses something only version 2 can hold."""
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


def _shape(shape: tuple[int, ...]) -> str:
    return "×".join(map(str, shape))


def _matrix(where: str, value: Any) -> np.ndarray:
    """A list of equal-length rows of finite numbers, as a float64 array.

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
    try:
        check_values(where, array)
    except ScenarioError as e:
        raise FileFormatError(str(e)) from None
    array.flags.writeable = False  # so that the Scenario keeps it without a copy
    return array


def _expect_shape(where: str, array: np.ndarray, shape: tuple[int, int]) -> None:
    if array.shape != shape:
        raise FileFormatError(f"{where}: expected {_shape(shape)}, got {_shape(array.shape)}")


def _settings(value: Any, version: int = VERSION) -> Settings:
    if not isinstance(value, dict):
        raise FileFormatError("settings: expected an object")
    if version == 1:
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


def scenario_from_dict(data: Any) -> Scenario:
    """Check and convert a parsed .attn.json document."""
    if not isinstance(data, dict):
        raise FileFormatError("expected a JSON object at the top")
    if data.get("format") != FORMAT:
        raise FileFormatError(f"format: expected {FORMAT!r}, got {clip(data.get('format'))}")
    version = data.get("version")
    if type(version) is not int or version not in VERSIONS:
        raise FileFormatError(
            f"version: {clip(version, 20)} is not supported (this attnviz reads "
            f"{' and '.join(map(str, VERSIONS))})"
        )
    unknown = sorted(set(data) - TOP_KEYS)
    if unknown:
        raise FileFormatError(f"{_name(unknown[0])}: unknown field")
    if version == 1:
        newer = [k for k in V2_TOP_KEYS if k in data]
        if newer:
            raise FileFormatError(f"{newer[0]}: needs version 2 (the file says 1)")
    for key in ("tokens", "X", "heads", "W_O"):
        if key not in data:
            raise FileFormatError(f"{key}: missing")

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
    allowed = (Q_HEAD_KEYS if shared else HEAD_KEYS) if version == 2 else V1_HEAD_KEYS
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


def _most_containers() -> int:
    """The most lists and objects a scenario within LIMITS holds, counting every
    character of its token labels as a bracket (a label may hold "[" or "{")."""
    lim = LIMITS
    rows = 3 * lim.tokens + 3 * lim.heads * lim.d_model + lim.heads * lim.d_k  # X, X_kv, mask
    matrices = 4 + 3 * lim.heads
    vectors = 5 * lim.heads + 4  # biases and norm weights; b_O, slopes, sinks, ablated
    others = 5 + 2 * lim.heads  # document, tokens, heads lists, settings; each head
    return rows + matrices + vectors + others + 2 * lim.tokens * lim.token_chars


def _most_quotes() -> int:
    """The most quotation marks a scenario within LIMITS holds (a label may hold \")."""
    lim = LIMITS
    keys = len(TOP_KEYS) + len(SETTINGS_KEYS) + 2 * len(HEAD_KEYS) * lim.heads
    strings = 1 + keys + 6 + 2 * lim.tokens  # the format, string settings and labels
    return 2 * strings + 2 * lim.tokens * lim.token_chars


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
# list or object in it. The character class cannot backtrack, so matching is linear.
_ROW = re.compile(r'([\[,]\s*)(\[[^\[\]{}"]*\])')
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
    """Read a .attn.json file; raises FileFormatError naming the file and the problem."""
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


def atomic_write(path: str | os.PathLike[str], data: bytes) -> None:
    """Write data to a temporary file in the same folder, then rename it over path.

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
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def save_scenario(path: str | os.PathLike[str], s: Scenario) -> None:
    """Write s as .attn.json, atomically."""
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
            return Scenario(settings=settings, **labels, **arrays)  # type: ignore[arg-type]
        except FileFormatError:
            raise
        except Exception as e:  # a damaged archive can fail in zipfile, numpy or json
            raise FileFormatError(f"{name}: not a readable snapshot: {_reason(e)}") from None
