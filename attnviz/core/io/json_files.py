"""The ``.attn.json`` form: a Scenario as a JSON document (``scenario_to_dict``) and as
text with one matrix row per line (``scenario_to_json``), and back.

Reading text is bounded before it is parsed: ``check_counts`` refuses more lists,
objects or strings than a scenario within the limits could hold, and matrix rows are
parsed one at a time into arrays (``_Rows``), so memory stays a small multiple of the
file. The .attn.npz form reads its ``scenario.json`` with the same bounds.
"""

from __future__ import annotations

import bisect
import json
import math
import re
import secrets
from typing import Any

import numpy as np

from attnviz.core.io.checks import (
    MAX_FILE_BYTES,
    FileFormatError,
    check_numbers,
    expect_shape,
    key_text,
    matrix_field,
)
from attnviz.core.io.provenance_files import (
    PROVENANCE_FILES,
    PROVENANCE_KEYS,
    PROVENANCE_TEXTS,
    provenance_chars,
    provenance_from_json,
    provenance_to_dict,
)
from attnviz.core.io.scenario_document import (
    FORMAT,
    HEAD_KEYS,
    KV_HEAD_KEYS,
    Q_HEAD_KEYS,
    SETTINGS_KEYS,
    TOP_KEYS,
    V1_HEAD_KEYS,
    VECTORS,
    check_document,
    document_settings,
    head_keys,
    in_use,
    settings_to_dict,
    tokens_field,
    version_for,
)
from attnviz.core.io.text import TABLE_COLS
from attnviz.core.maths.scenario import LIMITS, WEIGHT_NAMES, Scenario, ScenarioError, from_heads

SUFFIX = ".attn.json"


# Scenario -> document -> text ---------------------------------------------------------


def _rows(a: np.ndarray) -> list[list[float]]:
    return a.tolist()  # type: ignore[no-any-return]


def _head_dicts(s: Scenario, names: tuple[str, ...], count: int) -> list[dict[str, Any]]:
    used = [n for n in names if n in WEIGHT_NAMES or in_use(s, n)]
    return [
        {n: getattr(s, n)[h][0].tolist() if n in VECTORS else _rows(getattr(s, n)[h]) for n in used}
        for h in range(count)
    ]


def scenario_to_dict(s: Scenario) -> dict[str, Any]:
    """Exactly what an .attn.json save writes: the version-1 fields, and each version-2
    field only where it is in use."""
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
    if s.settings.loss_target == "custom" and s.target is not None:
        d["settings"]["target"] = _rows(s.target)
    if s.settings.positional == "relative-bias" and s.relative_bias is not None:
        d["settings"]["relative_bias"] = _rows(s.relative_bias)
    if s.provenance is not None:
        d["provenance"] = provenance_to_dict(s.provenance, lambda _, a: a.tolist())
    d["version"] = version_for(s)
    return d


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
    # the custom mask and T5's relative bias: a matrix row a line, at the settings' end
    grids = {k: settings.pop(k) for k in ("mask_matrix", "relative_bias") if k in settings}
    parts = []
    for key, v in d.items():
        if key in ("heads", "kv_heads"):
            parts.append(f'  "{key}": [\n{heads(v)}\n  ]')
        elif key == "settings":
            text = json.dumps(settings)
            for k, grid in grids.items():
                text = text[:-1] + f', "{k}": {matrix(grid, "  ")}}}'
            parts.append(f'  "settings": {text}')
        elif key == "provenance":
            parts.append(f'  "provenance": {provenance(v)}')
        else:
            parts.append(f'  "{key}": {value(key, v, "  ")}')
    return "{\n" + ",\n".join(parts) + "\n}\n"


# Document -> Scenario ------------------------------------------------------------------


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
    check_numbers(where, array[0])
    return array


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
            problem = f"{key_text(extra[0])}: unknown field" if extra else f"{missing[0]}: missing"
            raise FileFormatError(f"{at}.{problem}")
        mats = {}
        for name in (n for n in allowed if n in head and n not in VECTORS):
            m = matrix_field(f"{at}.{name}", head[name])
            d_k = m.shape[1] if d_k is None else d_k
            expect_shape(f"{at}.{name}", m, (d_model, d_k))
            mats[name] = m
        assert d_k is not None
        for name in (n for n in allowed if n in head and n in VECTORS):
            mats[name] = _vector(f"{at}.{name}", head[name], d_k)
        parsed.append(mats)
    assert d_k is not None
    return parsed, d_k


