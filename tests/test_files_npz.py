"""The binary scenario form (.attn.npz) and provenance (format version 3).

Round trips are bit for bit for every array a scenario can hold; the archive's layout is
read back with plain numpy and json; hostile archives (not a zip, cut short, damaged,
members missing, unnamed, of the wrong type or shape, pickles, NaN, shapes declaring
terabytes, zip bombs) are each refused with one FileFormatError whose message is checked.
Archives for the hostile cases are built here with zipfile and numpy, from the documented
layout, not by the code under test; expected values are typed in or built by the test.
"""

from __future__ import annotations

import copy
import dataclasses
import errno
import io
import json
import os
import pathlib
import struct
import tempfile
import tracemalloc
import zipfile
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attnviz.core.io import files as F
from attnviz.core.io import npz_files
from attnviz.core.io.files import (
    FileFormatError,
    load_scenario,
    load_snapshot,
    save_scenario,
    save_snapshot,
    scenario_from_dict,
    scenario_from_json,
    scenario_to_json,
)
from attnviz.core.maths.scenario import (
    MATRIX_NAMES,
    Scenario,
    Settings,
)
from attnviz.core.provenance import Provenance

# The brief's worked example, typed in from ATTENTION_LAB.md ----------------------------

TOKENS = ["she", "saw", "the", "cat"]
X = np.array(
    [
        [0.90, 0.10, -0.30, 0.20],
        [0.20, 0.80, 0.40, -0.50],
        [-0.40, 0.10, 0.90, 0.30],
        [0.30, -0.60, 0.20, 0.80],
    ]
)
W_Q = np.array(
    [
        [[0.1, 0.3], [0.7, -0.9], [0.3, -0.7], [-0.9, 0.7]],
        [[-0.6, -0.2], [-0.2, -0.8], [0.8, 0.6], [0.9, 0.8]],
    ]
)
W_K = np.array(
    [
        [[0.9, -0.9], [0.6, -0.3], [-0.9, 0.7], [0.2, -0.4]],
        [[0.9, -0.7], [0.8, 0.3], [0.4, 0.0], [-0.9, -0.9]],
    ]
)
W_V = np.array(
    [
        [[0.5, -0.2], [0.1, 0.6], [-0.3, 0.4], [0.7, 0.1]],
        [[0.2, 0.4], [-0.5, 0.3], [0.6, -0.1], [0.1, -0.6]],
    ]
)
W_O = np.array(
    [
        [0.5, -0.1, 0.3, 0.2],
        [0.1, 0.6, -0.2, 0.4],
        [-0.3, 0.2, 0.5, 0.1],
        [0.2, 0.3, 0.1, -0.4],
    ]
)
SETTINGS = {
    "projections": True,
    "scale": True,
    "mask": "causal",
    "positional": "none",
    "dropout": 0.0,
    "dropout_seed": 0,
    "ablated": [],
}
SHA = "0123456789abcdef" * 4
WEIGHTS = np.array(  # two heads of causal weights (rows sum to 1), typed in
    [
        [[1.0, 0, 0, 0], [0.25, 0.75, 0, 0], [0.5, 0.25, 0.25, 0], [0.125, 0.125, 0.25, 0.5]],
        [[1.0, 0, 0, 0], [0.5, 0.5, 0, 0], [0.0, 0.5, 0.5, 0], [0.25, 0.25, 0.25, 0.25]],
    ]
)
OUTPUT = np.array(
    [
        [0.5, -0.0, 1e-300, 5e-324],
        [-1.5, 2.0, 0.1, 1e9],
        [0.3, 0.2, -0.7, 0.0],
        [1 / 3, 2 / 3, -1 / 7, 0.2],
    ]
)
PROVENANCE = {
    "source": "openai-community/gpt2",
    "kind": "hub",
    "model_type": "gpt2",
    "layer": 3,
    "layers": 12,
    "text": 'She saw the cat, [1, 2] "quoted" {x}',
    "token_ids": [3347, 2497, 262, 3797],
    "model_weights": WEIGHTS.tolist(),
    "model_output": OUTPUT.tolist(),
    "files": {"model.safetensors": SHA, "config.json": "f" * 64},
}


def worked_doc(version: int = 1) -> dict[str, Any]:
    """The worked example as an .attn.json document, typed in."""
    return {
        "format": "attnviz-scenario",
        "version": version,
        "tokens": list(TOKENS),
        "X": X.tolist(),
        "heads": [
            {"W_Q": W_Q[h].tolist(), "W_K": W_K[h].tolist(), "W_V": W_V[h].tolist()}
            for h in range(2)
        ],
        "W_O": W_O.tolist(),
        "settings": dict(SETTINGS),
    }


def worked() -> Scenario:
    return Scenario(tokens=tuple(TOKENS), X=X, W_Q=W_Q, W_K=W_K, W_V=W_V, W_O=W_O)


def provenance(**changes: Any) -> Provenance:
    fields = {k: v for k, v in PROVENANCE.items() if k not in ("model_weights", "model_output")}
    fields["token_ids"] = tuple(fields["token_ids"])
    fields["files"] = tuple(fields["files"].items())
    fields.update(model_weights=WEIGHTS, model_output=OUTPUT)
    fields.update(changes)
    return Provenance(**fields)


def same_bits(a: Any, b: Any) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype == np.float64 and a.shape == b.shape and a.tobytes() == b.tobytes()


def assert_same_scenario(got: Scenario, want: Scenario) -> None:
    """Every array bit for bit, every label, setting and provenance field."""
    assert got.tokens == want.tokens and got.kv_tokens == want.kv_tokens
    assert got.settings == want.settings
    for name in MATRIX_NAMES:
        a, b = getattr(got, name), getattr(want, name)
        assert (a is None) == (b is None), name
        if a is not None:
            assert same_bits(a, b), name
    assert (got.provenance is None) == (want.provenance is None)
    if want.provenance is not None:
        p, q = got.provenance, want.provenance
        for f in dataclasses.fields(Provenance):
            x, y = getattr(p, f.name), getattr(q, f.name)
            assert same_bits(x, y) if isinstance(y, np.ndarray) else x == y, f.name


