"""Scenario files (.attn.json) and matrix files (CSV, .npy): round trips, bad files, fuzzing.

Every expected value is built here from the brief's numbers or from arrays the test makes
itself; the code under test only ever produces the value being checked.
"""

from __future__ import annotations

import contextlib
import copy
import errno
import io
import json
import os
import pathlib
import re
import stat
import struct
import tempfile
import tracemalloc
from collections.abc import Callable
from typing import Any

try:
    import resource
    import signal
except ImportError:  # pragma: no cover - not POSIX
    resource = signal = None  # type: ignore[assignment]

import numpy as np
import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from attnviz.core.io import checks, json_files
from attnviz.core.io import files as F
from attnviz.core.io.files import (
    FileFormatError,
    load_matrix,
    load_scenario,
    save_matrix,
    save_scenario,
    scenario_from_dict,
    scenario_from_json,
    scenario_to_dict,
    scenario_to_json,
)
from attnviz.core.maths.scenario import LIMITS, MASKS, POSITIONALS, Scenario, Settings
from attnviz.core.presets import worked_example

FUZZ = settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
ROUND_TRIP = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# The brief's worked example, typed in from ATTENTION_LAB.md ---------------------------

TOKENS = ["she", "saw", "the", "cat"]
X = [
    [0.90, 0.10, -0.30, 0.20],
    [0.20, 0.80, 0.40, -0.50],
    [-0.40, 0.10, 0.90, 0.30],
    [0.30, -0.60, 0.20, 0.80],
]
HEADS = [
    {
        "W_Q": [[0.1, 0.3], [0.7, -0.9], [0.3, -0.7], [-0.9, 0.7]],
        "W_K": [[0.9, -0.9], [0.6, -0.3], [-0.9, 0.7], [0.2, -0.4]],
        "W_V": [[0.5, -0.2], [0.1, 0.6], [-0.3, 0.4], [0.7, 0.1]],
    },
    {
        "W_Q": [[-0.6, -0.2], [-0.2, -0.8], [0.8, 0.6], [0.9, 0.8]],
        "W_K": [[0.9, -0.7], [0.8, 0.3], [0.4, 0.0], [-0.9, -0.9]],
        "W_V": [[0.2, 0.4], [-0.5, 0.3], [0.6, -0.1], [0.1, -0.6]],
    },
]
W_O = [
    [0.5, -0.1, 0.3, 0.2],
    [0.1, 0.6, -0.2, 0.4],
    [-0.3, 0.2, 0.5, 0.1],
    [0.2, 0.3, 0.1, -0.4],
]
TOP_KEYS = {"format", "version", "tokens", "X", "heads", "W_O", "settings"}
SETTING_KEYS = {"projections", "scale", "mask", "positional", "dropout", "dropout_seed", "ablated"}


