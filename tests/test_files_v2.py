"""Version 2 of the scenario file: every new field round-trips bit for bit (JSON and
snapshots), plain scenarios still save as version 1, the worked example's version-1
document loads unchanged, version-1 files may not hold version-2 fields, and hostile
version-2 input is refused with a message that names the field.

Expected values are typed in here or built by the test; the code under test only ever
produces the value being checked.
"""

from __future__ import annotations

import copy
import json
import pathlib
import re
import struct
import tempfile
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from attnviz.core.io.files import (
    FileFormatError,
    load_scenario,
    load_snapshot,
    save_scenario,
    save_snapshot,
    scenario_from_dict,
    scenario_from_json,
    scenario_to_dict,
)
from attnviz.core.maths.scenario import LIMITS, MASKS, SOFTCAP_LEAST, Scenario, Settings

ROUND_TRIP = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

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
V1_SETTINGS = {
    "projections": True,
    "scale": True,
    "mask": "causal",
    "positional": "none",
    "dropout": 0.0,
    "dropout_seed": 0,
    "ablated": [],
}
NEUTRAL = {"b_Q": 0.0, "b_K": 0.0, "b_V": 0.0, "b_O": 0.0, "q_norm": 1.0, "k_norm": 1.0}
DEFAULTS = Settings()


def worked_v1_doc() -> dict[str, Any]:
    """The worked example's version-1 document, exactly as version 1 wrote it."""
    return {
        "format": "attnviz-scenario",
        "version": 1,
        "tokens": list(TOKENS),
        "X": copy.deepcopy(X),
        "heads": copy.deepcopy(HEADS),
        "W_O": copy.deepcopy(W_O),
        "settings": dict(V1_SETTINGS),
    }


KV_TOKENS = ["le", "chat", "noir"]
X_KV = [[0.5, -0.5, 0.25, 0.0], [-1.0, 0.125, 0.75, 0.5], [0.0, 0.0, 1.0, -0.25]]
MASK = [[1, 0, 0], [1, 1, 0], [0, 1, 1], [1, 1, 1]]


def v2_doc() -> dict[str, Any]:
    """A version-2 document using most new fields: cross-attention (4 queries over 3
    keys), one key/value head for two query heads, biases, QK-norm weights, b_O, a
    custom mask, RoPE and sinks."""
    return {
        "format": "attnviz-scenario",
        "version": 2,
        "tokens": list(TOKENS),
        "X": copy.deepcopy(X),
        "kv_tokens": list(KV_TOKENS),
        "X_kv": copy.deepcopy(X_KV),
        "heads": [
            {"W_Q": copy.deepcopy(HEADS[0]["W_Q"]), "b_Q": [0.5, -0.5], "q_norm": [1.0, 2.0]},
            {"W_Q": copy.deepcopy(HEADS[1]["W_Q"]), "b_Q": [0.0, 0.25], "q_norm": [0.5, 1.0]},
        ],
        "kv_heads": [
            {
                "W_K": copy.deepcopy(HEADS[0]["W_K"]),
                "b_K": [1.0, 0.0],
                "W_V": copy.deepcopy(HEADS[0]["W_V"]),
                "b_V": [-1.0, 3.0],
                "k_norm": [1.5, 1.0],
            }
        ],
        "W_O": copy.deepcopy(W_O),
        "b_O": [0.1, 0.2, 0.3, 0.4],
        "settings": {
            **V1_SETTINGS,
            "mask": "custom",
            "positional": "rope",
            "mask_matrix": copy.deepcopy(MASK),
            "causal_alignment": "bottom-right",
            "rope_base": 500.0,
            "rope_style": "interleaved",
            "rope_dims": 2,
            "qk_norm": "rms",
            "qk_norm_eps": 0.001,
            "softcap": 30.0,
            "sinks": [0.5, -1.0],
        },
    }


def same_bits(a: Any, b: Any) -> bool:
    """Equal shape, float64, and identical bytes (so -0.0 and subnormals count)."""
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype == np.float64 and a.shape == b.shape and a.tobytes() == b.tobytes()