def rich(seed: int = 1, provenance_too: bool = True) -> Scenario:
    """Every optional part at once: biases (one all −0.0), QK-norm weights, 6 query heads
    sharing 3 key/value heads, cross-attention, a custom mask, RoPE, sinks, softcap, a
    provenance; numbers include −0.0, subnormals and values at ±10⁶."""
    rng = np.random.default_rng(seed)
    n, m, d, h, g, d_k = 3, 5, 6, 6, 3, 4

    def values(*shape: int) -> np.ndarray:
        a = rng.standard_normal(shape)
        flat = a.reshape(-1)
        flat[: min(4, flat.size)] = [-0.0, 5e-324, -1e6, 1e6][: min(4, flat.size)]
        return a

    return Scenario(
        tokens=("a", "b,[1]", 'c"'),
        X=values(n, d),
        W_Q=values(h, d, d_k),
        W_K=values(g, d, d_k),
        W_V=values(g, d, d_k),
        W_O=values(h * d_k, d),
        settings=Settings(
            mask="custom",
            positional="rope",
            rope_style="interleaved",
            qk_norm="rms",
            softcap=30.0,
            sinks=tuple(float(v) for v in range(h)),
            dropout=0.125,
            dropout_seed=7,
            ablated=(1, 4),
        ),
        b_Q=np.full((h, 1, d_k), -0.0),
        b_K=values(g, 1, d_k),
        b_V=values(g, 1, d_k),
        b_O=values(1, d),
        q_norm=values(h, 1, d_k),
        k_norm=values(g, 1, d_k),
        kv_tokens=tuple(f"k{i}" for i in range(m)),
        X_kv=values(m, d),
        mask_matrix=(rng.random((n, m)) < 0.6).astype(np.float64),
        provenance=provenance(
            model_weights=np.full((2, 3, 3), 1 / 3),
            model_output=values(3, 5),
            token_ids=(0, 1, 2**63 - 1),
        )
        if provenance_too
        else None,
    )