def scenario_from_dict(data: Any) -> Scenario:
    """Check and convert a parsed .attn.json document."""
    version = check_document(data)
    tokens = tokens_field("tokens", data["tokens"])
    X = matrix_field("X", data["X"])
    n, d_model = len(tokens), X.shape[1]
    expect_shape("X", X, (n, d_model))
    extra: dict[str, Any] = {}
    if ("kv_tokens" in data) != ("X_kv" in data):
        raise FileFormatError("X_kv: cross-attention needs both kv_tokens and X_kv")
    if "X_kv" in data:
        kv_tokens = tokens_field("kv_tokens", data["kv_tokens"])
        X_kv = matrix_field("X_kv", data["X_kv"])
        expect_shape("X_kv", X_kv, (len(kv_tokens), d_model))
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
    required, allowed = head_keys(version, shared)
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
    W_O = matrix_field("W_O", data["W_O"])
    expect_shape("W_O", W_O, (len(heads) * d_k, d_model))
    if "b_O" in data:
        extra["b_O"] = _vector("b_O", data["b_O"], d_model)
    settings, settings_value = document_settings(data, version)
    if settings.mask == "custom":
        mask = matrix_field("settings.mask_matrix", settings_value["mask_matrix"])
        expect_shape("settings.mask_matrix", mask, (n, m))
        extra["mask_matrix"] = mask
    if settings.loss_target == "custom":
        target = matrix_field("settings.target", settings_value["target"])
        expect_shape("settings.target", target, (n, d_model))
        extra["target"] = target
    if settings.positional == "relative-bias":
        table = matrix_field("settings.relative_bias", settings_value["relative_bias"])
        expect_shape("settings.relative_bias", table, (settings.relative_buckets, len(heads)))
        extra["relative_bias"] = table
    if "provenance" in data:
        extra["provenance"] = provenance_from_json(data["provenance"])
    try:
        return from_heads(tokens, X, heads, W_O, settings, kv_heads, **extra)
    except ScenarioError as e:
        raise FileFormatError(str(e)) from None


# Text -> document: bounded parsing ------------------------------------------------------


def parse_constant(name: str) -> float:
    """NaN and ±Infinity parse as floats, so that the matrix check names their cell."""
    return float(name)


def no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """object_pairs_hook: an object, refused when a key appears twice."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise FileFormatError(f"{key_text(key)}: appears twice")
        out[key] = value
    return out


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
    labels = 2 * lim.tokens * lim.token_chars + provenance_chars()
    return rows + matrices + vectors + others + provenance + labels


def _most_quotes() -> int:
    """The most quotation marks a scenario within LIMITS holds (a label may hold \")."""
    lim = LIMITS
    keys = len(TOP_KEYS) + len(SETTINGS_KEYS) + 2 * len(HEAD_KEYS) * lim.heads
    strings = 1 + keys + 6 + 2 * lim.tokens  # the format, string settings and labels
    provenance = len(PROVENANCE_KEYS) + len(PROVENANCE_TEXTS) + 2 * PROVENANCE_FILES
    labels = 2 * lim.tokens * lim.token_chars + provenance_chars()
    return 2 * (strings + provenance) + labels


def _count(text: str | bytes, chars: str) -> int:
    """How many of chars text holds, counted by C loops (no copy)."""
    if isinstance(text, bytes):
        return sum(text.count(c.encode()) for c in chars)
    return sum(text.count(c) for c in chars)


def check_counts(text: str | bytes) -> None:
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
        return no_duplicates(pairs)

    def where(self, pos: int) -> int:
        """The file position of position pos of the new text (outside placeholders)."""
        i = bisect.bisect_right(self._moves, (pos, math.inf)) - 1
        return pos if i < 0 else self._moves[i][1] + pos - self._moves[i][0]


def _line(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def _numbers_row(row: str) -> np.ndarray | None:
    """A JSON list of numbers as float64, or None if it holds anything else."""
    try:
        values = json.loads(row, parse_constant=parse_constant)
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
    check_counts(text)
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8-sig")  # a byte order mark is allowed, as in CSV
        except UnicodeDecodeError as e:
            raise FileFormatError(f"not UTF-8 text (byte {e.start + 1})") from None
    text = text.removeprefix("\ufeff")
    rows = _Rows(text)
    try:
        data = json.loads(rows.text, parse_constant=parse_constant, object_pairs_hook=rows.hook)
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
