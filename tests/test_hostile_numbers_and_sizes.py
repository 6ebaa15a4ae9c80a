"""Hostile input, second round (issue 36), for the file readers: every number read from a
file is range-checked where it is read, every size is bounded before it is allocated
(zip64 end records, autosave snapshots), and a path that is not a file is named.

Each attack is built small in tmp_path. The autosave bomb's peak memory is measured in a
subprocess (its own ru_maxrss before and after the load).
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import warnings
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hostile_files import write_snapshot_bomb

import attnviz
from attnviz.cli import main
from attnviz.core.io import files as F
from attnviz.core.io.files import FileFormatError
from attnviz.core.presets import worked_example

ROOT = Path(attnviz.__file__).resolve().parents[1]


def v2_document(**settings: Any) -> dict[str, Any]:
    d = F.scenario_to_dict(worked_example())  # 2 heads, 4 tokens
    d["version"] = 2
    d["settings"].update(settings)
    return d


def refusal(d: dict[str, Any], binary: bool, tmp_path: Path) -> str:
    """The message of loading d, saved as text or as .attn.npz (bypassing the writer's
    checks: the document is written as it is)."""
    if binary:
        document, members = F.scenario_to_npz_parts(worked_example())
        document.update({k: v for k, v in d.items() if k in ("version", "settings")})
        if "provenance" in d:
            document["provenance"] = d["provenance"]
        path = tmp_path / "s.attn.npz"
        from attnviz.core.io.npz_files import write_npz

        with open(path, "wb") as f:
            write_npz(f, document, members)
    else:
        path = tmp_path / "s.attn.json"
        path.write_text(json.dumps(d), "utf-8")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a value may not get as far as a RuntimeWarning
        with pytest.raises(FileFormatError) as e:
            F.load_scenario(path)
    return str(e.value).removeprefix(f"{path.name}: ")


# Every number of the settings: hostile values are refused by name, whatever the form ----

HUGE = 10**400  # too large for a float: float() of it raises OverflowError
SETTINGS_NUMBERS = {  # a setting: values to refuse (each reads fine as JSON)
    "dropout": [HUGE, -HUGE, 1.0, -1e-320, float("nan")],
    "dropout_seed": [HUGE, -1, 2**32, 1.5],
    "window": [HUGE, 0, 2049, 3.0],
    "rope_base": [HUGE, 1.0, float("inf"), 1e10],
    "rope_dims": [HUGE, 0, 514, 2.0],
    "scale_value": [HUGE, 0.0, -1e-320, float("nan")],
    "qk_norm_eps": [HUGE, 0.0, 1.5, -HUGE],
    "softcap": [HUGE, 1e-320, 5e-324, 1e-7, 0.0, float("-inf")],
    "sinks": [[HUGE, 0], [0, -HUGE], [float("nan"), 0], [1e5, 0], [True, 0]],
    "alibi_slopes": [[HUGE, 0], [0.5, 1e300]],
    "ablated": [[HUGE], [0], [129], [1.0]],
}
CASES = [(k, v) for k, values in SETTINGS_NUMBERS.items() for v in values]


@pytest.mark.parametrize("binary", [False, True], ids=["json", "npz"])
@pytest.mark.parametrize(("name", "value"), CASES, ids=[f"{k}={v!r:.12}" for k, v in CASES])
def test_every_setting_number_out_of_range_is_refused_by_name(name, value, binary, tmp_path):
    extra = {"positional": "alibi"} if name == "alibi_slopes" else {}
    message = refusal(v2_document(**{name: value}, **extra), binary, tmp_path)
    assert message.startswith(f"settings.{name}"), message
    assert "expected" in message and len(message) < 160, message


def test_a_soft_cap_so_small_it_overflows_is_refused_on_the_command_line(tmp_path, capsys):
    path = tmp_path / "tiny.attn.json"
    path.write_text(json.dumps(v2_document(softcap=1e-320)), "utf-8")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rc = main(["compute", str(path)])
    assert rc == 2
    assert capsys.readouterr().err == (
        "attnviz: tiny.attn.json: settings.softcap: expected a number in [1e-06, 1e+09], "
        "got 1e-320\n"
    )


def test_the_smallest_soft_cap_allowed_computes_without_warnings(tmp_path, capsys):
    path = tmp_path / "small.attn.json"
    path.write_text(json.dumps(v2_document(softcap=1e-6)), "utf-8")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert main(["compute", str(path), "--format", "json"]) == 0
    weights = np.array(json.loads(capsys.readouterr().out)["heads"][0]["weights"], dtype=float)
    assert np.isfinite(weights).all()


def test_values_at_the_ends_of_each_range_load():
    for settings in (
        {"dropout": 0, "dropout_seed": 2**32 - 1, "window": 2048, "mask": "sliding-window"},
        {"rope_base": 1e9, "positional": "rope", "rope_dims": 2, "scale_value": 1e9},
        {"qk_norm": "rms", "qk_norm_eps": 1.0, "softcap": 1e9, "sinks": [-1e4, 10000]},
        {"positional": "alibi", "alibi_slopes": [0, -1e4], "ablated": [2, 1]},
    ):
        s = F.scenario_from_json(json.dumps(v2_document(**settings)))
        assert (
            F.settings_to_dict(s.settings).items()
            >= {k: v for k, v in settings.items() if k not in ("ablated", "dropout")}.items()
        )


def test_a_whole_number_of_thousands_of_digits_is_named_not_printed():
    with pytest.raises(FileFormatError) as e:
        F.settings_from_dict({"window": 10**5000})
    assert str(e.value) == (
        "settings.window: expected a whole number from 1 to 2,048, "
        "got a whole number of about 5,000 digits"
    )


# The provenance's numbers ----------------------------------------------------------------


def provenance_document(**fields: Any) -> dict[str, Any]:
    s = worked_example()
    d = F.scenario_to_dict(s)
    d["version"] = 3
    d["provenance"] = {
        "source": "m",
        "kind": "folder",
        "model_type": "bert",
        "layer": 0,
        "layers": 2,
        "text": "she saw the cat",
        "token_ids": [1, 2, 3, 4],
        "model_weights": [np.full((4, 4), 0.25).tolist()] * 2,
        "model_output": np.zeros((4, 4)).tolist(),
        "files": {},
        **fields,
    }
    return d


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {"layer": 0, "layers": 0},
            "provenance.layers: expected a whole number from 1 to 100,000, got 0",
        ),
        ({"layer": 2, "layers": 2}, "provenance.layer: expected a whole number from 0 to 1, got 2"),
        (
            {"layers": HUGE},
            "provenance.layers: expected a whole number from 1 to 100,000, got 1000",
        ),
        ({"token_ids": [1, 2, HUGE, 4]}, "provenance.token_ids[3]: expected a token id (a whole"),
    ],
    ids=["no-layers", "layer-past-the-last", "huge-layers", "huge-token-id"],
)
def test_the_provenance_numbers_are_range_checked_by_name(fields, message):
    with pytest.raises(FileFormatError) as e:
        F.scenario_from_json(json.dumps(provenance_document(**fields)))
    assert str(e.value).startswith(message), str(e.value)


# zip64 end records: the same member-count and index-size limits -----------------------


def with_zip64_end(data: bytes, entries: int | None = None, index: int | None = None) -> bytes:
    """data (a zip with no comment) with a zip64 end record and locator put before its
    classic end record, as zipfile writes them for large archives; the zip64 record
    holds the real counts unless entries or index say otherwise."""
    end = len(data) - 22
    assert data[end : end + 4] == b"PK\x05\x06"
    real_entries, real_index, offset = struct.unpack_from("<HLL", data, end + 10)
    n = real_entries if entries is None else entries
    size = real_index if index is None else index
    record = struct.pack("<4sQHHIIQQQQ", b"PK\x06\x06", 44, 45, 45, 0, 0, n, n, size, offset)
    locator = struct.pack("<4sIQI", b"PK\x06\x07", 0, end, 1)
    return data[:end] + record + locator + data[end:]


@pytest.fixture
def npz_bytes(tmp_path: Path) -> bytes:
    path = tmp_path / "w.attn.npz"
    F.save_scenario(path, worked_example())
    return path.read_bytes()


def test_a_zip64_end_record_with_the_real_counts_loads(npz_bytes, tmp_path):
    path = tmp_path / "z.attn.npz"
    path.write_bytes(with_zip64_end(npz_bytes))
    with zipfile.ZipFile(path) as z:  # zipfile takes its counts from the zip64 record
        assert len(z.infolist()) == struct.unpack_from("<H", npz_bytes, len(npz_bytes) - 12)[0]
    assert F.load_scenario(path).tokens == worked_example().tokens


@pytest.mark.parametrize(
    ("claim", "message"),
    [
        (
            {"entries": 4_000_000, "index": 232_000_000},
            "z.attn.npz: 4,000,000 members; an .attn.npz holds at most 32 "
            "(4,096 with several layers)",
        ),
        ({"index": 232_000_000}, "z.attn.npz: damaged: its zip index says it is 232,000,000 bytes"),
    ],
    ids=["members", "index-size"],
)
def test_a_zip64_end_record_is_held_to_the_limits(npz_bytes, tmp_path, monkeypatch, claim, message):
    path = tmp_path / "z.attn.npz"
    path.write_bytes(with_zip64_end(npz_bytes, **claim))

    def no_zipfile(*args: object, **kwargs: object) -> None:
        raise AssertionError("zipfile read the index")

    monkeypatch.setattr(zipfile.ZipFile, "_RealGetContents", no_zipfile)
    with pytest.raises(FileFormatError) as e:
        F.load_scenario(path)
    assert str(e.value) == message


# The autosave: the same bounded reader as an .attn.npz --------------------------------


def test_an_autosave_bomb_is_refused_before_it_is_unpacked(tmp_path):
    path = tmp_path / "autosave.npz"
    write_snapshot_bomb(path, (8192, 4096))  # 256 MiB of zeros in about 1 MiB
    assert path.stat().st_size < 2 * 2**20
    code = (
        "import resource, sys\n"
        "from attnviz.core.io import files\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "try:\n"
        "    files.load_snapshot(sys.argv[1])\n"
        "except files.FileFormatError as e:\n"
        "    print(e)\n"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    message, grown_kib = done.stdout.strip().rsplit("\n", 1)
    assert message == (
        "autosave.npz: member 'X': 8192×4096; expected matrices of at most 16777216 cells"
    )
    assert int(grown_kib) < 64 * 2**10  # KiB: far less than the 256 MiB it unpacks to


def test_an_autosave_that_unpacks_past_the_npz_limit_is_refused(tmp_path, monkeypatch):
    path = tmp_path / "autosave.npz"
    write_snapshot_bomb(path, (64, 64))
    monkeypatch.setattr("attnviz.core.io.npz_files.MAX_NPZ_BYTES", 2**14)
    with pytest.raises(FileFormatError, match=r"^autosave\.npz: member 'X': unpacks to 32 KiB"):
        F.load_snapshot(path)


# A path that is not a file: named in one line -----------------------------------------


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_attnviz_on_what_is_not_a_file_names_what_it_is(tmp_path, capsys, kind):
    path = tmp_path / "p.attn.json"
    os.mkfifo(path) if kind == "fifo" else path.mkdir()
    what = "a named pipe" if kind == "fifo" else "a directory"
    assert main([str(path)]) == 2
    assert capsys.readouterr().err == f"attnviz: {path}: cannot read: {what}, not a regular file\n"


def test_attnviz_on_a_missing_file_still_says_no_such_file(tmp_path, capsys):
    assert main([str(tmp_path / "gone.attn.json")]) == 2
    assert capsys.readouterr().err == f"attnviz: {tmp_path / 'gone.attn.json'}: no such file\n"