def read_npz(path: pathlib.Path) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The document and the arrays of an .attn.npz, read with numpy and json alone."""
    with np.load(path, allow_pickle=False) as archive:
        arrays = {name: archive[name] for name in archive.files}
    text = arrays.pop("scenario.json")
    assert text.dtype == np.uint8 and text.ndim == 1
    return json.loads(text.tobytes().decode("utf-8")), arrays


# Round trips ----------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_every_optional_array_round_trips_bit_for_bit(tmp_path, seed):
    s = rich(seed)
    path = tmp_path / "r.attn.npz"
    save_scenario(path, s)
    assert_same_scenario(load_scenario(path), s)
    doc, arrays = read_npz(path)
    assert doc["version"] == 3
    assert same_bits(arrays[doc["heads"]["b_Q"]], np.full((6, 4), -0.0))  # −0.0 kept
    # saving what was loaded writes the same bytes (members carry a fixed date)
    again = tmp_path / "again.attn.npz"
    save_scenario(again, load_scenario(path))
    assert again.read_bytes() == path.read_bytes()


def test_a_bias_of_negative_zeros_round_trips_bit_for_bit_unlike_json(tmp_path):
    s = worked().with_cells("b_Q", 0, 0, 0, np.array([[-0.0, -0.0]]))
    save_scenario(tmp_path / "z.attn.npz", s)
    back = load_scenario(tmp_path / "z.attn.npz")
    assert same_bits(back.b_Q, s.b_Q) and np.signbit(back.b_Q[0, 0, 0])
    doc, _ = read_npz(tmp_path / "z.attn.npz")
    assert doc["version"] == 2  # a written bias needs version 2


def test_the_layout_is_the_documented_one(tmp_path):
    s = rich(provenance_too=True)
    path = tmp_path / "l.attn.npz"
    save_scenario(path, s)
    doc, arrays = read_npz(path)
    assert doc["format"] == "attnviz-scenario" and doc["version"] == 3
    assert doc["tokens"] == list(s.tokens) and doc["kv_tokens"] == list(s.kv_tokens)
    assert doc["X"] == "X" and doc["X_kv"] == "X_kv" and doc["W_O"] == "W_O"
    assert doc["b_O"] == "b_O"
    assert doc["heads"] == {n: f"heads.{n}" for n in ("W_Q", "b_Q", "q_norm")}
    kv = ("W_K", "b_K", "W_V", "b_V", "k_norm")
    assert doc["kv_heads"] == {n: f"kv_heads.{n}" for n in kv}
    assert doc["settings"]["mask_matrix"] == "settings.mask_matrix"
    assert doc["settings"]["mask"] == "custom" and doc["settings"]["ablated"] == [2, 5]
    want = {
        "X": s.X,
        "X_kv": s.X_kv,
        "W_O": s.W_O,
        "b_O": s.b_O[0],
        "heads.W_Q": s.W_Q,
        "heads.b_Q": s.b_Q[:, 0],
        "heads.q_norm": s.q_norm[:, 0],
        "kv_heads.W_K": s.W_K,
        "kv_heads.W_V": s.W_V,
        "kv_heads.b_K": s.b_K[:, 0],
        "kv_heads.b_V": s.b_V[:, 0],
        "kv_heads.k_norm": s.k_norm[:, 0],
        "settings.mask_matrix": s.mask_matrix,
        "provenance.model_weights": s.provenance.model_weights,
        "provenance.model_output": s.provenance.model_output,
    }
    assert set(arrays) == set(want)
    for name, value in want.items():
        assert same_bits(arrays[name], value), name
        assert arrays[name].flags.c_contiguous
    p = doc["provenance"]
    assert p["model_weights"] == "provenance.model_weights"
    assert p["model_output"] == "provenance.model_output"
    assert p["token_ids"] == [0, 1, 2**63 - 1] and p["files"] == PROVENANCE["files"]
    # uncompressed: the file is little more than the arrays
    with zipfile.ZipFile(path) as z:
        assert {i.compress_type for i in z.infolist()} == {zipfile.ZIP_STORED}


def test_a_plain_scenario_writes_version_1_and_only_its_matrices(tmp_path):
    save_scenario(tmp_path / "w.attn.npz", worked())
    doc, arrays = read_npz(tmp_path / "w.attn.npz")
    assert doc == {
        "format": "attnviz-scenario",
        "version": 1,
        "tokens": TOKENS,
        "X": "X",
        "heads": {"W_Q": "heads.W_Q", "W_K": "heads.W_K", "W_V": "heads.W_V"},
        "W_O": "W_O",
        "settings": SETTINGS,
    }
    for name, value in (("X", X), ("heads.W_Q", W_Q), ("heads.W_K", W_K), ("W_O", W_O)):
        assert same_bits(arrays[name], value)
    assert same_bits(arrays["heads.W_V"], W_V)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    shape=st.tuples(st.integers(1, 5), st.integers(1, 6), st.integers(1, 3), st.integers(1, 4)),
    cross=st.booleans(),
)
def test_random_scenarios_round_trip_bit_for_bit(seed, shape, cross):
    n, d, h, d_k = shape
    rng = np.random.default_rng(seed)
    # any float64 bit pattern that is a finite number within ±10⁶, −0.0 and subnormals too
    bits = rng.integers(0, 2**64, size=4096, dtype=np.uint64).view(np.float64)
    pool = np.concatenate([bits[np.abs(bits) <= 1e6], [-0.0, 5e-324, -5e-324, 1e6]])

    def pick(*dims: int) -> np.ndarray:
        return rng.choice(pool, size=dims)

    s = Scenario(
        tokens=tuple(f"t{i}" for i in range(n)),
        X=pick(n, d),
        W_Q=pick(h, d, d_k),
        W_K=pick(h, d, d_k),
        W_V=pick(h, d, d_k),
        W_O=pick(h * d_k, d),
        b_K=pick(h, 1, d_k),
        kv_tokens=("k",) if cross else None,
        X_kv=pick(1, d) if cross else None,
    )
    with tempfile.TemporaryDirectory() as folder:
        path = pathlib.Path(folder) / "s.attn.npz"
        save_scenario(path, s)
        assert_same_scenario(load_scenario(path), s)


def test_fortran_order_big_endian_and_deflated_members_are_read(tmp_path):
    members = valid_members()
    members["X"] = np.asfortranarray(X)
    members["W_O"] = W_O.astype(">f8")
    path = tmp_path / "f.attn.npz"
    write_archive(path, npz_doc(), members, method=zipfile.ZIP_DEFLATED)
    s = load_scenario(path)
    assert same_bits(s.X, X) and same_bits(s.W_O, W_O) and same_bits(s.W_Q, W_Q)
    assert s.X.flags.c_contiguous and s.W_O.dtype.isnative


def test_the_suffix_chooses_the_form(tmp_path):
    s = worked()
    for name in ("a.attn.npz", "b.NPZ", "c.npz"):
        save_scenario(tmp_path / name, s)
        assert (tmp_path / name).read_bytes()[:4] == b"PK\x03\x04"
        assert_same_scenario(load_scenario(tmp_path / name), s)
    for name in ("d.attn.json", "e.json", "f"):
        save_scenario(tmp_path / name, s)
        assert json.loads((tmp_path / name).read_text("utf-8"))["X"] == X.tolist()
    assert F.is_binary("x.attn.npz") and not F.is_binary("x.attn.json")


def test_an_archive_named_json_and_json_named_npz_say_so(tmp_path):
    save_scenario(tmp_path / "a.attn.npz", worked())
    os.replace(tmp_path / "a.attn.npz", tmp_path / "a.attn.json")
    with pytest.raises(FileFormatError) as e:
        load_scenario(tmp_path / "a.attn.json")
    assert str(e.value) == "a.attn.json: a zip archive, not JSON text: name it .attn.npz to open it"
    save_scenario(tmp_path / "b.attn.json", worked())
    os.replace(tmp_path / "b.attn.json", tmp_path / "b.attn.npz")
    with pytest.raises(FileFormatError) as e:
        load_scenario(tmp_path / "b.attn.npz")
    assert str(e.value) == (
        "b.attn.npz: JSON text, not an .npz archive: name it .attn.json to open it"
    )


# Limits: per matrix, and a Llama-3-8B-shaped layer -------------------------------------


def test_the_limits_admit_a_llama_3_8b_shaped_layer():
    """d_model 4096, 32 query heads sharing 8 key/value heads of d_k 128 (zero-strided
    arrays: nothing is allocated). The matrix-cell limit applies per matrix (per head for
    the stacks): W_O is exactly at it."""
    d, h, g, d_k, n = 4096, 32, 8, 128, 16
    zeros = np.zeros(1)
    s = Scenario(
        tokens=tuple(f"t{i}" for i in range(n)),
        X=np.broadcast_to(zeros, (n, d)),
        W_Q=np.broadcast_to(zeros, (h, d, d_k)),
        W_K=np.broadcast_to(zeros, (g, d, d_k)),
        W_V=np.broadcast_to(zeros, (g, d, d_k)),
        W_O=np.broadcast_to(zeros, (h * d_k, d)),
        settings=Settings(positional="rope"),
    )
    assert s.W_O.size == F.MAX_MATRIX_CELLS  # 4096 × 4096 = 2²⁴: at the limit, admitted
    assert s.W_Q.size == F.MAX_MATRIX_CELLS  # the stack too; each head is 4096 × 128 = 2¹⁹
    file_bytes = 8 * (s.W_Q.size + s.W_K.size + s.W_V.size + s.W_O.size + s.X.size)
    assert 0.3e9 < file_bytes < F.MAX_NPZ_BYTES  # about 336 MB


def test_the_cell_limit_is_per_matrix_and_per_head(tmp_path, monkeypatch):
    save_scenario(tmp_path / "w.attn.npz", worked())
    monkeypatch.setattr(npz_files, "MAX_MATRIX_CELLS", 16)  # X, W_O 4 × 4 and each stack: at it
    assert_same_scenario(load_scenario(tmp_path / "w.attn.npz"), worked())
    monkeypatch.setattr(npz_files, "MAX_MATRIX_CELLS", 15)
    assert refusal(tmp_path / "w.attn.npz") == "X: 4×4 is over 15 cells"
    # d_model 1: X and W_O are small; each head of W_Q is 1 × 8
    monkeypatch.setattr(npz_files, "MAX_MATRIX_CELLS", 7)
    wide = np.zeros((2, 1, 8))
    members = valid_members(X=X[:, :1], W_O=np.zeros((16, 1)))
    members.update({"heads.W_Q": wide, "heads.W_K": wide, "heads.W_V": wide})
    write_archive(tmp_path / "q.attn.npz", npz_doc(), members)
    assert refusal(tmp_path / "q.attn.npz") == "heads.W_Q: 2×1×8 is over 7 cells per head"
    monkeypatch.setattr(npz_files, "MAX_MATRIX_CELLS", 8)  # heads of 8 pass; W_O 16 × 1 does not
    assert refusal(tmp_path / "q.attn.npz") == "W_O: 16×1 is over 8 cells"
    monkeypatch.setattr(npz_files, "MAX_MATRIX_CELLS", 16)
    assert load_scenario(tmp_path / "q.attn.npz").d_k == 8


def test_a_file_over_the_size_limit_is_refused_unread(tmp_path, monkeypatch):
    save_scenario(tmp_path / "big.attn.npz", worked())
    monkeypatch.setattr(npz_files, "MAX_NPZ_BYTES", 2**10)
    monkeypatch.setattr(zipfile, "ZipFile", None)  # never reached
    with pytest.raises(FileFormatError) as e:
        load_scenario(tmp_path / "big.attn.npz")
    assert str(e.value) == "big.attn.npz: larger than 1 KiB"


# Hand-built archives for the hostile cases ---------------------------------------------


def npy(array: Any) -> bytes:
    buffer = io.BytesIO()
    np.lib.format.write_array(buffer, np.asarray(array), allow_pickle=False)
    return buffer.getvalue()


def npz_doc(version: int = 1) -> dict[str, Any]:
    """The worked example's scenario.json, typed in from the documented layout."""
    return {
        "format": "attnviz-scenario",
        "version": version,
        "tokens": list(TOKENS),
        "X": "X",
        "heads": {"W_Q": "heads.W_Q", "W_K": "heads.W_K", "W_V": "heads.W_V"},
        "W_O": "W_O",
        "settings": dict(SETTINGS),
    }