def float_bits(x: float | None) -> bytes | None:
    return None if x is None else struct.pack("<d", x)


def names_field(message: str, field: str) -> bool:
    """message names field, not as part of a longer name (X_kv is not X)."""
    return re.search(r"(?<![\w.\[])" + re.escape(field) + r"(?!\w)", message) is not None


# The worked example: version 1 stays version 1 -----------------------------------------


def test_the_v1_document_of_the_worked_example_loads_unchanged(tmp_path):
    doc = worked_v1_doc()
    path = tmp_path / "worked.attn.json"
    path.write_text(json.dumps(doc, indent=1), encoding="utf-8")
    s = load_scenario(path)
    assert s.tokens == tuple(TOKENS)
    assert same_bits(s.X, X) and same_bits(s.W_O, W_O)
    for name in ("W_Q", "W_K", "W_V"):
        assert same_bits(getattr(s, name), [head[name] for head in HEADS]), name
    # every version-2 part is neutral
    assert (s.n_heads, s.kv_heads, s.d_k, s.m) == (2, 2, 2, 4)
    assert s.X_kv is None and s.kv_tokens is None and s.mask_matrix is None
    for name, value in NEUTRAL.items():
        assert same_bits(getattr(s, name), np.full(getattr(s, name).shape, value)), name
    assert s.settings == DEFAULTS
    # and it saves back to the very same document, as version 1
    assert scenario_to_dict(s) == doc
    save_scenario(tmp_path / "again.attn.json", s)
    assert json.loads((tmp_path / "again.attn.json").read_text("utf-8")) == doc


def test_a_plain_scenario_with_neutral_parts_spelled_out_still_writes_version_1():
    s = Scenario(
        tokens=tuple(TOKENS),
        X=np.array(X),
        W_Q=np.array([h["W_Q"] for h in HEADS]),
        W_K=np.array([h["W_K"] for h in HEADS]),
        W_V=np.array([h["W_V"] for h in HEADS]),
        W_O=np.array(W_O),
        b_Q=np.zeros((2, 1, 2)),
        b_K=np.zeros((2, 1, 2)),
        b_V=np.zeros((2, 1, 2)),
        b_O=np.zeros((1, 4)),
        q_norm=np.ones((2, 1, 2)),
        k_norm=np.ones((2, 1, 2)),
        settings=Settings(window=9, rope_base=10000.0, qk_norm_eps=1e-6, mask="causal"),
    )
    assert scenario_to_dict(s) == worked_v1_doc()


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"mask": "custom"}, "mask_matrix"),
        ({"mask": "sliding-window"}, "window"),
        ({"positional": "rope"}, "positional"),
        ({"positional": "alibi"}, "positional"),
        ({"causal_alignment": "bottom-right"}, "causal_alignment"),
        ({"rope_base": 500.0}, "rope_base"),
        ({"rope_style": "interleaved"}, "rope_style"),
        ({"rope_dims": 2}, "rope_dims"),
        ({"alibi_slopes": (0.5, 0.25)}, "alibi_slopes"),
        ({"scale_value": 0.5}, "scale_value"),
        ({"qk_norm": "rms"}, "qk_norm"),
        ({"qk_norm_eps": 0.01}, "qk_norm_eps"),
        ({"softcap": 20.0}, "softcap"),
        ({"sinks": (0.0, 1.0)}, "sinks"),
    ],
)
def test_one_v2_setting_makes_version_2(change, field):
    doc = worked_v1_doc()
    s = scenario_from_dict(doc).with_settings(**change)
    d = scenario_to_dict(s)
    assert d["version"] == 2
    assert field in d["settings"]
    assert set(d["settings"]) - set(V1_SETTINGS) <= {field, "window", "mask_matrix"}