def worked_doc() -> dict[str, Any]:
    """A fresh, valid .attn.json document for the worked example, built by hand."""
    return {
        "format": "attnviz-scenario",
        "version": 1,
        "tokens": list(TOKENS),
        "X": copy.deepcopy(X),
        "heads": copy.deepcopy(HEADS),
        "W_O": copy.deepcopy(W_O),
        "settings": {
            "projections": True,
            "scale": True,
            "mask": "causal",
            "positional": "none",
            "dropout": 0.0,
            "dropout_seed": 0,
            "ablated": [],
        },
    }


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal shape, float64, and identical bytes (so -0.0 and subnormals count)."""
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype == np.float64 and a.shape == b.shape and a.tobytes() == b.tobytes()


def float_bits(x: float) -> bytes:
    return struct.pack("<d", x)


def has_location(message: str, *alternatives: str) -> bool:
    """message names one of the locations, not as part of a longer name (W_X is not X)."""
    return any(
        re.search(r"(?<![\w.\[])" + re.escape(loc) + r"(?!\w)", message) for loc in alternatives
    )


def row_lines(text: str) -> list[list[float]]:
    """Every line of text that is, on its own, one JSON list of numbers (a matrix row)."""
    rows = []
    for line in text.splitlines():
        try:
            value = json.loads(line.strip().rstrip(","))
        except ValueError:
            continue
        if isinstance(value, list) and value and all(type(v) in (int, float) for v in value):
            rows.append(value)
    return rows


# Round trips --------------------------------------------------------------------------


def test_worked_example_preset_matches_the_brief():
    s = worked_example()
    assert s.tokens == tuple(TOKENS)
    assert same_bits(s.X, np.array(X))
    for name in ("W_Q", "W_K", "W_V"):
        assert same_bits(getattr(s, name), np.array([head[name] for head in HEADS]))
    assert same_bits(s.W_O, np.array(W_O))


def test_worked_example_dict_is_the_documented_layout():
    assert scenario_to_dict(worked_example()) == worked_doc()


def test_worked_example_round_trips_through_a_file(tmp_path):
    path = tmp_path / "worked.attn.json"
    save_scenario(path, worked_example())
    text = path.read_text(encoding="utf-8")

    doc = json.loads(text)
    assert set(doc) == TOP_KEYS
    assert doc["format"] == "attnviz-scenario"
    assert doc["version"] == 1 and type(doc["version"]) is int
    assert doc == worked_doc()

    loaded = load_scenario(path)
    assert loaded.tokens == tuple(TOKENS)
    assert same_bits(loaded.X, np.array(X))
    for name in ("W_Q", "W_K", "W_V"):
        assert same_bits(getattr(loaded, name), np.array([head[name] for head in HEADS]))
    assert same_bits(loaded.W_O, np.array(W_O))
    assert (loaded.settings.projections, loaded.settings.scale) == (True, True)
    assert loaded.settings.mask == "causal"

    # Human-readable: one matrix row per line, in document order.
    expected_rows = X + [row for head in HEADS for n in ("W_Q", "W_K", "W_V") for row in head[n]]
    assert row_lines(text) == expected_rows + W_O


def test_hand_written_document_loads():
    doc = worked_doc()
    doc["X"][0] = [1, 0, -1, 2]  # JSON integers are numbers too
    doc["tokens"][1] = "säß 🐈"
    s = scenario_from_json(json.dumps(doc, ensure_ascii=False).encode("utf-8"))
    assert s.tokens == ("she", "säß 🐈", "the", "cat")
    assert same_bits(s.X, np.array([[1.0, 0.0, -1.0, 2.0], *X[1:]]))
    assert same_bits(s.W_O, np.array(W_O))


def test_hand_written_document_with_default_settings_loads():
    doc = worked_doc()
    doc["settings"] = {"mask": "none", "dropout": 0}
    s = scenario_from_dict(doc)
    assert s.settings.mask == "none"
    assert s.settings.dropout == 0.0 and type(s.settings.dropout) is float
    assert doc["settings"] == {"mask": "none", "dropout": 0}  # the input is not modified


finite = st.floats(
    min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False, allow_subnormal=True
)
special = st.sampled_from(
    [0.0, -0.0, 5e-324, -5e-324, 2.2250738585072014e-308, 1e-300, 1e6, -1e6, 0.1, 1 / 3]
)
values = st.one_of(finite, special)
# Any printable text: control characters, surrogates and non-characters (in Cn) are refused.
tokens_text = st.text(
    st.characters(exclude_categories=("Cc", "Cs", "Cn")), max_size=LIMITS.token_chars
)


@st.composite
def scenario_parts(draw):
    n = draw(st.integers(1, 6))
    d_model = draw(st.integers(1, 6))
    h = draw(st.integers(1, 3))
    d_k = draw(st.integers(1, 4))

    def mat(*shape: int) -> np.ndarray:
        return draw(hnp.arrays(np.float64, shape, elements=values))

    parts = {
        "tokens": tuple(draw(st.lists(tokens_text, min_size=n, max_size=n))),
        "X": mat(n, d_model),
        "W_Q": mat(h, d_model, d_k),
        "W_K": mat(h, d_model, d_k),
        "W_V": mat(h, d_model, d_k),
        "W_O": mat(h * d_k, d_model),
        "settings": Settings(
            projections=draw(st.booleans()),
            scale=draw(st.booleans()),
            mask=draw(st.sampled_from(MASKS)),
            positional=draw(st.sampled_from(POSITIONALS)),
            dropout=draw(st.floats(0.0, 1.0, exclude_max=True) | st.sampled_from([0.0, 5e-324])),
            dropout_seed=draw(st.integers(0, 2**32 - 1)),
            ablated=tuple(sorted(draw(st.sets(st.integers(0, h - 1))))),
            window=draw(st.integers(1, LIMITS.tokens)),
        ),
    }
    return parts


@ROUND_TRIP
@given(parts=scenario_parts())
def test_random_scenarios_round_trip_bit_for_bit(parts):
    s = Scenario(**parts)
    with tempfile.TemporaryDirectory() as folder:
        path = pathlib.Path(folder) / "s.attn.json"
        save_scenario(path, s)
        text = path.read_text(encoding="utf-8")
        loaded = load_scenario(path)
        assert os.listdir(folder) == ["s.attn.json"]

    assert loaded.tokens == parts["tokens"]
    for name in ("X", "W_Q", "W_K", "W_V", "W_O"):
        assert same_bits(getattr(loaded, name), parts[name]), name
    want, got = parts["settings"], loaded.settings
    for key in ("projections", "scale", "mask", "positional", "dropout_seed", "ablated"):
        assert getattr(got, key) == getattr(want, key) and type(getattr(got, key)) is type(
            getattr(want, key)
        )
    assert type(got.dropout) is float and float_bits(got.dropout) == float_bits(want.dropout)
    # The window is saved (as version 2) only when a sliding window uses it; a custom
    # mask and RoPE or ALiBi also need version 2.
    sliding, custom = want.mask == "sliding-window", want.mask == "custom"
    assert got.window == (want.window if sliding else 4)
    v2 = sliding or custom or want.positional in ("rope", "alibi")

    doc = json.loads(text)
    assert set(doc) == TOP_KEYS
    relative = want.positional == "relative-bias"  # T5's bias and its table: version 6
    assert (doc["format"], doc["version"]) == (
        "attnviz-scenario",
        6 if relative else 2 if v2 else 1,
    )
    assert doc["tokens"] == list(parts["tokens"])
    more = {"window"} if sliding else {"mask_matrix"} if custom else set()
    if relative:
        more |= {"relative_buckets", "relative_max_distance", "relative_bidirectional"}
        more |= {"relative_bias"}
    assert set(doc["settings"]) == SETTING_KEYS | more
    h = parts["W_Q"].shape[0]
    expected_rows = parts["X"].tolist()
    for head in range(h):
        for name in ("W_Q", "W_K", "W_V"):
            expected_rows += parts[name][head].tolist()
    expected_rows += parts["W_O"].tolist()
    if custom:  # causal by default: ones on and below the diagonal
        n = len(parts["tokens"])
        expected_rows += [[1.0 * (j <= i) for j in range(n)] for i in range(n)]
    if relative:  # a zero table (buckets × heads) when none is given
        expected_rows += [[0.0] * h for _ in range(want.relative_buckets)]
    assert row_lines(text) == expected_rows


# Bad scenario files -------------------------------------------------------------------


def _set(path: tuple, value: Any) -> Callable[[dict], None]:
    def change(doc: dict) -> None:
        target = doc
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return change


def _delete(*path: Any) -> Callable[[dict], None]:
    def change(doc: dict) -> None:
        target = doc
        for key in path[:-1]:
            target = target[key]
        del target[path[-1]]

    return change


def _widen(head: int, name: str) -> Callable[[dict], None]:
    def change(doc: dict) -> None:
        for row in doc["heads"][head][name]:
            row.append(0.25)

    return change


def _add_row(*path: Any) -> Callable[[dict], None]:
    def change(doc: dict) -> None:
        target = doc
        for key in path:
            target = target[key]
        target.append([0.5] * len(target[0]))

    return change


def _sized(n: int = 1, d_model: int = 1, heads: int = 1, d_k: int = 1) -> Callable[[dict], None]:
    """Replace the document by a zero-filled one of the given sizes."""

    def change(doc: dict) -> None:
        doc["tokens"] = [f"t{i}" for i in range(n)]
        doc["X"] = [[0.0] * d_model for _ in range(n)]
        doc["heads"] = [
            {name: [[0.0] * d_k for _ in range(d_model)] for name in ("W_Q", "W_K", "W_V")}
            for _ in range(heads)
        ]
        doc["W_O"] = [[0.0] * d_model for _ in range(heads * d_k)]

    return change


BAD_DOCS = [
    # Shapes.
    ("head-1-W_K-4x3", _widen(0, "W_K"), ["heads[1].W_K"], "expected 4×2, got 4×3"),
    ("head-2-W_K-4x3", _widen(1, "W_K"), ["heads[2].W_K"], "expected 4×2, got 4×3"),
    ("head-2-W_V-5x2", _add_row("heads", 1, "W_V"), ["heads[2].W_V"], "expected 4×2, got 5×2"),
    ("head-2-W_Q-3x2", _delete("heads", 1, "W_Q", 3), ["heads[2].W_Q"], "expected 4×2, got 3×2"),
    ("X-ragged", _set(("X", 2), [-0.4, 0.1, 0.9]), ["X"], "row 3"),
    ("X-rows-vs-tokens", _delete("X", 3), ["X"], "expected 4×4, got 3×4"),
    ("X-row-not-list", _set(("X", 1), 5), ["X[2]"], None),
    ("X-empty", _set(("X",), []), ["X"], None),
    ("X-empty-rows", _set(("X",), [[], [], [], []]), ["X"], None),
    ("X-not-list", _set(("X",), {"a": 1}), ["X"], None),
    ("W_O-4x3", _set(("W_O",), [r[:3] for r in W_O]), ["W_O"], "expected 4×4, got 4×3"),
    ("W_O-2x4", _set(("W_O",), W_O[:2]), ["W_O"], "expected 4×4, got 2×4"),
    ("W_O-ragged", _set(("W_O", 3), [0.2]), ["W_O"], "row 4"),
    # Cells that are not finite numbers in range.
    ("true-in-X", _set(("X", 1, 2), True), ["X[2][3]", "X[2,3]"], None),
    ("false-in-W_O", _set(("W_O", 0, 0), False), ["W_O[1][1]", "W_O[1,1]"], None),
    ("string-in-W_V", _set(("heads", 1, "W_V", 0, 1), "0.5"), ["heads[2].W_V[1,2]"], None),
    ("null-in-W_O", _set(("W_O", 3, 0), None), ["W_O[4][1]", "W_O[4,1]"], None),
    ("list-in-X", _set(("X", 0, 0), [1.0]), ["X[1][1]", "X[1,1]"], None),
    ("object-in-W_Q", _set(("heads", 0, "W_Q", 2, 1), {}), ["heads[1].W_Q[3,2]"], None),
    ("over-1e6-in-X", _set(("X", 3, 3), 1e6 * 1.5), ["X[4][4]", "X[4,4]"], None),
    (
        "over-1e6-in-W_K",
        _set(("heads", 1, "W_K", 2, 0), -2e6),
        ["heads[2].W_K[3][1]", "heads[2].W_K[3,1]"],
        None,
    ),
    ("huge-int-in-X", _set(("X", 0, 1), 10**400), ["X", "X[1][2]", "X[1,2]"], None),
    ("big-int-in-W_O", _set(("W_O", 1, 1), 10**30), ["W_O[2][2]", "W_O[2,2]"], None),
    # Settings.
    ("settings-foo", _set(("settings", "foo"), 1), ["settings.foo"], None),
    ("settings-mask", _set(("settings", "mask"), "sideways"), ["settings.mask"], None),
    ("settings-mask-list", _set(("settings", "mask"), ["causal"]), ["settings.mask"], None),
    ("settings-positional", _set(("settings", "positional"), 3), ["settings.positional"], None),
    ("settings-dropout-1", _set(("settings", "dropout"), 1.0), ["settings.dropout"], None),
    ("settings-dropout-neg", _set(("settings", "dropout"), -0.5), ["settings.dropout"], None),
    ("settings-dropout-str", _set(("settings", "dropout"), "0.1"), ["settings.dropout"], None),
    ("settings-dropout-bool", _set(("settings", "dropout"), False), ["settings.dropout"], None),
    ("settings-dropout-huge", _set(("settings", "dropout"), 10.0**300), ["settings.dropout"], None),
    ("settings-seed-neg", _set(("settings", "dropout_seed"), -1), ["settings.dropout_seed"], None),
    (
        "settings-seed-big",
        _set(("settings", "dropout_seed"), 2**32),
        ["settings.dropout_seed"],
        None,
    ),
    (
        "settings-seed-float",
        _set(("settings", "dropout_seed"), 1.5),
        ["settings.dropout_seed"],
        None,
    ),
    ("settings-projections", _set(("settings", "projections"), 1), ["settings.projections"], None),
    ("settings-scale", _set(("settings", "scale"), "yes"), ["settings.scale"], None),
    ("settings-list", _set(("settings",), []), ["settings"], None),
    ("settings-null", _set(("settings",), None), ["settings"], None),
    # Format and version.
    ("version-7", _set(("version",), 7), ["version"], None),
    ("version-0", _set(("version",), 0), ["version"], None),
    ("version-str", _set(("version",), "1"), ["version"], None),
    ("version-float", _set(("version",), 1.0), ["version"], None),
    ("version-true", _set(("version",), True), ["version"], None),
    ("version-missing", _delete("version"), ["version"], None),
    ("format-other", _set(("format",), "attnviz"), ["format"], None),
    ("format-missing", _delete("format"), ["format"], None),
    # Missing and unknown keys.
    ("tokens-missing", _delete("tokens"), ["tokens"], None),
    ("X-missing", _delete("X"), ["X"], None),
    ("heads-missing", _delete("heads"), ["heads"], None),
    ("W_O-missing", _delete("W_O"), ["W_O"], None),
    ("unknown-top-key", _set(("extra",), 1), ["extra"], None),
    ("head-missing-W_V", _delete("heads", 0, "W_V"), ["heads[1].W_V", "heads[1]"], None),
    ("head-unknown-key", _set(("heads", 1, "W_X"), [[1.0]]), ["heads[2].W_X", "heads[2]"], None),
    ("head-not-object", _set(("heads", 0), [[1.0]]), ["heads[1]"], None),
    ("heads-empty", _set(("heads",), []), ["heads"], None),
    ("heads-object", _set(("heads",), {"W_Q": []}), ["heads"], None),
    # Tokens.
    ("tokens-empty", _set(("tokens",), []), ["tokens"], None),
    ("tokens-string", _set(("tokens",), "she saw the cat"), ["tokens"], None),
    ("token-number", _set(("tokens", 2), 7), ["tokens[3]"], None),
    ("token-null", _set(("tokens", 0), None), ["tokens[1]"], None),
    ("token-too-long", _set(("tokens", 0), "x" * (LIMITS.token_chars + 1)), ["tokens[1]"], None),
    ("tokens-vs-X-rows", _set(("tokens",), [*TOKENS, "extra"]), ["X", "tokens"], None),
    # Sizes over the documented limits.
    (
        "too-many-tokens",
        _sized(n=LIMITS.tokens + 1),
        ["tokens"],
        str(LIMITS.tokens),
    ),
    ("too-many-heads", _sized(heads=LIMITS.heads + 1), ["heads"], str(LIMITS.heads)),
    ("d_model-over", _sized(d_model=LIMITS.d_model + 1), ["d_model", "X"], None),
    ("d_k-over", _sized(d_k=LIMITS.d_k + 1), ["d_k"], None),
    (
        "score-cells-over",
        _sized(heads=LIMITS.heads, n=int((LIMITS.score_cells / LIMITS.heads) ** 0.5) + 1),
        ["size", "heads", "tokens"],
        None,
    ),
    # The top level itself.
    ("top-level-list", lambda doc: [doc], [], None),
    ("top-level-string", lambda doc: "attnviz-scenario", [], None),
]


def _bad_text(change: Callable[[dict], Any]) -> str:
    """The worked example changed in one way; a change may return a whole new document."""
    doc = worked_doc()
    replacement = change(doc)
    return json.dumps(doc if replacement is None else replacement, indent=1, ensure_ascii=False)


def test_the_unmodified_document_is_valid():
    """Each bad case below differs from this valid document only by its change."""
    s = scenario_from_json(json.dumps(worked_doc(), indent=1))
    assert s.tokens == tuple(TOKENS)
    for n, limit in ((LIMITS.tokens, "tokens"), (LIMITS.heads, "heads")):
        sizes = {"n": n} if limit == "tokens" else {"heads": n}
        doc = worked_doc()
        _sized(**sizes)(doc)
        assert isinstance(scenario_from_dict(doc), Scenario)  # exactly at the limit is fine


@pytest.mark.parametrize(
    ("change", "locations", "problem"),
    [pytest.param(c, loc, p, id=i) for i, c, loc, p in BAD_DOCS],
)
def test_bad_document_names_problem_and_place(tmp_path, change, locations, problem):
    text = _bad_text(change)
    path = tmp_path / "bad.attn.json"
    path.write_text(text, encoding="utf-8")
    before = path.read_bytes()

    with pytest.raises(FileFormatError) as direct:
        scenario_from_json(text)
    with pytest.raises(FileFormatError) as from_file:
        load_scenario(path)

    assert path.read_bytes() == before
    assert "bad.attn.json" in str(from_file.value)
    for message in (str(direct.value), str(from_file.value)):
        assert message.strip()
        if locations:
            assert has_location(message, *locations), message
        if problem:
            assert problem in message, message


def test_bad_document_dict_is_left_unmodified():
    doc = worked_doc()
    doc["settings"]["mask"] = "sideways"
    doc["settings"]["dropout"] = 0
    snapshot = copy.deepcopy(doc)
    with pytest.raises(FileFormatError):
        scenario_from_dict(doc)
    assert doc == snapshot


def _with_literal(literal: str) -> str:
    """The worked example with X[2][3] replaced by a raw JSON literal."""
    doc = worked_doc()
    doc["X"][1][2] = 0.123456789
    text = json.dumps(doc, indent=1)
    assert text.count("0.123456789") == 1
    return text.replace("0.123456789", literal)


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_literals_are_rejected(literal):
    with pytest.raises(FileFormatError) as e:
        scenario_from_json(_with_literal(literal))
    assert "not a finite number" in str(e.value)


@pytest.mark.parametrize("literal", ["NaN", "-Infinity"])
def test_non_finite_literals_name_the_cell(literal):
    with pytest.raises(FileFormatError) as e:
        scenario_from_json(_with_literal(literal))
    message = str(e.value)
    assert has_location(message, "X[2][3]", "X[2,3]") or re.search(r"line \d+", message)


def test_overflowing_float_literal_names_the_cell():
    with pytest.raises(FileFormatError) as e:
        scenario_from_json(_with_literal("1e400"))
    assert has_location(str(e.value), "X[2][3]", "X[2,3]")


def _duplicate(key_text: str, where: str) -> str:
    """The worked example's JSON with key_text inserted again right after where."""
    text = json.dumps(worked_doc())
    assert text.count(where) == 1
    return text.replace(where, where + key_text, 1)