def valid_members(**changes: Any) -> dict[str, Any]:
    members: dict[str, Any] = {
        "X": X,
        "heads.W_Q": W_Q,
        "heads.W_K": W_K,
        "heads.W_V": W_V,
        "W_O": W_O,
    }
    members.update({k.replace("_dot_", "."): v for k, v in changes.items()})
    return members


def write_archive(
    path: pathlib.Path,
    doc: Any,
    members: dict[str, Any],
    method: int = zipfile.ZIP_STORED,
    entries: dict[str, bytes] | None = None,
) -> None:
    """An archive of scenario.json (doc; bytes as given; None: no such member), the
    members (arrays, or raw .npy bytes) and any other entries, under their exact names."""
    with zipfile.ZipFile(path, "w", method) as z:
        if doc is not None:
            raw = doc if isinstance(doc, bytes) else json.dumps(doc).encode("utf-8")
            z.writestr("scenario.json.npy", npy(np.frombuffer(raw, dtype=np.uint8)))
        for name, value in members.items():
            z.writestr(name + ".npy", value if isinstance(value, bytes) else npy(value))
        for name, raw in (entries or {}).items():
            z.writestr(name, raw)


def refusal(path: pathlib.Path) -> str:
    """The message load_scenario gives for path, less the file name it starts with."""
    with pytest.raises(FileFormatError) as e:
        load_scenario(path)
    message = str(e.value)
    assert message.startswith(f"{path.name}: ") and "\n" not in message
    return message[len(path.name) + 2 :]


def test_the_hand_built_archive_is_valid(tmp_path):
    write_archive(tmp_path / "ok.attn.npz", npz_doc(), valid_members())
    assert_same_scenario(load_scenario(tmp_path / "ok.attn.npz"), worked())


def _doc(change: Callable[[dict], Any]) -> dict[str, Any]:
    doc = npz_doc()
    change(doc)
    return doc


def _set(*path: Any, value: Any) -> Callable[[dict], None]:
    def change(doc: dict) -> None:
        for key in path[:-1]:
            doc = doc[key]
        doc[path[-1]] = value

    return change


def _header(shape: tuple, descr: str = "<f8", body: bytes = b"") -> bytes:
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        buffer, {"descr": descr, "fortran_order": False, "shape": shape}
    )
    return buffer.getvalue() + body


with_nan = X.copy()
with_nan[1, 2] = np.nan
with_inf = W_Q.copy()
with_inf[1, 3, 0] = -np.inf

