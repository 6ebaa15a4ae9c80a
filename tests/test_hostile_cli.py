"""Command-line answers that were silently wrong or misleading: cross-attention's key
columns in `explain`, float16 overflow in `tiles`, oversized JSON, and names that are
not text or are far too long."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from attnviz.cli import main
from attnviz.core.io.files import save_scenario
from attnviz.core.presets import make_preset

ROOT = Path(__file__).resolve().parents[1]


def run(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def softmax(a: np.ndarray) -> np.ndarray:
    e = np.exp(a - a.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def value_line(out: str) -> float:
    m = re.search(r"^  value = (\S+)$", out, re.M)
    assert m, out
    return float(m.group(1))


def test_explain_under_cross_attention_names_key_columns_among_the_keys(capsys):
    s = make_preset("cross-attention", None, None)
    X, X_kv = np.asarray(s.X), np.asarray(s.X_kv)
    Q, K = X @ np.asarray(s.W_Q)[0], X_kv @ np.asarray(s.W_K)[0]
    weights = softmax(Q @ K.T / np.sqrt(Q.shape[1]))
    keys = list(s.kv_tokens)
    code, out, _ = run(capsys, "explain", "--preset", "cross-attention", "--matrix", "weights",
                       "--head", "1", "--row", "the", "--col", "chat")  # fmt: skip
    assert code == 0
    assert value_line(out) == pytest.approx(weights[0, keys.index("chat")], abs=1e-6)
    # "cat" is a query token, not a key: refused, naming the keys
    code, _, err = run(capsys, "explain", "--preset", "cross-attention", "--matrix", "weights",
                       "--head", "1", "--row", "the", "--col", "cat")  # fmt: skip
    assert code == 2 and "'chat'" in err and "'le'" in err
    # K's rows are keys too
    code, out, _ = run(capsys, "explain", "--preset", "cross-attention", "--matrix", "K",
                       "--head", "1", "--row", "assis", "--col", "2")  # fmt: skip
    assert code == 0 and value_line(out) == pytest.approx(K[keys.index("assis"), 1], abs=1e-6)


@pytest.fixture
def huge_x(tmp_path):
    s = make_preset("worked-example", None, None)
    s = dataclasses.replace(s, X=np.asarray(s.X) * 1e5)
    path = tmp_path / "huge.attn.json"
    save_scenario(path, s)
    return s, str(path)


def test_tiles_in_float16_reports_overflowed_rows_instead_of_zeros(capsys, huge_x):
    s, path = huge_x
    with np.errstate(over="ignore", invalid="ignore"):
        Q16, K16 = ((np.asarray(s.X) @ np.asarray(W)[0]).astype(np.float16) for W in (s.W_Q, s.W_K))
        S = Q16.astype(np.float32) @ K16.astype(np.float32).T
    # every query row meets a score float16 cannot hold among the keys it sees (causal)
    assert all(not np.isfinite(S[i, : i + 1]).all() for i in range(4))
    code, out, err = run(capsys, "tiles", path, "--precision", "float16", "--format", "json")
    assert code == 0 and not err  # no RuntimeWarning either
    doc = json.loads(out)
    assert doc["overflowed_rows"] == [1, 2, 3, 4]
    assert all(v is None for row in doc["output"] for v in row)  # not 0
    assert doc["lse"] == [None] * 4
    code, out, err = run(capsys, "tiles", path, "--precision", "float16")
    assert code == 0 and not err
    assert "rows 1 (she), 2 (saw), 3 (the), 4 (cat) overflowed in float16" in out
    assert "largest difference" not in out  # nothing left to compare


def test_tiles_without_overflow_reports_none(capsys):
    code, out, _ = run(capsys, "tiles", "--precision", "float16", "--format", "json")
    doc = json.loads(out)
    assert code == 0 and doc["overflowed_rows"] == []
    assert all(v is not None for row in doc["output"] for v in row)
    assert doc["max_error_vs_dense"] < 1e-2


def test_a_huge_example_name_is_not_echoed_whole(capsys):
    code, _, err = run(capsys, "compute", "--example", "x" * 100_000)
    assert code == 2 and err.count("\n") == 1 and len(err) < 1000
    assert "100,000 characters" in err and "worked-example" in err  # the list survives


@pytest.mark.parametrize(
    "args",
    [
        ["compute", "--mask", "y" * 100_000],
        ["explain", "--matrix", "weights", "--head", "1", "--row", "z" * 100_000, "--col", "1"],
        ["compute", "--preset", "p" * 100_000],
    ],
)
def test_every_message_about_a_huge_argument_stays_short(capsys, args):
    code, _, err = run(capsys, *args)
    assert code == 2 and err.count("\n") == 1 and len(err) < 1100
    assert "characters" in err


PEAK = """
import resource, sys
from attnviz.cli import main
code = main(sys.argv[1:])
sys.stderr.write(f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}\\n")
sys.exit(code)
"""


def peak_and_size(args: list[str]) -> tuple[int, int]:
    """The peak memory of attnviz with args, and the bytes it wrote on stdout."""
    done = subprocess.run(
        [sys.executable, "-c", PEAK, *args], capture_output=True,
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True,
    )  # fmt: skip
    return int(done.stderr.decode().split()[-1]), len(done.stdout)


@pytest.mark.parametrize("fmt", ["json", "text"])
def test_a_large_result_is_written_as_it_goes_not_held_as_text(fmt):
    base, _ = peak_and_size(["compute", "--preset", "gpt2-small", "--n", "8", "--format", fmt])
    peak, size = peak_and_size(["compute", "--preset", "gpt2-small", "--n", "384", "--format", fmt])
    assert size > 50 * 2**20  # the output is large …
    assert peak - base < 0.75 * size  # … and never held whole (it was 3-4 times its size)