def test_one_v2_array_makes_version_2():
    s = scenario_from_dict(worked_v1_doc())
    for name, head, neutral in (("b_Q", 1, 0.0), ("b_V", 0, 0.0), ("k_norm", 1, 1.0)):
        d = scenario_to_dict(s.with_cells(name, head, 0, 1, [[2.0]]))
        assert d["version"] == 2
        # every head holds the vector once one head uses it
        want = [[neutral, neutral], [neutral, neutral]]
        want[head][1] = 2.0
        assert [h[name] for h in d["heads"]] == want
        assert all(set(h) == {"W_Q", "W_K", "W_V", name} for h in d["heads"])
    d = scenario_to_dict(s.with_cells("b_O", None, 0, 3, [[-1.0]]))
    assert (d["version"], d["b_O"]) == (2, [0.0, 0.0, 0.0, -1.0])


def test_the_v2_document_loads_to_the_values_it_holds_and_saves_back_the_same(tmp_path):
    doc = v2_doc()
    path = tmp_path / "v2.attn.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    s = load_scenario(path)
    assert (s.n, s.m, s.n_heads, s.kv_heads, s.d_k) == (4, 3, 2, 1, 2)
    assert s.kv_tokens == tuple(KV_TOKENS) and same_bits(s.X_kv, X_KV)
    assert same_bits(s.b_Q, [[[0.5, -0.5]], [[0.0, 0.25]]])
    assert same_bits(s.q_norm, [[[1.0, 2.0]], [[0.5, 1.0]]])
    assert same_bits(s.W_K, [HEADS[0]["W_K"]]) and same_bits(s.W_V, [HEADS[0]["W_V"]])
    assert same_bits(s.b_K, [[[1.0, 0.0]]]) and same_bits(s.b_V, [[[-1.0, 3.0]]])
    assert same_bits(s.k_norm, [[[1.5, 1.0]]])
    assert same_bits(s.b_O, [[0.1, 0.2, 0.3, 0.4]])
    assert same_bits(s.mask_matrix, np.array(MASK, dtype=float))
    assert s.settings == Settings(
        mask="custom",
        positional="rope",
        causal_alignment="bottom-right",
        rope_base=500.0,
        rope_style="interleaved",
        rope_dims=2,
        qk_norm="rms",
        qk_norm_eps=0.001,
        softcap=30.0,
        sinks=(0.5, -1.0),
    )
    assert scenario_to_dict(s) == doc
    save_scenario(tmp_path / "again.attn.json", s)
    assert json.loads((tmp_path / "again.attn.json").read_text("utf-8")) == doc


# Random scenarios with every version-2 feature -------------------------------------------

finite = st.floats(
    min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False, allow_subnormal=True
)
special = st.sampled_from(
    [0.0, -0.0, 5e-324, -5e-324, 2.2250738585072014e-308, 1e-300, 1e6, -1e6, 0.1, 1 / 3]
)
values = st.one_of(finite, special)
labels = st.text(st.characters(exclude_categories=("Cc", "Cs", "Cn")), max_size=LIMITS.token_chars)
setting_floats = st.floats(-1e4, 1e4, allow_subnormal=True) | st.sampled_from([-0.0, 0.0, 1e4])