HOSTILE: list[tuple[str, Any, dict[str, Any], str]] = [
    # (id, scenario.json, members, the message after the file name)
    ("member-missing", npz_doc(), {"X": X, "heads.W_Q": W_Q, "heads.W_V": W_V, "W_O": W_O},
     "heads.W_K: names 'heads.W_K', which the archive does not hold"),
    ("name-of-nothing", _doc(_set("X", value="nope")), valid_members(),
     "X: names 'nope', which the archive does not hold"),
    ("unnamed-member", npz_doc(), valid_members(extra=np.zeros((1, 1))),
     "member 'extra': not named by scenario.json (an .attn.npz holds only the arrays its "
     "document names)"),
    ("named-twice", _doc(_set("heads", "W_V", value="heads.W_K")), valid_members(),
     "heads.W_V: names 'heads.W_K', as heads.W_K does"),
    ("names-the-document", _doc(_set("X", value="scenario.json")), valid_members(),
     "X: names scenario.json, the document, not an array"),
    ("inline-matrix", _doc(_set("X", value=X.tolist())), valid_members(),
     "X: expected the name of an array in the archive, got [[0.9, 0.1, -0.3, 0.2], [0.2, 0.8, "
     "0.4,…"),
    ("heads-as-list", _doc(_set("heads", value=[{"W_Q": "heads.W_Q"}])), valid_members(),
     'heads: expected an object naming the per-head stacks, e.g. {"W_Q": "heads.W_Q", ...}'),
    ("float32", npz_doc(), valid_members(X=X.astype(np.float32)),
     "X: holds float32 values; expected float64"),
    ("int64", npz_doc(), valid_members(W_O=np.zeros((4, 4), dtype=np.int64)),
     "W_O: holds int64 values; expected float64"),
    ("complex", npz_doc(), valid_members(X=X.astype(complex)),
     "X: holds complex128 values; expected float64"),
    ("ndim-2-for-3", npz_doc(), valid_members(heads_dot_W_Q=W_Q[0]),
     "heads.W_Q: expected 3-D (heads × d_model × d_k), got 4×2"),
    ("ndim-0", npz_doc(), valid_members(X=np.float64(1.0)),
     "X: expected 2-D (n × d_model), got a single number"),
    ("rows-for-tokens", npz_doc(), valid_members(X=X[:3]), "X: expected 4×4, got 3×4"),
    ("d_model", npz_doc(), valid_members(heads_dot_W_K=W_K[:, :3]),
     "heads.W_K: expected 2×4×2, got 2×3×2"),
    ("head-count", npz_doc(), valid_members(heads_dot_W_V=W_V[:1]),
     "heads.W_V: expected 2×4×2, got 1×4×2"),
    ("W_O-shape", npz_doc(), valid_members(W_O=W_O[:, :3]), "W_O: expected 4×4, got 4×3"),
    ("empty", npz_doc(), valid_members(X=np.zeros((0, 4))), "X: a 0×4 array holds no numbers"),
    ("nan", npz_doc(), valid_members(X=with_nan), "X[2,3]: nan is not a finite number"),
    ("inf", npz_doc(), valid_members(heads_dot_W_Q=with_inf),
     "heads[2].W_Q[4,1]: -inf is not a finite number"),
    ("too-large", npz_doc(), valid_members(W_O=W_O * 1e7),
     "W_O[1,1]: 5000000.0 exceeds ±1e+06"),
    ("huge-declared-shape", npz_doc(), valid_members(X=_header((10**6, 10**6))),
     "member 'X': its header declares 1000000×1000000 float64 values (8,000,000,000,000 "
     "bytes), the member holds 0"),
    ("declared-short", npz_doc(), valid_members(X=_header((4, 4), body=b"\0" * 100)),
     "member 'X': its header declares 4×4 float64 values (128 bytes), the member holds 100"),
    ("negative-shape", npz_doc(), valid_members(X=_header((-4, 4))),
     "member 'X': not a .npy array: shape (-4, 4)"),
    ("junk-npy", npz_doc(), valid_members(X=b"not an array at all"),
     "member 'X': not a .npy array: the magic string is not correct; expected b'\\x93NUMPY', "
     "got b'not an'"),
    ("npy-version-3", npz_doc(), valid_members(X=b"\x93NUMPY\x03\x00" + b"\0" * 40),
     "member 'X': not a .npy array: format version 3.0 is not supported"),
    ("long-header", npz_doc(),
     valid_members(X=b"\x93NUMPY\x02\x00" + (100_000).to_bytes(4, "little") + b" " * 64),
     "member 'X': not a .npy array: a header of 100,000 bytes (at most 10,000)"),
    ("no-document", None, valid_members(), "no scenario.json member: not an attnviz scenario "
     "archive"),
    ("document-not-json", b"{not json", valid_members(),
     "scenario.json: not valid JSON: Expecting property name enclosed in double quotes at "
     "line 1, column 2"),
    ("document-not-utf8", b'{"a": "\xff"}', valid_members(),
     "scenario.json: not UTF-8 text (byte 8)"),
    ("document-counts", b"[" * 10_000_000, valid_members(),
     f"10,000,000 lists and objects; a scenario within the limits has at most "
     f"{F._most_containers():,}"),
    ("v1-bias", _doc(_set("heads", "b_Q", value="heads.b_Q")),
     valid_members(heads_dot_b_Q=np.zeros((2, 2))),
     "heads.b_Q: needs version 2 (the file says 1)"),
    ("v2-provenance", {**npz_doc(2), "provenance": {}}, valid_members(),
     "provenance: needs version 3 (the file says 2)"),
    ("version-7", npz_doc(7), valid_members(),
     "version: 7 is not supported (this attnviz reads 1, 2, 3, 4, 5 and 6)"),
    ("vector-shape", _doc(lambda d: (d.update(version=2), d["heads"].update(b_K="heads.b_K"))),
     valid_members(heads_dot_b_K=np.zeros((2, 3))), "heads.b_K: expected 2×2, got 2×3"),
    ("mask-values",
     _doc(lambda d: (d.update(version=2), d["settings"].update(mask="custom",
                                                               mask_matrix="settings.mask_matrix"))),
     valid_members(settings_dot_mask_matrix=np.full((4, 4), 0.5)),
     "settings.mask_matrix[1,1]: 0.5 is not 0 or 1"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("doc", "members", "message"), [pytest.param(d, m, msg, id=i) for i, d, m, msg in HOSTILE]
)
def test_a_hostile_archive_gets_one_clear_message(tmp_path, doc, members, message):
    path = tmp_path / "bad.attn.npz"
    write_archive(path, doc, members)
    before = path.read_bytes()
    assert refusal(path) == message
    assert path.read_bytes() == before


class Touch:
    """Unpickling this would create a file; no loader may ever do it."""

    marker: pathlib.Path

    def __reduce__(self) -> tuple:
        return (pathlib.Path.touch, (self.marker,))


def test_object_arrays_are_refused_and_never_unpickled(tmp_path):
    Touch.marker = tmp_path / "unpickled"
    buffer = io.BytesIO()
    np.save(buffer, np.array([[Touch()]], dtype=object), allow_pickle=True)
    path = tmp_path / "o.attn.npz"
    write_archive(path, npz_doc(), valid_members(X=buffer.getvalue()))
    assert refusal(path) == "member 'X': holds Python objects (pickles are never loaded)"
    assert not Touch.marker.exists()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "not an .attn.npz archive (not a zip file)"),
        (b"hello world", "not an .attn.npz archive (not a zip file)"),
        (b"\x93NUMPY\x01\x00", "not an .attn.npz archive (not a zip file)"),
        (b"PK\x03\x04" + b"\0" * 100, "damaged or cut short: the zip index at its end is missing"),
    ],
)
def test_what_is_not_a_zip_is_refused(tmp_path, content, message):
    (tmp_path / "n.attn.npz").write_bytes(content)
    assert refusal(tmp_path / "n.attn.npz") == message


@pytest.mark.parametrize("keep", [0.25, 0.5, 0.9, 0.999])
def test_an_archive_cut_short_is_refused(tmp_path, keep):
    path = tmp_path / "cut.attn.npz"
    save_scenario(path, rich())
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])
    assert refusal(path) == "damaged or cut short: the zip index at its end is missing"
    path.write_bytes(data[:-1])
    assert refusal(path) == "damaged or cut short: the zip index at its end is missing"


def _central_entry(data: bytes, name: str) -> int:
    """Where the central-directory entry for name starts."""
    at = data.find(b"PK\x01\x02")
    while at >= 0:
        length = struct.unpack_from("<H", data, at + 28)[0]
        if data[at + 46 : at + 46 + length].decode() == name:
            return at
        at = data.find(b"PK\x01\x02", at + 4)
    raise AssertionError(name)


def test_a_flipped_byte_is_caught_by_the_checksum(tmp_path):
    path = tmp_path / "flip.attn.npz"
    write_archive(path, npz_doc(), valid_members())
    data = bytearray(path.read_bytes())
    at = bytes(data).find(X.tobytes())
    data[at + 13] ^= 0x01  # a low bit of a mantissa: still a finite number
    path.write_bytes(bytes(data))
    assert refusal(path) == "member 'X': damaged (its CRC-32 checksum does not match)"


