"""``attnviz examples`` and ``--example NAME`` on the commands that take a FILE.

The expected numbers are computed here from the brief's matrices (tests/reference.py),
not from attnviz."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import reference as ref

from attnviz.cli import main
from attnviz.core.examples import examples


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def test_examples_lists_each_under_its_group(capsys):
    rc, out, err = cli(capsys, "examples")
    assert rc == 0 and err == ""
    lines = out.splitlines()
    for e in examples():
        (line,) = [x for x in lines if x.split()[:1] == [e.name]]
        assert line.startswith("  ") and line.endswith(e.title)
        heading = lines.index(f"{e.section}:")
        assert heading < lines.index(line)
    assert lines[0] == "The worked example:"
    assert lines[-1].startswith("The files are in ") and "resources" in lines[-1]


def test_compute_an_example_by_name(capsys):
    """softcap: the worked example with X × 4; scores capped by 2·tanh(s/2)."""
    rc, out, err = cli(capsys, "compute", "--example", "softcap", "--format", "json")
    assert rc == 0 and err == ""
    got = json.loads(out)
    X = 4 * ref.X
    heads = []
    for h in range(2):
        Q, K, V = X @ ref.W_Q[h], X @ ref.W_K[h], X @ ref.W_V[h]
        capped = 2 * np.tanh(Q @ K.T / math.sqrt(2) / 2)
        capped[np.triu_indices(4, 1)] = -np.inf
        w = np.exp(capped - capped.max(axis=1, keepdims=True))
        w /= w.sum(axis=1, keepdims=True)
        np.testing.assert_allclose(got["heads"][h]["weights"], w, atol=1e-12)
        heads.append(w @ V)
    np.testing.assert_allclose(got["output"], np.hstack(heads) @ ref.W_O, atol=1e-12)
    assert max(abs(v) for row in got["heads"][0]["scaled"] for v in row) < 2


def test_an_example_takes_the_usual_overrides(capsys):
    rc, out, _ = cli(
        capsys, "compute", "--example", "stage-5-causal-mask", "--mask", "causal-zero", "--format",
        "json",
    )  # fmt: skip
    assert rc == 0
    leak = json.loads(out)["heads"][0]["leak"]
    assert leak[-1] == 0 and all(v > 0 for v in leak[:-1])  # the last row sees everything


@pytest.mark.parametrize(
    "argv",
    [
        ["explain", "--example", "sinks", "--matrix", "weights", "--head", "2", "--row", "2",
         "--col", "1"],
        ["code", "--example", "llama-style"],
        ["tiles", "--example", "stage-9-tiles"],
    ],
)  # fmt: skip
def test_the_other_commands_take_an_example(capsys, argv):
    rc, out, err = cli(capsys, *argv)
    assert rc == 0 and err == "" and out
    if argv[0] == "code":
        assert "# Exported from: 'llama-style'" in out


def test_export_an_example(capsys, tmp_path):
    out_path = tmp_path / "minilm.svg"
    rc, _, err = cli(
        capsys, "export", "--example", "minilm-layer-0.attn.npz", "--view", "weights", "--head",
        "12", "--out", str(out_path),
    )  # fmt: skip
    assert rc == 0, err
    assert out_path.read_text().count("<rect") >= 8 * 8  # every cell of the 8 × 8 weights


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--example", "nope"], "there is no example 'nope'; the examples are: worked-example,"),
        (["--example", "alibi", "--preset", "alibi"], "give one of FILE, --preset and --example"),
        (["x.attn.json", "--example", "alibi"], "give one of FILE, --preset and --example"),
        (["--example", "alibi", "--n", "8"], "--n and --seed apply to presets, not to files"),
    ],
)
def test_wrong_example_flags_say_what_is_wrong(capsys, argv, message):
    rc, out, err = cli(capsys, "compute", *argv)
    assert (rc, out) == (2, "")
    assert err.startswith(f"attnviz: {message}") and err.count("\n") == 1