@pytest.mark.parametrize(
    ("text", "key"),
    [
        (_duplicate(' "X": [[1.0]],', '"version": 1,'), "X"),
        (_duplicate(' "mask": "none",', '"settings": {'), "mask"),
        (_duplicate(' "W_Q": [[1.0, 2.0]],', '"heads": [{'), "W_Q"),
    ],
    ids=["top", "settings", "head"],
)
def test_duplicate_keys_are_rejected(text, key):
    json.loads(text)  # plain JSON tolerates it: the loader must not
    with pytest.raises(FileFormatError) as e:
        scenario_from_json(text)
    assert has_location(str(e.value), key)
    assert re.search(r"twice|duplicate|more than once", str(e.value))


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"   ",
        b"hello",
        b"{",
        b"null",
        b"1",
        b'"attnviz-scenario"',
        b"[" * 100_000,
        b"[" * 100_000 + b"]" * 100_000,
        b'{"a":' * 100_000,
        b'{"a":' * 100_000 + b"1" + b"}" * 100_000,
        json.dumps(worked_doc()).encode()[:-1],
        json.dumps(worked_doc()).encode("utf-16"),
        json.dumps(worked_doc()).encode().replace(b'"she"', b'"sh\xff"'),
        json.dumps(worked_doc()).encode().replace(b'"she"', b'"\xc3"'),
    ],
    ids=[
        "empty",
        "blank",
        "word",
        "open-brace",
        "null",
        "number",
        "string",
        "deep-open-lists",
        "deep-closed-lists",
        "deep-open-objects",
        "deep-closed-objects",
        "truncated",
        "utf-16",
        "bad-utf8",
        "cut-utf8",
    ],
)
def test_unreadable_text_is_rejected(tmp_path, data):
    with pytest.raises(FileFormatError):
        scenario_from_json(data)
    path = tmp_path / "x.attn.json"
    path.write_bytes(data)
    with pytest.raises(FileFormatError) as e:
        load_scenario(path)
    assert "x.attn.json" in str(e.value)