def test_a_member_whose_index_sizes_run_past_the_end_is_cut_short(tmp_path):
    path = tmp_path / "past.attn.npz"
    write_archive(path, npz_doc(), valid_members())
    data = bytearray(path.read_bytes())
    at = _central_entry(bytes(data), "W_O.npy")
    size = struct.unpack_from("<L", data, at + 20)[0] + 10**6
    struct.pack_into("<LL", data, at + 20, size, size)
    path.write_bytes(bytes(data))
    assert refusal(path) == "member 'W_O': cut short"


def test_a_zip_bomb_is_refused_before_anything_is_unpacked(tmp_path, monkeypatch):
    """A member whose index says it unpacks to 3 GiB is refused from the index alone."""
    path = tmp_path / "bomb.attn.npz"
    write_archive(path, npz_doc(), valid_members(), method=zipfile.ZIP_DEFLATED)
    data = bytearray(path.read_bytes())
    struct.pack_into("<L", data, _central_entry(bytes(data), "X.npy") + 24, 3 * 2**30)
    path.write_bytes(bytes(data))
    monkeypatch.setattr(zipfile.ZipFile, "open", None)  # nothing is opened, let alone read
    assert refusal(path) == (
        "member 'X': unpacks to 3072 MiB; an .attn.npz unpacks to at most 2048 MiB in all"
    )


def test_members_that_unpack_past_the_limit_together_are_refused(tmp_path, monkeypatch):
    path = tmp_path / "sum.attn.npz"
    members = {"a": np.zeros(1000), "b": np.zeros(1000)}  # 8 KiB each, deflated to little
    write_archive(path, npz_doc(), members, method=zipfile.ZIP_DEFLATED)
    assert path.stat().st_size < 2000
    monkeypatch.setattr(npz_files, "MAX_NPZ_BYTES", 10_000)  # the file and each member fit
    assert refusal(path) == (
        "member 'b': unpacks to 7 KiB; an .attn.npz unpacks to at most 9 KiB in all"
    )


def test_a_deflated_member_is_inflated_only_as_far_as_its_header(tmp_path):
    """64 MiB of zeros in 64 KiB: refused after reading its first kilobytes."""
    path = tmp_path / "zeros.attn.npz"
    write_archive(path, npz_doc(), valid_members(X=b"\0" * 64 * 2**20), method=zipfile.ZIP_DEFLATED)
    assert path.stat().st_size < 2**20
    tracemalloc.start()
    try:
        message = refusal(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert message.startswith("member 'X': not a .npy array: the magic string is not correct")
    assert peak < 4 * 2**20


def test_a_huge_declared_shape_allocates_nothing(tmp_path):
    path = tmp_path / "tera.attn.npz"
    write_archive(path, npz_doc(), valid_members(W_O=_header((2**40, 2**40))))
    tracemalloc.start()
    try:
        message = refusal(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert message.startswith("member 'W_O': its header declares 1099511627776×1099511627776")
    assert peak < 2**20


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        ({"readme.txt": b"hi"}, "member 'readme.txt': not an .npy array (an .attn.npz holds "
         "scenario.json and the arrays it names)"),
        ({f"m{i}.npy": b"" for i in range(40)}, "46 members; an .attn.npz holds at most 32"),
    ],
)  # fmt: skip
def test_other_entries_are_refused(tmp_path, entries, message):
    write_archive(tmp_path / "e.attn.npz", npz_doc(), valid_members(), entries=entries)
    assert refusal(tmp_path / "e.attn.npz") == message


def test_a_member_twice_is_refused(tmp_path):
    path = tmp_path / "twice.attn.npz"
    write_archive(path, npz_doc(), valid_members())
    with pytest.warns(UserWarning, match="Duplicate name"), zipfile.ZipFile(path, "a") as z:
        z.writestr("X.npy", npy(X + 1))
    assert refusal(path) == "member 'X': appears twice"


def test_compression_other_than_deflate_is_refused(tmp_path):
    path = tmp_path / "bz.attn.npz"
    write_archive(path, npz_doc(), valid_members(), method=zipfile.ZIP_BZIP2)
    assert refusal(path) == (
        "member 'scenario.json': compressed by method 12; attnviz reads stored and deflated members"
    )


def test_a_named_pipe_is_refused_at_once(tmp_path):
    if not hasattr(os, "mkfifo"):
        pytest.skip("no named pipes here")
    os.mkfifo(tmp_path / "p.attn.npz")
    with pytest.raises(FileFormatError) as e:
        load_scenario(tmp_path / "p.attn.npz")
    assert (
        str(e.value) == f"{tmp_path / 'p.attn.npz'}: cannot read: a named pipe, not a regular file"
    )


def _valid_npz_bytes() -> bytes:
    with tempfile.TemporaryDirectory() as folder:
        path = pathlib.Path(folder) / "v.attn.npz"
        save_scenario(path, rich())
        return path.read_bytes()


VALID = _valid_npz_bytes()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    edits=st.lists(
        st.tuples(st.integers(0, len(VALID) - 1), st.integers(0, 255)), min_size=1, max_size=8
    ),
    cut=st.one_of(st.none(), st.integers(0, len(VALID))),
)
def test_fuzz_damaged_archives_load_or_are_refused(edits, cut):
    data = bytearray(VALID)
    for at, value in edits:
        data[at] = value
    with tempfile.TemporaryDirectory() as folder:
        path = pathlib.Path(folder) / "f.attn.npz"
        path.write_bytes(bytes(data[:cut]))
        try:
            s = load_scenario(path)
        except FileFormatError as e:
            assert str(e).startswith("f.attn.npz: ") and "\n" not in str(e)
        else:
            assert isinstance(s, Scenario)


# Atomic saves ---------------------------------------------------------------------------


def _failing(exc: BaseException) -> Callable[..., None]:
    def fail(*args: object, **kwargs: object) -> None:
        raise exc

    return fail


@pytest.mark.parametrize("stage", ["fsync", "replace"])
def test_a_failed_save_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch, stage):
    path = tmp_path / "s.attn.npz"
    path.write_bytes(b"the previous contents")
    monkeypatch.setattr(F.os, stage, _failing(OSError(errno.ENOSPC, "No space left")))
    with pytest.raises(OSError):
        save_scenario(path, rich())
    monkeypatch.undo()
    assert path.read_bytes() == b"the previous contents"
    assert os.listdir(tmp_path) == ["s.attn.npz"]