@st.composite
def v2_scenarios(draw: st.DrawFn) -> Scenario:
    n = draw(st.integers(1, 5))
    cross = draw(st.booleans())
    m = draw(st.integers(1, 5)) if cross else n
    d_model = draw(st.integers(1, 5))
    H = draw(st.integers(1, 4))
    G = draw(st.sampled_from([g for g in range(1, H + 1) if H % g == 0]))
    d_k = draw(st.integers(1, 4))

    def mat(*shape: int) -> np.ndarray:
        return draw(hnp.arrays(np.float64, shape, elements=values))

    def maybe(*shape: int) -> np.ndarray | None:
        return mat(*shape) if draw(st.booleans()) else None

    per_head = st.lists(setting_floats, min_size=H, max_size=H).map(tuple)
    mask = draw(st.sampled_from(MASKS))
    config = Settings(
        projections=draw(st.booleans()),
        scale=draw(st.booleans()),
        mask=mask,
        positional=draw(st.sampled_from(("none", "sinusoidal", "rope", "alibi"))),
        dropout=draw(st.floats(0.0, 1.0, exclude_max=True)),
        dropout_seed=draw(st.integers(0, 2**32 - 1)),
        ablated=tuple(sorted(draw(st.sets(st.integers(0, H - 1))))),
        window=draw(st.integers(1, LIMITS.tokens)),
        causal_alignment=draw(st.sampled_from(("top-left", "bottom-right"))),
        rope_base=draw(st.floats(1.0, 1e9, exclude_min=True) | st.just(10000.0)),
        rope_style=draw(st.sampled_from(("half", "interleaved"))),
        rope_dims=draw(st.none() | st.integers(1, d_k // 2).map(lambda k: 2 * k))
        if d_k >= 2
        else None,
        alibi_slopes=draw(st.none() | per_head),
        scale_value=draw(st.none() | st.floats(0.0, 1e9, exclude_min=True)),
        qk_norm=draw(st.sampled_from(("none", "rms"))),
        qk_norm_eps=draw(st.floats(0.0, 1.0, exclude_min=True) | st.just(1e-6)),
        softcap=draw(st.none() | st.floats(SOFTCAP_LEAST, 1e9)),
        sinks=draw(st.none() | per_head),
    )
    extra: dict[str, Any] = {}
    if cross:
        extra.update(kv_tokens=tuple(draw(st.lists(labels, min_size=m, max_size=m))))
        extra.update(X_kv=mat(m, d_model))
    if mask == "custom":
        extra["mask_matrix"] = draw(
            hnp.arrays(np.float64, (n, m), elements=st.sampled_from([0.0, 1.0]))
        )
    return Scenario(
        tokens=tuple(draw(st.lists(labels, min_size=n, max_size=n))),
        X=mat(n, d_model),
        W_Q=mat(H, d_model, d_k),
        W_K=mat(G, d_model, d_k),
        W_V=mat(G, d_model, d_k),
        W_O=mat(H * d_k, d_model),
        b_Q=maybe(H, 1, d_k),
        b_K=maybe(G, 1, d_k),
        b_V=maybe(G, 1, d_k),
        b_O=maybe(1, d_model),
        q_norm=maybe(H, 1, d_k),
        k_norm=maybe(G, 1, d_k),
        settings=config,
        **extra,
    )


def assert_same_settings(got: Settings, want: Settings) -> None:
    """Every setting equal, floats to the bit; the window only where a sliding window
    uses it (a save writes it only then)."""
    for field in want.__dataclass_fields__:
        a, b = getattr(got, field), getattr(want, field)
        if field == "window" and want.mask != "sliding-window":
            assert a == DEFAULTS.window
            continue
        assert type(a) is type(b), field
        if isinstance(b, float):
            assert float_bits(a) == float_bits(b), field
        elif isinstance(b, tuple):
            assert [float_bits(x) if isinstance(x, float) else x for x in a] == [
                float_bits(x) if isinstance(x, float) else x for x in b
            ], field
        else:
            assert a == b, field


def uses_v2(s: Scenario) -> bool:
    """Whether s needs version 2, decided here from the spec's list of v2 fields."""
    st_ = s.settings
    arrays = any(
        not np.array_equal(getattr(s, name), np.full(getattr(s, name).shape, value))
        for name, value in NEUTRAL.items()
    )
    settings_ = any(
        getattr(st_, name) != getattr(DEFAULTS, name)
        for name in (
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
    )
    return bool(
        s.cross
        or s.kv_heads != s.n_heads
        or arrays
        or settings_
        or st_.mask in ("sliding-window", "custom")
        or st_.positional in ("rope", "alibi")
    )


@ROUND_TRIP
@given(s=v2_scenarios())
def test_random_v2_scenarios_round_trip_bit_for_bit(s):
    with tempfile.TemporaryDirectory() as folder:
        path = pathlib.Path(folder) / "s.attn.json"
        save_scenario(path, s)
        doc = json.loads(path.read_text("utf-8"))
        back = load_scenario(path)

    assert doc["version"] == (2 if uses_v2(s) else 1)
    assert ("X_kv" in doc) == ("kv_tokens" in doc) == s.cross
    assert ("kv_heads" in doc) == (s.kv_heads != s.n_heads)
    assert ("b_O" in doc) == bool(s.b_O.any())
    assert ("mask_matrix" in doc["settings"]) == (s.settings.mask == "custom")
    assert back.tokens == s.tokens and back.kv_tokens == s.kv_tokens
    for name, want in s.arrays().items():
        got = getattr(back, name)
        if name in NEUTRAL and np.array_equal(want, np.full(want.shape, NEUTRAL[name])):
            # a neutral array is not written; it comes back neutral (see the -0.0 test)
            assert np.array_equal(got, want), name
        else:
            assert same_bits(got, want), name
    assert (
        back.mask_matrix is None
        if s.mask_matrix is None
        else same_bits(back.mask_matrix, s.mask_matrix)
    )
    assert_same_settings(back.settings, s.settings)
    # and saving what was loaded writes the same document
    assert scenario_to_dict(back) == doc


@ROUND_TRIP
@given(s=v2_scenarios())
def test_random_v2_scenarios_round_trip_through_snapshots(s):
    with tempfile.TemporaryDirectory() as folder:
        path = pathlib.Path(folder) / "s.npz"
        save_snapshot(path, s)
        back = load_snapshot(path)
    assert back.tokens == s.tokens and back.kv_tokens == s.kv_tokens
    assert set(back.arrays()) == set(s.arrays())
    for name, want in s.arrays().items():
        assert same_bits(getattr(back, name), want), name
    assert_same_settings(back.settings, s.settings)


@pytest.mark.xfail(
    strict=True,
    reason="a bias of all −0.0 counts as not in use, so it is not written and loads as "
    "+0.0: the .attn.json round trip is not bit for bit there",
)
def test_a_bias_of_negative_zeros_round_trips_bit_for_bit(tmp_path):
    s = scenario_from_dict(worked_v1_doc())
    s = s.with_cells("b_Q", 0, 0, 0, [[-0.0, -0.0]])
    save_scenario(tmp_path / "z.attn.json", s)
    assert same_bits(load_scenario(tmp_path / "z.attn.json").b_Q, s.b_Q)


# Version-1 files may not hold version-2 fields -------------------------------------------


def _v1_with(change: Callable[[dict], None]) -> dict[str, Any]:
    doc = worked_v1_doc()
    change(doc)
    return doc


def _put(*path: Any, value: Any) -> Callable[[dict], None]:
    def change(doc: dict) -> None:
        target = doc
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = copy.deepcopy(value)

    return change


def _cross(doc: dict) -> None:
    doc["kv_tokens"], doc["X_kv"] = list(KV_TOKENS), copy.deepcopy(X_KV)


def _shared(doc: dict) -> None:
    doc["kv_heads"] = [{k: doc["heads"][0][k] for k in ("W_K", "W_V")}]
    for head in doc["heads"]:
        del head["W_K"], head["W_V"]


V2_IN_V1 = [
    ("kv_tokens-and-X_kv", _cross, "kv_tokens"),
    ("X_kv", _put("X_kv", value=X_KV), "X_kv"),
    ("kv_heads", _shared, "kv_heads"),
    ("b_O", _put("b_O", value=[0.0, 1.0, 0.0, 0.0]), "b_O"),
    ("head-b_Q", _put("heads", 0, "b_Q", value=[1.0, 0.0]), "heads[1].b_Q"),
    ("head-k_norm", _put("heads", 1, "k_norm", value=[1.0, 2.0]), "heads[2].k_norm"),
    ("mask-custom", _put("settings", "mask", value="custom"), "settings.mask"),
    ("positional-rope", _put("settings", "positional", value="rope"), "settings.positional"),
    ("positional-alibi", _put("settings", "positional", value="alibi"), "settings.positional"),
    ("window", _put("settings", "window", value=3), "settings.window"),
    ("mask_matrix", _put("settings", "mask_matrix", value=[[1] * 4] * 4), "settings.mask_matrix"),
    (
        "alignment",
        _put("settings", "causal_alignment", value="top-left"),
        "settings.causal_alignment",
    ),
    ("rope_base", _put("settings", "rope_base", value=10000.0), "settings.rope_base"),
    ("rope_style", _put("settings", "rope_style", value="half"), "settings.rope_style"),
    ("rope_dims", _put("settings", "rope_dims", value=2), "settings.rope_dims"),
    ("alibi_slopes", _put("settings", "alibi_slopes", value=[0.5, 0.25]), "settings.alibi_slopes"),
    ("scale_value", _put("settings", "scale_value", value=0.5), "settings.scale_value"),
    ("qk_norm", _put("settings", "qk_norm", value="rms"), "settings.qk_norm"),
    ("qk_norm_eps", _put("settings", "qk_norm_eps", value=0.1), "settings.qk_norm_eps"),
    ("softcap", _put("settings", "softcap", value=30.0), "settings.softcap"),
    ("sinks", _put("settings", "sinks", value=[0.0, 1.0]), "settings.sinks"),
]


@pytest.mark.parametrize(("case", "change", "field"), V2_IN_V1, ids=[c[0] for c in V2_IN_V1])
def test_a_version_1_file_with_a_version_2_field_is_refused(case, change, field, tmp_path):
    doc = _v1_with(change)
    path = tmp_path / "old.attn.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    with pytest.raises(FileFormatError) as caught:
        load_scenario(path)
    message = str(caught.value)
    assert message.startswith("old.attn.json: "), message
    assert names_field(message, field), message
    assert "Traceback" not in message and "\n" not in message
    if "version" not in message:
        assert "unknown field" in message  # a head field version 1 did not have


@pytest.mark.parametrize(
    ("case", "change", "field"),
    [c for c in V2_IN_V1 if c[0] not in ("X_kv", "mask_matrix", "mask-custom")],
    ids=[c[0] for c in V2_IN_V1 if c[0] not in ("X_kv", "mask_matrix", "mask-custom")],
)
def test_the_same_fields_load_as_version_2(case, change, field):
    doc = _v1_with(change)
    doc["version"] = 2
    s = scenario_from_json(json.dumps(doc))
    # saved again: version 2, unless the field holds its default (or, for the window,
    # no sliding window uses it), when nothing needs version 2
    neutral = case in ("window", "alignment", "rope_base", "rope_style")
    assert scenario_to_dict(s)["version"] == (1 if neutral else 2)


# Hostile version-2 input -------------------------------------------------------------------


def _drop(*path: Any) -> Callable[[dict], None]:
    def change(doc: dict) -> None:
        target = doc
        for key in path[:-1]:
            target = target[key]
        del target[path[-1]]

    return change


def _both(*changes: Callable[[dict], None]) -> Callable[[dict], None]:
    def change(doc: dict) -> None:
        for c in changes:
            c(doc)

    return change


def _extra_kv_head(doc: dict) -> None:  # 2 key/value heads for 2 query heads: fine
    doc["kv_heads"].append(copy.deepcopy(doc["kv_heads"][0]))


def _three_kv_heads(doc: dict) -> None:
    doc["kv_heads"] = [copy.deepcopy(doc["kv_heads"][0]) for _ in range(3)]


HOSTILE = [
    # biases and norm weights of the wrong length, or not numbers
    ("b_Q-3", _put("heads", 0, "b_Q", value=[0.0, 1.0, 2.0]), "heads[1].b_Q"),
    ("b_Q-1", _put("heads", 1, "b_Q", value=[0.0]), "heads[2].b_Q"),
    ("b_Q-matrix", _put("heads", 0, "b_Q", value=[[0.0, 1.0]]), "heads[1].b_Q"),
    ("b_Q-string", _put("heads", 0, "b_Q", value=["0", 1.0]), "heads[1].b_Q"),
    ("b_Q-bool", _put("heads", 0, "b_Q", value=[True, 1.0]), "heads[1].b_Q"),
    ("b_Q-huge", _put("heads", 0, "b_Q", value=[1e7, 1.0]), "heads[1].b_Q"),
    ("q_norm-3", _put("heads", 1, "q_norm", value=[1.0, 1.0, 1.0]), "heads[2].q_norm"),
    ("b_K-3", _put("kv_heads", 0, "b_K", value=[1.0, 1.0, 1.0]), "kv_heads[1].b_K"),
    ("b_V-empty", _put("kv_heads", 0, "b_V", value=[]), "kv_heads[1].b_V"),
    ("k_norm-object", _put("kv_heads", 0, "k_norm", value={"a": 1}), "kv_heads[1].k_norm"),
    ("b_O-3", _put("b_O", value=[0.0, 1.0, 2.0]), "b_O"),
    ("b_O-5", _put("b_O", value=[0.0] * 5), "b_O"),
    ("b_O-null", _put("b_O", value=None), "b_O"),
    # key/value heads
    ("kv_heads-3-for-2", _three_kv_heads, "kv_heads"),
    ("kv_heads-empty", _put("kv_heads", value=[]), "kv_heads"),
    ("kv_heads-not-list", _put("kv_heads", value={"W_K": [[0.0]]}), "kv_heads"),
    ("kv_heads-W_K-4x3", _put("kv_heads", 0, "W_K", value=[[0.0] * 3] * 4), "kv_heads[1].W_K"),
    ("kv_heads-missing-W_V", _drop("kv_heads", 0, "W_V"), "kv_heads[1].W_V"),
    ("kv_heads-with-W_Q", _put("kv_heads", 0, "W_Q", value=HEADS[0]["W_Q"]), "kv_heads[1].W_Q"),
    ("heads-with-W_K", _put("heads", 0, "W_K", value=HEADS[0]["W_K"]), "heads[1].W_K"),
    (
        "kv_heads-2-then-b_K-3",
        _both(_extra_kv_head, _put("kv_heads", 1, "b_K", value=[1.0] * 3)),
        "kv_heads[2].b_K",
    ),
    # cross-attention
    ("X_kv-without-kv_tokens", _drop("kv_tokens"), "X_kv"),
    ("kv_tokens-without-X_kv", _drop("X_kv"), "X_kv"),
    ("X_kv-width-3", _put("X_kv", value=[r[:3] for r in X_KV]), "X_kv"),
    ("X_kv-2-rows", _put("X_kv", value=X_KV[:2]), "X_kv"),
    ("X_kv-nan", _put("X_kv", 1, 2, value=float("nan")), "X_kv[2,3]"),
    ("kv_tokens-not-text", _put("kv_tokens", 0, value=5), "kv_tokens[1]"),
    ("kv_tokens-control", _put("kv_tokens", 2, value="a\x07"), "kv_tokens[3]"),
    # the custom mask
    (
        "mask_matrix-4x4",
        _put("settings", "mask_matrix", value=[[1] * 4] * 4),
        "settings.mask_matrix",
    ),
    ("mask_matrix-3x3", _put("settings", "mask_matrix", value=MASK[:3]), "settings.mask_matrix"),
    ("mask_matrix-2", _put("settings", "mask_matrix", 0, 1, value=2), "settings.mask_matrix[1,2]"),
    (
        "mask_matrix-half",
        _put("settings", "mask_matrix", 3, 0, value=0.5),
        "settings.mask_matrix[4,1]",
    ),
    (
        "mask_matrix-neg",
        _put("settings", "mask_matrix", 1, 1, value=-1),
        "settings.mask_matrix[2,2]",
    ),
    (
        "mask_matrix-text",
        _put("settings", "mask_matrix", 0, 0, value="1"),
        "settings.mask_matrix[1,1]",
    ),
    (
        "mask_matrix-bool",
        _put("settings", "mask_matrix", 0, 0, value=True),
        "settings.mask_matrix[1,1]",
    ),
    (
        "mask_matrix-nan",
        _put("settings", "mask_matrix", 0, 0, value=float("nan")),
        "settings.mask_matrix[1,1]",
    ),
    ("mask_matrix-flat", _put("settings", "mask_matrix", value=[1, 0, 1]), "settings.mask_matrix"),
    ("mask_matrix-causal", _put("settings", "mask", value="causal"), "settings.mask_matrix"),
    ("mask_matrix-none", _put("settings", "mask", value="none"), "settings.mask_matrix"),
    ("custom-without-mask_matrix", _drop("settings", "mask_matrix"), "settings.mask_matrix"),
    # sinks, slopes and the other settings
    ("sinks-text", _put("settings", "sinks", value=["a", 1.0]), "settings.sinks"),
    ("sinks-string", _put("settings", "sinks", value="0.5, 1"), "settings.sinks"),
    ("sinks-bools", _put("settings", "sinks", value=[True, False]), "settings.sinks"),
    ("sinks-null", _put("settings", "sinks", value=[None, 1.0]), "settings.sinks"),
    ("sinks-nested", _put("settings", "sinks", value=[[0.5], [1.0]]), "settings.sinks"),
    ("sinks-nan", _put("settings", "sinks", value=[float("nan"), 1.0]), "settings.sinks[1]"),
    ("sinks-inf", _put("settings", "sinks", value=[0.0, float("inf")]), "settings.sinks[2]"),
    ("sinks-huge", _put("settings", "sinks", value=[0.0, 1e5]), "settings.sinks[2]"),
    ("sinks-3", _put("settings", "sinks", value=[0.0, 1.0, 2.0]), "settings.sinks"),
    ("sinks-empty", _put("settings", "sinks", value=[]), "settings.sinks"),
    (
        "alibi_slopes-text",
        _put("settings", "alibi_slopes", value=["x", 1]),
        "settings.alibi_slopes",
    ),
    ("alibi_slopes-1", _put("settings", "alibi_slopes", value=[0.5]), "settings.alibi_slopes"),
    ("rope_dims-odd", _put("settings", "rope_dims", value=1), "settings.rope_dims"),
    ("rope_dims-4", _put("settings", "rope_dims", value=4), "settings.rope_dims"),
    ("rope_dims-float", _put("settings", "rope_dims", value=2.0), "settings.rope_dims"),
    ("rope_base-1", _put("settings", "rope_base", value=1.0), "settings.rope_base"),
    ("rope_style", _put("settings", "rope_style", value="spiral"), "settings.rope_style"),
    ("softcap-0", _put("settings", "softcap", value=0), "settings.softcap"),
    ("softcap-text", _put("settings", "softcap", value="30"), "settings.softcap"),
    ("scale_value-neg", _put("settings", "scale_value", value=-0.5), "settings.scale_value"),
    ("qk_norm", _put("settings", "qk_norm", value="layer"), "settings.qk_norm"),
    ("qk_norm_eps-2", _put("settings", "qk_norm_eps", value=2.0), "settings.qk_norm_eps"),
    (
        "alignment",
        _put("settings", "causal_alignment", value="middle"),
        "settings.causal_alignment",
    ),
    (
        "window-0",
        _both(
            _put("settings", "mask", value="sliding-window"),
            _drop("settings", "mask_matrix"),
            _put("settings", "window", value=0),
        ),
        "settings.window",
    ),
]


@pytest.mark.parametrize(("case", "change", "field"), HOSTILE, ids=[c[0] for c in HOSTILE])
def test_hostile_v2_input_names_the_field(case, change, field):
    doc = v2_doc()
    change(doc)
    text = json.dumps(doc)  # NaN and Infinity as Python's json writes them
    with pytest.raises(FileFormatError) as caught:
        scenario_from_json(text)
    message = str(caught.value)
    assert names_field(message, field), message
    assert "\n" not in message and len(message) < 300, message


def test_a_hostile_file_names_itself_and_the_field(tmp_path):
    doc = v2_doc()
    doc["settings"]["sinks"] = ["0.5", 1.0]
    path = tmp_path / "bad.attn.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    with pytest.raises(FileFormatError, match=r"^bad\.attn\.json: settings\.sinks\[1\]: "):
        load_scenario(path)


def test_extra_kv_heads_that_divide_the_heads_load():
    doc = v2_doc()
    _extra_kv_head(doc)
    s = scenario_from_json(json.dumps(doc))
    assert (s.n_heads, s.kv_heads) == (2, 2)


def test_a_mask_cell_that_is_not_0_or_1_is_printed_as_written():
    doc = v2_doc()
    doc["settings"]["mask_matrix"][3][0] = 0.5
    with pytest.raises(FileFormatError) as caught:
        scenario_from_json(json.dumps(doc))
    assert str(caught.value) == "settings.mask_matrix[4,1]: 0.5 is not 0 or 1"