def test_non_utf8_message_says_so():
    data = json.dumps(worked_doc()).encode().replace(b'"she"', b'"sh\xff"')
    with pytest.raises(FileFormatError) as e:
        scenario_from_json(data)
    assert "UTF-8" in str(e.value)


def test_deep_nesting_inside_a_matrix_is_rejected():
    doc = worked_doc()
    text = json.dumps(doc).replace("0.9", "[" * 500 + "0.9" + "]" * 500, 1)
    with pytest.raises(FileFormatError) as e:
        scenario_from_json(text)
    assert has_location(str(e.value), "X[1][1]", "X[1,1]", "X")


def test_missing_file_and_folder_are_file_format_errors(tmp_path):
    with pytest.raises(FileFormatError) as e:
        load_scenario(tmp_path / "nope.attn.json")
    assert "nope.attn.json" in str(e.value)
    with pytest.raises(FileFormatError):
        load_scenario(tmp_path)
    with pytest.raises(FileFormatError) as e:
        load_matrix(tmp_path / "nope.csv")
    assert "nope.csv" in str(e.value)
    with pytest.raises(FileFormatError):
        load_matrix(tmp_path / "nope.npy")


def test_file_over_the_size_limit_is_rejected_unread(tmp_path):
    path = tmp_path / "huge.attn.json"
    with open(path, "wb") as f:
        f.truncate(256 * 2**20 + 1)  # sparse: costs no disk and, unread, no memory
    tracemalloc.start()
    try:
        with pytest.raises(FileFormatError) as e:
            load_scenario(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "huge.attn.json" in str(e.value)
    assert peak < 16 * 2**20


def test_text_over_the_size_limit_is_rejected(monkeypatch):
    text = json.dumps(worked_doc())
    monkeypatch.setattr(json_files, "MAX_FILE_BYTES", len(text) - 1)
    with pytest.raises(FileFormatError):
        scenario_from_json(text)
    with pytest.raises(FileFormatError):
        scenario_from_json(text.encode())


def test_matrix_over_the_cell_limit_is_rejected(monkeypatch):
    monkeypatch.setattr(checks, "MAX_MATRIX_CELLS", 15)  # X is 4×4 = 16 cells
    with pytest.raises(FileFormatError) as e:
        scenario_from_json(json.dumps(worked_doc()))
    assert has_location(str(e.value), "X")


def _huge_dropout_document() -> str:
    doc = worked_doc()
    doc["settings"]["dropout"] = 10**400
    return json.dumps(doc)


def test_huge_integer_dropout_is_a_file_format_error():
    with pytest.raises(FileFormatError) as e:
        scenario_from_json(_huge_dropout_document())
    assert has_location(str(e.value), "settings.dropout")


def test_anything_that_loads_can_be_saved_and_reloaded(tmp_path):
    text = json.dumps(worked_doc()).replace('"she"', '"s\\ud800"')
    try:
        s = scenario_from_json(text)
    except FileFormatError:
        return  # rejecting such a token is a fine answer
    path = tmp_path / "s.attn.json"
    save_scenario(path, s)
    assert load_scenario(path).tokens == s.tokens


# Atomic writes ------------------------------------------------------------------------


def _old_file(tmp_path: pathlib.Path, name: str) -> tuple[pathlib.Path, bytes]:
    path = tmp_path / name
    old = b"the previous contents\n"
    path.write_bytes(old)
    return path, old


def _failing(exc: BaseException) -> Callable[..., None]:
    def fail(*args: object, **kwargs: object) -> None:
        raise exc

    return fail


@pytest.mark.parametrize("name", ["s.attn.json", "m.csv", "m.npy"])
@pytest.mark.parametrize("stage", ["fsync", "replace"])
@pytest.mark.parametrize("existing", [True, False], ids=["over-old", "new"])
def test_failed_write_leaves_old_file_and_no_temp(tmp_path, monkeypatch, name, stage, existing):
    if existing:
        path, old = _old_file(tmp_path, name)
    else:
        path, old = tmp_path / name, None
    monkeypatch.setattr(F.os, stage, _failing(OSError(errno.ENOSPC, "No space left")))
    with pytest.raises(OSError):
        if name.endswith(".attn.json"):
            save_scenario(path, worked_example())
        else:
            save_matrix(path, np.array(X))
    monkeypatch.undo()
    if existing:
        assert path.read_bytes() == old
        assert os.listdir(tmp_path) == [name]
    else:
        assert os.listdir(tmp_path) == []


def _big_scenario() -> Scenario:
    rng = np.random.default_rng(7)
    n, d_model, h, d_k = 40, 40, 2, 8
    return Scenario(
        tokens=tuple(f"t{i}" for i in range(n)),
        X=rng.standard_normal((n, d_model)),
        W_Q=rng.standard_normal((h, d_model, d_k)),
        W_K=rng.standard_normal((h, d_model, d_k)),
        W_V=rng.standard_normal((h, d_model, d_k)),
        W_O=rng.standard_normal((h * d_k, d_model)),
    )


def _save(path: pathlib.Path) -> None:
    """Save something much larger than 4 KiB to path, by its suffix."""
    if path.name.endswith(".attn.json"):
        save_scenario(path, _big_scenario())
    else:
        save_matrix(path, np.random.default_rng(3).standard_normal((60, 60)))


@pytest.mark.skipif(resource is None or signal is None, reason="needs POSIX file-size limits")
@pytest.mark.parametrize("name", ["s.attn.json", "m.csv", "m.npy"])
def test_disk_filling_up_midway_leaves_old_file_and_no_temp(tmp_path, name):
    """A real partial write: the kernel refuses every byte past 4 KiB (EFBIG)."""
    path, old = _old_file(tmp_path, name)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    if hard != resource.RLIM_INFINITY and hard < 4096:
        pytest.skip("file-size hard limit too low")
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, hard))
    try:
        with pytest.raises(OSError):
            _save(path)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)
    assert path.read_bytes() == old
    assert os.listdir(tmp_path) == [name]
    _save(path)  # and with room, the same save works
    assert os.listdir(tmp_path) == [name]
    assert path.stat().st_size > 4096