def test_an_interrupt_while_streaming_the_members_leaves_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "s.attn.npz"
    save_scenario(path, worked())
    old = path.read_bytes()
    calls = []
    real = np.lib.format.write_array_header_1_0

    def header(*args: Any) -> None:
        calls.append(1)
        if len(calls) == 4:  # the document and two arrays are already in the temp file
            raise KeyboardInterrupt
        real(*args)

    monkeypatch.setattr(np.lib.format, "write_array_header_1_0", header)
    with pytest.raises(KeyboardInterrupt):
        save_scenario(path, rich())
    monkeypatch.undo()
    assert path.read_bytes() == old
    assert os.listdir(tmp_path) == ["s.attn.npz"]


def test_a_save_writes_a_temporary_file_then_renames_it(tmp_path, monkeypatch):
    path = tmp_path / "s.attn.npz"
    seen = []
    real = os.replace

    def spy(src: Any, dst: Any) -> None:
        seen.append((os.path.dirname(os.fspath(src)), pathlib.Path(src).read_bytes()[:4]))
        real(src, dst)

    monkeypatch.setattr(F.os, "replace", spy)
    save_scenario(path, worked())
    assert seen == [(str(tmp_path), b"PK\x03\x04")]


# Provenance in .attn.json: format version 3 --------------------------------------------


def provenance_doc(**changes: Any) -> dict[str, Any]:
    doc = worked_doc(3)
    doc["provenance"] = copy.deepcopy(PROVENANCE)
    doc["provenance"].update(changes)
    return doc


def test_a_provenance_loads_from_a_version_3_document():
    s = scenario_from_dict(provenance_doc())
    p = s.provenance
    assert (p.source, p.kind, p.model_type, p.layer, p.layers) == (
        "openai-community/gpt2",
        "hub",
        "gpt2",
        3,
        12,
    )
    assert p.text == PROVENANCE["text"] and p.token_ids == (3347, 2497, 262, 3797)
    assert p.files == (("model.safetensors", SHA), ("config.json", "f" * 64))
    assert same_bits(p.model_weights, WEIGHTS) and same_bits(p.model_output, OUTPUT)
    assert same_bits(s.X, X) and same_bits(s.W_O, W_O)


def test_a_provenance_round_trips_through_json_exactly(tmp_path):
    s = dataclasses.replace(worked(), provenance=provenance())
    path = tmp_path / "p.attn.json"
    save_scenario(path, s)
    doc = json.loads(path.read_text("utf-8"))
    assert doc["version"] == 3
    assert doc["provenance"] == PROVENANCE  # lists of lists, ints, an object of files
    assert list(doc) == [*worked_doc(), "provenance"]
    back = load_scenario(path)
    assert_same_scenario(back, s)
    # bit for bit, −0.0 and subnormals included
    assert np.signbit(back.provenance.model_output[0, 1])
    assert back.provenance.model_output[0, 3] == 5e-324


def test_provenance_round_trips_with_every_optional_part_in_both_forms(tmp_path):
    s = rich()
    for name in ("r.attn.json", "r.attn.npz"):
        save_scenario(tmp_path / name, s)
        back = load_scenario(tmp_path / name)
        assert same_bits(back.provenance.model_output, s.provenance.model_output)
        assert back.provenance.token_ids == s.provenance.token_ids


def test_snapshots_keep_the_provenance(tmp_path):
    s = rich()
    save_snapshot(tmp_path / "snap.npz", s)
    assert_same_scenario(load_snapshot(tmp_path / "snap.npz"), s)
    plain = worked()
    save_snapshot(tmp_path / "plain.npz", plain)
    assert load_snapshot(tmp_path / "plain.npz").provenance is None


def test_scenarios_without_provenance_save_as_before():
    assert json.loads(scenario_to_json(worked()))["version"] == 1
    v2 = worked().with_settings(positional="rope")
    assert json.loads(scenario_to_json(v2))["version"] == 2
    assert "provenance" not in json.loads(scenario_to_json(v2))


def test_version_1_and_2_files_load_unchanged(tmp_path):
    v1 = tmp_path / "v1.attn.json"
    v1.write_text(json.dumps(worked_doc(1), indent=1), "utf-8")
    s = load_scenario(v1)
    assert_same_scenario(s, worked())
    v2_doc = worked_doc(2)
    v2_doc["kv_heads"] = [{"W_K": W_K[0].tolist(), "W_V": W_V[0].tolist()}]
    for head in v2_doc["heads"]:
        del head["W_K"], head["W_V"]
    v2_doc["b_O"] = [0.5, -0.0, 0.25, 1.0]
    v2_doc["settings"]["positional"] = "rope"
    v2 = tmp_path / "v2.attn.json"
    v2.write_text(json.dumps(v2_doc), "utf-8")
    s = load_scenario(v2)
    assert s.kv_heads == 1 and same_bits(s.W_K, W_K[:1]) and same_bits(s.W_V, W_V[:1])
    assert s.b_O[0].tolist() == [0.5, -0.0, 0.25, 1.0] and s.provenance is None
    assert json.loads(scenario_to_json(s))["version"] == 2


def test_text_that_looks_like_a_matrix_row_stays_text():
    """ ",[1, 2]" inside a string is not a row of numbers (labels and provenance text)."""
    doc = provenance_doc(text='f(a, [1, 2]), [3]\\"[4]')
    doc["tokens"] = [",[1]", "[2, 3]", 'x\\",[5]', "cat"]
    s = scenario_from_json(json.dumps(doc))
    assert s.tokens == (",[1]", "[2, 3]", 'x\\",[5]', "cat")
    assert s.provenance.text == 'f(a, [1, 2]), [3]\\"[4]'
    assert scenario_from_json(scenario_to_json(s)).tokens == s.tokens


def _without(key: str) -> dict[str, Any]:
    doc = provenance_doc()
    del doc["provenance"][key]
    return doc


def _ragged() -> dict[str, Any]:
    doc = provenance_doc()
    doc["provenance"]["model_weights"][1][2] = [0.5, 0.5]
    return doc


BAD_PROVENANCE = [
    ("token-id-text", provenance_doc(token_ids=[1, 2, "x", 4]),
     "provenance.token_ids[3]: expected a token id (a whole number from 0 to 2^63 − 1), got 'x'"),
    ("token-id-negative", provenance_doc(token_ids=[1, 2, -1, 4]),
     "provenance.token_ids[3]: expected a token id (a whole number from 0 to 2^63 − 1), got -1"),
    ("token-id-bool", provenance_doc(token_ids=[1, 2, True, 4]),
     "provenance.token_ids[3]: expected a token id (a whole number from 0 to 2^63 − 1), got True"),
    ("token-id-float", provenance_doc(token_ids=[1, 2, 3.0, 4]),
     "provenance.token_ids[3]: expected a token id (a whole number from 0 to 2^63 − 1), got 3.0"),
    ("token-id-huge", provenance_doc(token_ids=[1, 2, 2**64, 4]),
     "provenance.token_ids[3]: expected a token id (a whole number from 0 to 2^63 − 1), got "
     "18446744073709551616"),
    ("token-ids-count", provenance_doc(token_ids=[1, 2, 3]),
     "provenance.token_ids: 3 ids for 4 tokens"),
    ("token-ids-not-list", provenance_doc(token_ids="1 2 3 4"),
     "provenance.token_ids: expected a list of token ids, got '1 2 3 4'"),
    ("layer-text", provenance_doc(layer="3"),
     "provenance.layer: expected a whole number from 0 to 11, got '3'"),
    ("layers-bool", provenance_doc(layers=True),
     "provenance.layers: expected a whole number from 1 to 100,000, got True"),
    ("layer-past-layers", provenance_doc(layer=12),
     "provenance.layer: expected a whole number from 0 to 11, got 12"),
    ("no-layers", provenance_doc(layer=0, layers=0),
     "provenance.layers: expected a whole number from 1 to 100,000, got 0"),
    ("kind", provenance_doc(kind="s3"),
     "provenance.kind: 's3'; expected one of ('folder', 'cache', 'package', 'hub')"),
    ("source-number", provenance_doc(source=7), "provenance.source: expected text, got 7"),
    ("text-surrogate", provenance_doc(text="caf\udce9"),
     "provenance.text: holds U+DCE9, a lone surrogate (not text)"),
    ("text-too-long", provenance_doc(text="x" * (2**19 + 1)),
     "provenance.text: 524,289 characters; the limit is 524,288"),
    ("files-list", provenance_doc(files=[["model.safetensors", SHA]]),
     "provenance.files: expected an object (file name: SHA-256), got [['model.safetensors', "
     "'0123456789abcde…"),
    ("files-digest", provenance_doc(files={"model.safetensors": "abc"}),
     "provenance.files['model.safetensors']: not a SHA-256 in hex"),
    ("files-digest-number", provenance_doc(files={"model.safetensors": 5}),
     "provenance.files['model.safetensors']: expected text, got 5"),
    ("unknown", provenance_doc(colour="red"), "provenance.colour: unknown field"),
    ("missing", _without("files"), "provenance.files: missing"),
    ("not-object", {**worked_doc(3), "provenance": "gpt2"}, "provenance: expected an object"),
    ("weights-ragged", _ragged(), "provenance.model_weights[2]: row 3 has 2 numbers, row 1 has 4"),
    ("weights-2d", provenance_doc(model_weights=WEIGHTS[0].tolist()),
     "provenance.model_weights[1]: expected a non-empty list of rows"),
    ("weights-range", provenance_doc(model_weights=(WEIGHTS * 2).tolist()),
     "provenance.model_weights: attention weights lie in [0, 1]"),
    ("weights-not-square", provenance_doc(model_weights=WEIGHTS[:, :3].tolist()),
     "provenance.model_weights: expected heads × n × n, got 2×3×4"),
    ("output-rows", provenance_doc(model_output=OUTPUT[:3].tolist()),
     "provenance.model_output: expected 4 rows (one per token), got 3×4"),
    ("v2-file", {**provenance_doc(), "version": 2},
     "provenance: needs version 3 (the file says 2)"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("doc", "message"), [pytest.param(d, m, id=i) for i, d, m in BAD_PROVENANCE]
)
def test_a_bad_provenance_names_its_field(tmp_path, doc, message):
    with pytest.raises(FileFormatError) as e:
        scenario_from_json(json.dumps(doc))
    assert str(e.value) == message
    path = tmp_path / "bad.attn.json"
    path.write_text(json.dumps(doc), "utf-8")
    assert refusal(path) == message


@pytest.mark.parametrize(
    ("literal", "cell"), [("NaN", "nan"), ("Infinity", "inf"), ("-Infinity", "-inf")]
)
def test_non_finite_model_numbers_name_their_cell(literal, cell):
    text = json.dumps(provenance_doc()).replace("1000000000.0", literal)
    with pytest.raises(FileFormatError) as e:
        scenario_from_json(text)
    assert str(e.value) == f"provenance.model_output[2,4]: {cell} is not a finite number"


def test_a_bad_provenance_in_an_npz_names_its_field(tmp_path):
    doc = npz_doc(3)
    doc["provenance"] = {
        **PROVENANCE,
        "token_ids": [1, 2, -3, 4],
        "model_weights": "provenance.model_weights",
        "model_output": "provenance.model_output",
    }
    members = valid_members(
        provenance_dot_model_weights=WEIGHTS, provenance_dot_model_output=OUTPUT
    )
    write_archive(tmp_path / "p.attn.npz", doc, members)
    assert refusal(tmp_path / "p.attn.npz") == (
        "provenance.token_ids[3]: expected a token id (a whole number from 0 to 2^63 − 1), got -3"
    )
    doc["provenance"]["token_ids"] = [1, 2, 3, 4]
    nan = OUTPUT.copy()
    nan[2, 1] = np.nan
    members["provenance.model_output"] = nan
    write_archive(tmp_path / "p.attn.npz", doc, members)
    assert refusal(tmp_path / "p.attn.npz") == (
        "provenance.model_output[3,2]: nan is not a finite number"
    )
    members["provenance.model_output"] = OUTPUT
    members["provenance.model_weights"] = WEIGHTS[:, :, :3]
    write_archive(tmp_path / "p.attn.npz", doc, members)
    assert refusal(tmp_path / "p.attn.npz") == (
        "provenance.model_weights: expected heads × n × n, got 2×4×3"
    )
    members["provenance.model_weights"] = WEIGHTS
    write_archive(tmp_path / "p.attn.npz", doc, members)
    assert load_scenario(tmp_path / "p.attn.npz").provenance.token_ids == (1, 2, 3, 4)


def test_the_json_counts_allow_the_longest_provenance_text():
    s = dataclasses.replace(worked(), provenance=provenance(text='[{"' * (2**19 // 3)))
    text = scenario_to_json(s)
    assert scenario_from_json(text).provenance.text == s.provenance.text


def test_crc_is_what_zipfile_itself_checks(tmp_path):
    """The reader's own CRC check agrees with zipfile's on what attnviz writes."""
    save_scenario(tmp_path / "c.attn.npz", rich())
    with zipfile.ZipFile(tmp_path / "c.attn.npz") as z:
        assert z.testzip() is None
        for info in z.infolist():
            assert zlib.crc32(z.read(info)) == info.CRC