@pytest.mark.parametrize("name", ["s.attn.json", "m.npy"])
def test_interrupt_during_write_leaves_old_file_and_no_temp(tmp_path, monkeypatch, name):
    path, old = _old_file(tmp_path, name)
    monkeypatch.setattr(F.os, "fsync", _failing(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        _save(path)
    monkeypatch.undo()
    assert path.read_bytes() == old
    assert os.listdir(tmp_path) == [name]


def test_failing_npy_encoder_leaves_old_file(tmp_path, monkeypatch):
    path, old = _old_file(tmp_path, "m.npy")

    def partial_save(f, *args, **kwargs):
        f.write(b"\x93NUMPY\x01\x00")
        raise OSError(errno.EIO, "I/O error")

    monkeypatch.setattr(np, "save", partial_save)
    with pytest.raises(OSError):
        save_matrix(path, np.array(X))
    monkeypatch.undo()
    assert path.read_bytes() == old
    assert os.listdir(tmp_path) == ["m.npy"]


def test_failing_json_text_leaves_old_file(tmp_path, monkeypatch):
    path, old = _old_file(tmp_path, "s.attn.json")
    monkeypatch.setattr(F, "scenario_to_json", _failing(RuntimeError("boom")))
    with pytest.raises(RuntimeError):
        save_scenario(path, worked_example())
    assert path.read_bytes() == old
    assert os.listdir(tmp_path) == ["s.attn.json"]


def test_save_writes_a_temp_file_in_the_folder_then_renames(tmp_path, monkeypatch):
    path, _ = _old_file(tmp_path, "s.attn.json")
    seen = []
    real_replace = os.replace

    def spy(src, dst):
        seen.append((os.fspath(src), os.fspath(dst), pathlib.Path(src).read_bytes()))
        assert path.read_bytes() == b"the previous contents\n"  # untouched until the rename
        real_replace(src, dst)

    monkeypatch.setattr(F.os, "replace", spy)
    save_scenario(path, worked_example())
    monkeypatch.undo()

    assert len(seen) == 1
    src, dst, written = seen[0]
    assert os.path.dirname(os.path.abspath(src)) == str(tmp_path)
    assert os.path.abspath(dst) == str(path)
    assert written == path.read_bytes()
    assert json.loads(written) == worked_doc()
    assert os.listdir(tmp_path) == ["s.attn.json"]


def test_saving_keeps_ordinary_file_permissions(tmp_path):
    path, _ = _old_file(tmp_path, "s.attn.json")
    os.chmod(path, 0o644)
    save_scenario(path, worked_example())
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644

    umask = os.umask(0o022)
    try:
        fresh = tmp_path / "fresh.attn.json"
        save_scenario(fresh, worked_example())
    finally:
        os.umask(umask)
    assert stat.S_IMODE(os.stat(fresh).st_mode) == 0o644


# Matrices: CSV and .npy ---------------------------------------------------------------

matrices = st.tuples(st.integers(1, 6), st.integers(1, 6)).flatmap(
    lambda shape: hnp.arrays(np.float64, shape, elements=values)
)


@ROUND_TRIP
@given(a=matrices)
@example(a=np.array([[0.0, -0.0, 5e-324, -5e-324], [1e6, -1e6, 0.1, 1 / 3]]))
def test_matrices_round_trip_exactly(a):
    with tempfile.TemporaryDirectory() as folder:
        csv_path = pathlib.Path(folder) / "m.csv"
        npy_path = pathlib.Path(folder) / "m.npy"
        save_matrix(csv_path, a)
        save_matrix(npy_path, a)
        csv_text = csv_path.read_text(encoding="utf-8")
        npy_data = npy_path.read_bytes()
        from_csv = load_matrix(csv_path)
        from_npy = load_matrix(npy_path)
        assert sorted(os.listdir(folder)) == ["m.csv", "m.npy"]

    assert same_bits(from_csv, a)
    assert same_bits(from_npy, a)

    # The CSV reads back with plain Python, one row per line.
    lines = [line for line in csv_text.splitlines() if line.strip()]
    plain = np.array([[float(c) for c in line.split(",")] for line in lines])
    assert same_bits(plain, a)

    # The .npy is a plain array file numpy reads without pickles.
    assert npy_data.startswith(b"\x93NUMPY")
    assert same_bits(np.load(io.BytesIO(npy_data), allow_pickle=False), a)


def test_csv_import_accepts_common_spellings(tmp_path):
    path = tmp_path / "m.csv"
    path.write_bytes("\ufeff 1, 2.5 \r\n\r\n\u22123e-2,+.5\n\n-0,7.\n".encode())
    expected = np.array([[1.0, 2.5], [-0.03, 0.5], [-0.0, 7.0]])
    assert same_bits(load_matrix(path), expected)


@pytest.mark.parametrize(
    ("text", "line", "column"),
    [
        ("1,2\n3,nan\n", 2, 2),
        ("1,2\n1e999,3\n", 2, 1),
        ("abc\n", 1, 1),
        ("1,2,3\n4,5,-inf\n", 2, 3),
        ("1,,2\n", 1, 2),
        ("1,2,\n", 1, 3),
        ("0x10\n", 1, 1),
        ("1_000\n", 1, 1),
        ("True\n", 1, 1),
        ("1,2\n\n3,1e7\n", 3, 2),
        ('"1",2\n', 1, 1),
    ],
)
def test_csv_bad_cell_names_line_and_column(tmp_path, text, line, column):
    path = tmp_path / "m.csv"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(FileFormatError) as e:
        load_matrix(path)
    message = str(e.value)
    assert "m.csv" in message
    assert re.search(rf"\bline {line}\b", message), message
    assert re.search(rf"\bcolumn {column}\b", message), message


@pytest.mark.parametrize(
    ("text", "line"), [("1,2,3\n4,5\n", 2), ("1\n2\n3,4\n", 3), ("1,2\n\n3\n", 3)]
)
def test_csv_ragged_rows_name_the_line(tmp_path, text, line):
    path = tmp_path / "m.csv"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(FileFormatError) as e:
        load_matrix(path)
    assert re.search(rf"\bline {line}\b", str(e.value)), str(e.value)


@pytest.mark.parametrize("data", [b"", b"\n\n  \n", b"\xff\xfe1,2\n", b"1,2\n\xc3\n"])
def test_csv_empty_or_not_text_is_rejected(tmp_path, data):
    path = tmp_path / "m.csv"
    path.write_bytes(data)
    with pytest.raises(FileFormatError):
        load_matrix(path)


def test_csv_over_the_cell_limit_is_rejected(tmp_path, monkeypatch):
    path = tmp_path / "m.csv"
    path.write_text("1,2,3\n4,5,6\n7,8,9\n", encoding="utf-8")
    monkeypatch.setattr(F, "MAX_MATRIX_CELLS", 8)
    with pytest.raises(FileFormatError):
        load_matrix(path)


def test_matrix_file_with_another_suffix_is_rejected(tmp_path):
    path = tmp_path / "m.txt"
    path.write_text("1,2\n", encoding="utf-8")
    with pytest.raises(FileFormatError) as e:
        load_matrix(path)
    assert "m.txt" in str(e.value)


@pytest.mark.parametrize(
    "a",
    [
        np.arange(6, dtype=np.float32).reshape(2, 3) / 7,
        np.arange(-3, 3, dtype=np.int64).reshape(3, 2),
        np.arange(6, dtype=np.uint8).reshape(1, 6),
        np.arange(4, dtype=np.float16).reshape(2, 2),
        np.arange(6, dtype=">f8").reshape(2, 3) / 3,
        np.asfortranarray(np.arange(6, dtype=np.float64).reshape(2, 3) / 3),
    ],
    ids=["float32", "int64", "uint8", "float16", "big-endian", "fortran"],
)
def test_npy_of_other_real_dtypes_loads_as_float64(tmp_path, a):
    path = tmp_path / "m.npy"
    np.save(path, a, allow_pickle=False)
    got = load_matrix(path)
    assert same_bits(got, np.ascontiguousarray(a.astype(np.float64)))


class _Touch:
    """Unpickling this object creates a file: proof that a pickle ran."""

    def __init__(self, marker: pathlib.Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (pathlib.Path.touch, (self.marker,))


def test_npy_with_pickled_objects_is_rejected_and_never_run(tmp_path):
    marker = tmp_path / "pickle-ran"
    a = np.empty((1, 2), dtype=object)
    a[0, 0], a[0, 1] = _Touch(marker), 1.0
    path = tmp_path / "evil.npy"
    np.save(path, a, allow_pickle=True)

    with pytest.raises(FileFormatError) as e:
        load_matrix(path)
    assert "evil.npy" in str(e.value)
    assert not marker.exists()

    np.load(path, allow_pickle=True)  # the trap is real: a pickle-loading reader springs it
    assert marker.exists()


@pytest.mark.parametrize(
    "a",
    [
        np.array([[True, False]]),
        np.array([[1 + 2j, 3.0]]),
        np.array([["1.0", "2.0"]]),
        np.zeros((2, 2), dtype=[("a", "<f8")]),
        np.array([["2020-01-01"]], dtype="datetime64[D]"),
        np.zeros((2, 2, 2)),
        np.zeros(3),
        np.float64(1.0),
        np.array([[np.nan, 1.0]]),
        np.array([[1.0, np.inf]]),
        np.array([[1.0, 2e6]]),
        np.array([[1e300]], dtype=np.longdouble) * np.longdouble(1e300),
    ],
    ids=[
        "bool",
        "complex",
        "strings",
        "structured",
        "datetime",
        "3-D",
        "1-D",
        "0-D",
        "nan",
        "inf",
        "over-1e6",
        "longdouble-beyond-float64",
    ],
)
@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")
def test_npy_that_is_not_a_real_finite_matrix_is_rejected(tmp_path, a):
    path = tmp_path / "m.npy"
    np.save(path, a, allow_pickle=False)
    with pytest.raises(FileFormatError) as e:
        load_matrix(path)
    assert "m.npy" in str(e.value)


def npy_bytes(header: str, body: bytes = b"") -> bytes:
    """A version 1.0 .npy file with a hand-written header dictionary."""
    raw = header.encode("latin1")
    raw += b" " * (63 - (10 + len(raw)) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(raw)) + raw + body


def _peak_memory(load: Callable[[], Any]) -> int:
    """Peak bytes traced while load() runs (FileFormatError expected and swallowed)."""
    tracemalloc.start()
    try:
        with contextlib.suppress(FileFormatError):
            load()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize(
    "shape",
    [
        "(1099511627776, 1099511627776)",  # 2^80 cells
        "(1000000, 1000000)",  # 8 TB
        "(8192, 8192)",  # 512 MiB: allocatable, so only the memory check can catch it
        "(1, 50000000)",  # 400 MB
        "(4097, 4096)",  # one row over the cell limit
        "(1, 16777217)",  # one cell over the cell limit
    ],
)
def test_npy_header_claiming_a_huge_shape_is_rejected_unallocated(tmp_path, shape):
    body = b"\0" * 64
    path = tmp_path / "huge.npy"
    path.write_bytes(
        npy_bytes(f"{{'descr': '<f8', 'fortran_order': False, 'shape': {shape}, }}", body)
    )
    with pytest.raises(FileFormatError):
        load_matrix(path)

    # Compare with an honest file of the same size, so that whatever any load costs cancels.
    honest = tmp_path / "honest.npy"
    honest.write_bytes(
        npy_bytes("{'descr': '<f8', 'fortran_order': False, 'shape': (2, 4), }", body)
    )
    baseline = _peak_memory(lambda: load_matrix(honest))
    assert _peak_memory(lambda: load_matrix(path)) < baseline + 32 * 2**20


@pytest.mark.parametrize("name", ["s.attn.json", "m.csv", "m.npy"])
def test_loading_a_small_file_needs_little_memory(tmp_path, name):
    path = tmp_path / name
    if name.endswith(".attn.json"):
        save_scenario(path, worked_example())
    else:
        save_matrix(path, np.array(X))
    load = load_scenario if name.endswith(".attn.json") else load_matrix
    assert _peak_memory(lambda: load(path)) < 16 * 2**20


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\x93NUMPY",
        b"PK\x03\x04not an npz",
        npy_bytes("{'descr': '<f8', 'fortran_order': False, 'shape': (2, 2), }", b"\0" * 8),
        npy_bytes("{'descr': '<f8', 'fortran_order': False, 'shape': (-1, 2), }", b"\0" * 16),
        npy_bytes("{'descr': '<f8', 'fortran_order': False, 'shape': (1.5, 2), }", b"\0" * 16),
        npy_bytes("{'descr': 'zzz', 'fortran_order': False, 'shape': (1, 1), }", b"\0" * 8),
        npy_bytes("{'descr': '|O', 'fortran_order': False, 'shape': (1, 1), }", b"\0" * 8),
        npy_bytes("__import__('os').system('false')", b"\0" * 8),
        npy_bytes("{'descr': '<f8', 'fortran_order': 'no', 'shape': (1, 1), }", b"\0" * 8),
    ],
    ids=[
        "empty",
        "magic-only",
        "zip",
        "short-data",
        "negative-dim",
        "float-dim",
        "bad-descr",
        "object-descr",
        "code-header",
        "bad-fortran",
    ],
)
def test_broken_npy_is_rejected(tmp_path, data):
    path = tmp_path / "m.npy"
    path.write_bytes(data)
    with pytest.raises(FileFormatError):
        load_matrix(path)


# Known .npy loader bugs: inputs whose exception escapes as something else today.
NPY_UNBALANCED_HEADER = npy_bytes("{'descr': '<f8', 'fortran_order': False, 'shape': (1, 1), ")
NPY_BOOL_DIM = npy_bytes(
    "{'descr': '<f8', 'fortran_order': False, 'shape': (True, 2), }", b"\0" * 16
)
NPY_ZERO_CELLS = npy_bytes("{'descr': '<f8', 'fortran_order': False, 'shape': (3, 0), }")


def test_npy_with_unbalanced_header_is_a_file_format_error(tmp_path):
    path = tmp_path / "m.npy"
    path.write_bytes(NPY_UNBALANCED_HEADER)
    with pytest.raises(FileFormatError):
        load_matrix(path)


def test_npy_with_boolean_dimension_is_a_file_format_error(tmp_path):
    path = tmp_path / "m.npy"
    path.write_bytes(NPY_BOOL_DIM)
    with pytest.raises(FileFormatError):
        load_matrix(path)


@pytest.mark.parametrize("shape", [(3, 0), (0, 3)])
def test_npy_with_no_cells_is_rejected(tmp_path, shape):
    path = tmp_path / "m.npy"
    np.save(path, np.zeros(shape), allow_pickle=False)
    with pytest.raises(FileFormatError):
        load_matrix(path)


# Fuzzing ------------------------------------------------------------------------------


def _load_or_format_error(load: Callable[[], Any]) -> Any:
    """The loaded value, or None on FileFormatError; any other exception fails the test."""
    try:
        value = load()
    except FileFormatError as e:
        assert str(e).strip()
        event("FileFormatError")
        return None
    event("loaded")
    return value


@pytest.fixture(scope="module")
def fuzz_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz")


@FUZZ
@given(data=st.binary(max_size=600))
@example(data=b"\xef\xbb\xbf{}")
@example(data=b'{"format": "attnviz-scenario", "version": 1}')
def test_fuzz_random_bytes_to_scenario_loader(fuzz_dir, data):
    result = _load_or_format_error(lambda: scenario_from_json(data))
    assert result is None or isinstance(result, Scenario)
    path = fuzz_dir / "fuzz.attn.json"
    path.write_bytes(data)
    result = _load_or_format_error(lambda: load_scenario(path))
    assert result is None or isinstance(result, Scenario)


@FUZZ
@given(text=st.text(alphabet=st.sampled_from('{}[]":,0123456789.eE-+ tnrufalsNIy\\'), max_size=300))
def test_fuzz_json_like_text_to_scenario_loader(text):
    result = _load_or_format_error(lambda: scenario_from_json(text))
    assert result is None or isinstance(result, Scenario)


def _check_matrix(a: Any) -> None:
    assert isinstance(a, np.ndarray) and a.dtype == np.float64 and a.ndim == 2
    assert np.all(np.abs(a) <= LIMITS.abs_value)


csv_pieces = st.sampled_from(
    [*"0123456789.,+-eE \t\n\r", "\u2212", "nan", "inf", "\ufeff", "\u0661", "1e999", "é"]
)


@FUZZ
@given(
    data=st.binary(max_size=300)
    | st.lists(csv_pieces, max_size=60).map(lambda parts: "".join(parts).encode())
)
@example(data="\u0661,2\n".encode())
def test_fuzz_csv_loader(fuzz_dir, data):
    path = fuzz_dir / "fuzz.csv"
    path.write_bytes(data)
    a = _load_or_format_error(lambda: load_matrix(path))
    if a is not None:
        _check_matrix(a)
        assert a.size > 0


def _valid_npy() -> bytes:
    f = io.BytesIO()
    np.save(f, np.arange(6.0).reshape(2, 3) / 7, allow_pickle=False)
    return f.getvalue()


@st.composite
def mutated_npy(draw):
    data = bytearray(_valid_npy())
    for _ in range(draw(st.integers(1, 4))):
        pos = draw(st.integers(0, len(data)))
        kind = draw(st.sampled_from(["flip", "delete", "insert", "truncate"]))
        if kind == "flip" and pos < len(data):
            data[pos] = draw(st.integers(0, 255))
        elif kind == "delete":
            del data[pos : pos + draw(st.integers(1, 8))]
        elif kind == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=8))
        else:
            del data[pos:]
    return bytes(data)


@FUZZ
@given(
    data=st.binary(max_size=300)
    | st.binary(max_size=200).map(lambda b: b"\x93NUMPY\x01\x00" + b)
    | mutated_npy()
)
def test_fuzz_npy_loader(fuzz_dir, data):
    path = fuzz_dir / "fuzz.npy"
    path.write_bytes(data)
    a = _load_or_format_error(lambda: load_matrix(path))
    if a is not None:
        _check_matrix(a)


# Values a hand-edited or corrupted file might hold where something else belongs.
odd_values = st.sampled_from(
    [
        *(None, True, False, 0, -1, 2, 65, 2049, 2**32, 2**64, 10**400, -(10**400), 1e308),
        *("", "1", "NaN", "Infinity", "causal", "W_Q", "x" * 65, [], {}, [[]], [[1.0]], [1.0]),
    ]
).map(copy.deepcopy)  # fresh lists and dicts: mutations must not change the pool
json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**6), 10**6),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8),
)
json_values = st.one_of(
    odd_values,
    st.recursive(
        json_scalars | odd_values,
        lambda children: (
            st.lists(children, max_size=4)
            | st.dictionaries(st.text(max_size=6), children, max_size=3)
        ),
        max_leaves=10,
    ),
)


def _paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(value, dict):
        for key, child in value.items():
            out += _paths(child, (*prefix, key))
    elif isinstance(value, list):
        for i, child in enumerate(value):
            out += _paths(child, (*prefix, i))
    return out


def _at(doc: Any, path: tuple) -> Any:
    for key in path:
        doc = doc[key]
    return doc


@st.composite
def mutated_documents(draw):
    doc: Any = worked_doc()
    for _ in range(draw(st.integers(1, 3))):
        paths = _paths(doc)
        # Matrix cells outnumber everything else: a third of the time aim at the structure,
        # a third at the settings.
        structure = [p for p in paths if len(p) <= 2 or (len(p) == 3 and p[0] == "heads")]
        in_settings = [p for p in paths if p[:1] == ("settings",)]
        aims = [paths, structure] + ([in_settings] if in_settings else [])
        path = draw(st.sampled_from(draw(st.sampled_from(aims))))
        target = _at(doc, path)
        kind = draw(st.sampled_from(["replace", "delete", "add", "truncate", "duplicate"]))
        if kind == "replace":
            if path:
                _at(doc, path[:-1])[path[-1]] = draw(json_values)
            else:
                doc = draw(json_values)
        elif kind == "delete" and path:
            del _at(doc, path[:-1])[path[-1]]
        elif kind == "add" and isinstance(target, dict):
            key = draw(st.text(max_size=6) | st.sampled_from(sorted(TOP_KEYS | SETTING_KEYS)))
            target[key] = draw(json_values)
        elif kind == "add" and isinstance(target, list):
            target.insert(draw(st.integers(0, len(target))), draw(json_values))
        elif kind == "truncate" and isinstance(target, list):
            del target[draw(st.integers(0, len(target))) :]
        elif kind == "duplicate" and isinstance(target, list) and target:
            target.append(copy.deepcopy(target[draw(st.integers(0, len(target) - 1))]))
    text = json.dumps(
        doc, indent=draw(st.sampled_from([None, 1])), ensure_ascii=draw(st.booleans())
    )
    if draw(st.booleans()):
        text = text[: draw(st.integers(0, len(text)))]
    return text.encode() if draw(st.booleans()) else text


@FUZZ
@given(text=mutated_documents())
@example(text=_huge_dropout_document())
def test_fuzz_mutated_documents(text):
    s = _load_or_format_error(lambda: scenario_from_json(text))
    if s is None:
        return
    # Whatever loads is a valid scenario that saves and loads back identically.
    assert isinstance(s, Scenario)
    again = scenario_from_json(scenario_to_json(s))
    assert again.tokens == s.tokens and again.settings == s.settings
    for name in ("X", "W_Q", "W_K", "W_V", "W_O"):
        assert same_bits(getattr(again, name), getattr(s, name))


def test_snapshot_round_trips_exactly(tmp_path):
    from attnviz.core.io.files import load_snapshot, save_snapshot

    rng = np.random.default_rng(4)
    s = Scenario(
        tokens=("a", "", "säß 🐈"),
        X=rng.standard_normal((3, 5)),
        W_Q=rng.standard_normal((2, 5, 3)),
        W_K=rng.standard_normal((2, 5, 3)),
        W_V=rng.standard_normal((2, 5, 3)),
        W_O=rng.standard_normal((6, 5)),
        settings=Settings(mask="causal-zero", scale=False, dropout=0.25, dropout_seed=9),
    )
    save_snapshot(tmp_path / "a.npz", s)
    back = load_snapshot(tmp_path / "a.npz")
    assert back.tokens == s.tokens and back.settings == s.settings
    for name in ("X", "W_Q", "W_K", "W_V", "W_O"):
        assert np.asarray(getattr(back, name)).tobytes() == np.asarray(getattr(s, name)).tobytes()


@pytest.mark.parametrize("content", [b"", b"not a zip", b"PK\x03\x04broken"])
def test_bad_snapshot_is_a_file_format_error(tmp_path, content):
    from attnviz.core.io.files import load_snapshot

    (tmp_path / "b.npz").write_bytes(content)
    with pytest.raises(FileFormatError, match=r"b\.npz"):
        load_snapshot(tmp_path / "b.npz")
    with pytest.raises(FileFormatError):
        load_snapshot(tmp_path / "missing.npz")


def test_ablated_heads_are_saved_from_one(tmp_path):
    from attnviz.core.presets import worked_example as example

    path = tmp_path / "a.attn.json"
    save_scenario(path, example(Settings(ablated=(1,))))
    assert json.loads(path.read_text("utf-8"))["settings"]["ablated"] == [2]
    assert load_scenario(path).settings.ablated == (1,)
    doc = json.loads(path.read_text("utf-8"))
    doc["settings"]["ablated"] = [3]
    with pytest.raises(FileFormatError, match="head 3 does not exist"):
        scenario_from_json(json.dumps(doc))
    doc["settings"]["ablated"] = [0]
    with pytest.raises(FileFormatError, match=r"settings\.ablated"):
        scenario_from_json(json.dumps(doc))
