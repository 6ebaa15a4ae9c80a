"""The ``attnviz`` command: compute (text and JSON), presets, explain, and its errors.

Every expected number comes from the small NumPy reference below, written from the brief
with the worked example's matrices typed in here (not imported from attnviz.core.presets).
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import reference as ref

from attnviz.cli import main

# The brief's worked example, typed from ATTENTION_LAB.md. ------------------------------

TOKENS = ["she", "saw", "the", "cat"]
X = np.array(
    [
        [0.90, 0.10, -0.30, 0.20],
        [0.20, 0.80, 0.40, -0.50],
        [-0.40, 0.10, 0.90, 0.30],
        [0.30, -0.60, 0.20, 0.80],
    ]
)
W_Q = [
    np.array([[0.1, 0.3], [0.7, -0.9], [0.3, -0.7], [-0.9, 0.7]]),
    np.array([[-0.6, -0.2], [-0.2, -0.8], [0.8, 0.6], [0.9, 0.8]]),
]
W_K = [
    np.array([[0.9, -0.9], [0.6, -0.3], [-0.9, 0.7], [0.2, -0.4]]),
    np.array([[0.9, -0.7], [0.8, 0.3], [0.4, 0.0], [-0.9, -0.9]]),
]
W_V = [
    np.array([[0.5, -0.2], [0.1, 0.6], [-0.3, 0.4], [0.7, 0.1]]),
    np.array([[0.2, 0.4], [-0.5, 0.3], [0.6, -0.1], [0.1, -0.6]]),
]
W_O = np.array(
    [
        [0.5, -0.1, 0.3, 0.2],
        [0.1, 0.6, -0.2, 0.4],
        [-0.3, 0.2, 0.5, 0.1],
        [0.2, 0.3, 0.1, -0.4],
    ]
)
W = ["--head", "1", "--matrix", "weights"]  # explain a head-1 weight cell
HEAD_KEYS = ("Q", "K", "V", "scores", "scaled", "masked", "weights", "output")


def reference(
    x=X,
    wq=W_Q,
    wk=W_K,
    wv=W_V,
    wo=W_O,
    mask="causal",
    scale=True,
    projections=True,
    pe=None,
):
    """Plain NumPy attention: a list of per-head dicts, concat and the final output."""
    x = np.asarray(x, dtype=float)
    if pe is not None:
        x = x + pe
    n = x.shape[0]
    future = np.triu(np.ones((n, n), dtype=bool), k=1)
    heads = []
    for h in range(len(wq) if projections else 1):
        if projections:
            Q, K, V = x @ wq[h], x @ wk[h], x @ wv[h]
        else:
            Q = K = V = x
        scores = Q @ K.T
        scaled = scores / math.sqrt(Q.shape[1]) if scale else scores.copy()
        masked = scaled.copy()
        if mask == "causal":
            masked[future] = -np.inf
        elif mask == "causal-zero":
            masked[future] = 0.0
        e = np.exp(masked - masked.max(axis=1, keepdims=True))
        weights = e / e.sum(axis=1, keepdims=True)
        if mask == "drop-after-softmax":
            weights[future] = 0.0
        heads.append(
            dict(
                Q=Q,
                K=K,
                V=V,
                scores=scores,
                scaled=scaled,
                masked=masked,
                weights=weights,
                output=weights @ V,
            )
        )
    concat = np.concatenate([hd["output"] for hd in heads], axis=1)
    final = concat @ wo if projections else concat
    return heads, concat, final


# Helpers ------------------------------------------------------------------------------


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def compute_json(capsys, *argv: str) -> dict:
    rc, out, err = cli(capsys, "compute", "--format", "json", *argv)
    assert rc == 0, err
    assert err == ""
    return json.loads(out)


def as_array(rows) -> np.ndarray:
    return np.array([[-np.inf if v == "-inf" else v for v in row] for row in rows], dtype=float)


def assert_matches(data: dict, heads, concat, final, tol: float = 1e-12) -> None:
    assert len(data["heads"]) == len(heads)
    for got, want in zip(data["heads"], heads, strict=True):
        for key in HEAD_KEYS:
            a = as_array(got[key])
            assert a.shape == want[key].shape, key
            # -inf exactly where the reference has -inf, and nowhere else.
            assert np.array_equal(np.isneginf(a), np.isneginf(want[key])), key
            finite = np.isfinite(want[key])
            np.testing.assert_allclose(a[finite], want[key][finite], rtol=0, atol=tol, err_msg=key)
    np.testing.assert_allclose(np.array(data["concat"]), concat, rtol=0, atol=tol)
    np.testing.assert_allclose(np.array(data["output"]), final, rtol=0, atol=tol)


def close_to_printed(printed: str, true: float) -> bool:
    """printed is true to 6 significant digits (as %.6g prints)."""
    value = -math.inf if printed == "−∞" else float(printed)
    if math.isinf(true) or math.isinf(value):
        return value == true
    return math.isclose(value, true, rel_tol=5.01e-6, abs_tol=1e-300)


def write_worked_file(path: Path, **settings) -> Path:
    """The worked example saved by attnviz.core.io.files.save_scenario."""
    from attnviz.core.io.files import save_scenario
    from attnviz.core.maths.scenario import Settings, from_heads

    heads = [{"W_Q": W_Q[h], "W_K": W_K[h], "W_V": W_V[h]} for h in range(2)]
    save_scenario(path, from_heads(TOKENS, X, heads, W_O, Settings(**settings)))
    return path


# compute --format json ----------------------------------------------------------------


def test_hand_checked_cells(capsys):
    data = compute_json(capsys)
    h1 = data["heads"][0]
    # Head 1, Q row "she" = [0.9, 0.1, -0.3, 0.2] · W_Q:
    #   col 1: 0.9·0.1 + 0.1·0.7 + (-0.3)·0.3 + 0.2·(-0.9) = 0.09 + 0.07 - 0.09 - 0.18 = -0.11
    #   col 2: 0.9·0.3 + 0.1·(-0.9) + (-0.3)·(-0.7) + 0.2·0.7 = 0.27 - 0.09 + 0.21 + 0.14 = 0.53
    assert h1["Q"][0] == pytest.approx([-0.11, 0.53], abs=1e-12)
    # K row "she" = [0.9, 0.1, -0.3, 0.2] · W_K:
    #   0.81 + 0.06 + 0.27 + 0.04 = 1.18;  -0.81 - 0.03 - 0.21 - 0.08 = -1.13
    assert h1["K"][0] == pytest.approx([1.18, -1.13], abs=1e-12)
    # score she·she = -0.11·1.18 + 0.53·(-1.13) = -0.1298 - 0.5989 = -0.7287; ÷ √2
    assert h1["scores"][0][0] == pytest.approx(-0.7287, abs=1e-12)
    assert h1["scaled"][0][0] == pytest.approx(-0.7287 / math.sqrt(2), abs=1e-12)
    # Causal: "she" sees only itself, weight 1, so its output is V row "she":
    #   0.45 + 0.01 + 0.09 + 0.14 = 0.69;  -0.18 + 0.06 - 0.12 + 0.02 = -0.22
    assert h1["masked"][0][1:] == ["-inf", "-inf", "-inf"]
    assert h1["weights"][0] == pytest.approx([1.0, 0.0, 0.0, 0.0], abs=1e-15)
    assert h1["output"][0] == pytest.approx([0.69, -0.22], abs=1e-12)


def test_worked_example_json_matches_independent_numpy(capsys):
    data = compute_json(capsys)
    assert set(data) >= {"scenario", "heads", "concat", "output"}
    assert_matches(data, *reference())
    # the concat holds head 1 in columns 1-2, head 2 in columns 3-4
    concat = np.array(data["concat"])
    np.testing.assert_array_equal(concat[:, :2], np.array(data["heads"][0]["output"]))
    np.testing.assert_array_equal(concat[:, 2:], np.array(data["heads"][1]["output"]))


def test_json_scenario_is_exactly_what_a_save_writes(capsys, tmp_path):
    data = compute_json(capsys)
    saved = json.loads(write_worked_file(tmp_path / "w.attn.json").read_text("utf-8"))
    assert data["scenario"] == saved
    # and that is the brief's example with the default settings
    sc = data["scenario"]
    assert sc["tokens"] == TOKENS
    assert sc["X"] == X.tolist()
    assert sc["heads"] == [
        {"W_Q": W_Q[h].tolist(), "W_K": W_K[h].tolist(), "W_V": W_V[h].tolist()} for h in (0, 1)
    ]
    assert sc["W_O"] == W_O.tolist()
    assert sc["settings"]["mask"] == "causal"
    assert sc["settings"]["scale"] is True
    assert sc["settings"]["projections"] is True
    assert sc["settings"]["positional"] == "none"


@pytest.mark.parametrize(
    ("flags", "kwargs", "settings"),
    [
        (["--mask", "none"], dict(mask="none"), dict(mask="none")),
        (["--mask", "causal-zero"], dict(mask="causal-zero"), dict(mask="causal-zero")),
        (
            ["--mask", "drop-after-softmax"],
            dict(mask="drop-after-softmax"),
            dict(mask="drop-after-softmax"),
        ),
        (["--no-scale"], dict(scale=False), dict(scale=False)),
        (["--no-projections"], dict(projections=False), dict(projections=False)),
        (
            ["--positional", "sinusoidal"],
            dict(pe=ref.sinusoidal(4, 4)),
            dict(positional="sinusoidal"),
        ),
        (
            ["--no-projections", "--no-scale", "--mask", "none", "--positional", "sinusoidal"],
            dict(projections=False, scale=False, mask="none", pe=ref.sinusoidal(4, 4)),
            dict(projections=False, scale=False, mask="none", positional="sinusoidal"),
        ),
    ],
)
def test_flags_override_settings(capsys, flags, kwargs, settings):
    data = compute_json(capsys, *flags)
    assert_matches(data, *reference(**kwargs))
    for key, value in settings.items():
        assert data["scenario"]["settings"][key] == value
    # the scenario's X stays the typed X (the positional encoding is added at compute time)
    assert data["scenario"]["X"] == X.tolist()


def test_causal_zero_leaks_weight_to_the_future(capsys):
    data = compute_json(capsys, "--mask", "causal-zero")
    future = np.triu(np.ones((4, 4), dtype=bool), k=1)
    for head in data["heads"]:
        w = np.array(head["weights"])
        assert (w[future] > 0).all()
        np.testing.assert_allclose(w.sum(axis=1), 1.0, atol=1e-12)
        assert np.array(head["masked"])[future].tolist() == [0.0] * 6
        np.testing.assert_allclose(head["leak"], (w * future).sum(axis=1), atol=1e-12)
        assert min(head["leak"][:3]) > 0 and head["leak"][3] == 0


def test_drop_after_softmax_rows_sum_below_one(capsys):
    none = compute_json(capsys, "--mask", "none")
    drop = compute_json(capsys, "--mask", "drop-after-softmax")
    future = np.triu(np.ones((4, 4), dtype=bool), k=1)
    for hn, hd in zip(none["heads"], drop["heads"], strict=True):
        wn, wd = np.array(hn["weights"]), np.array(hd["weights"])
        assert (wd[future] == 0).all()
        np.testing.assert_allclose(wd[~future], wn[~future], rtol=0, atol=1e-15)  # not renormalised
        sums = wd.sum(axis=1)
        assert (sums[:3] < 1 - 1e-6).all()
        assert sums[3] == pytest.approx(1.0, abs=1e-12)


def test_last_row_same_under_causal_and_none(capsys):
    causal = compute_json(capsys)
    none = compute_json(capsys, "--mask", "none")
    for hc, hn in zip(causal["heads"], none["heads"], strict=True):
        assert hc["weights"][3] == pytest.approx(hn["weights"][3], abs=1e-15)
        assert hc["weights"][0] != pytest.approx(hn["weights"][0], abs=1e-3)
    assert causal["output"][3] == pytest.approx(none["output"][3], abs=1e-15)


def test_no_projections_is_one_head_of_softmax_x_xt(capsys):
    data = compute_json(capsys, "--no-projections")
    assert len(data["heads"]) == 1
    head = data["heads"][0]
    s = X @ X.T / math.sqrt(4)
    s[np.triu_indices(4, k=1)] = -np.inf
    w = np.exp(s - s.max(axis=1, keepdims=True))
    w /= w.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(head["output"], w @ X, atol=1e-12)
    np.testing.assert_allclose(head["Q"], X, atol=0)
    np.testing.assert_allclose(data["concat"], w @ X, atol=1e-12)
    np.testing.assert_allclose(data["output"], w @ X, atol=1e-12)  # no W_O


def test_no_scale_keeps_scaled_equal_to_scores(capsys):
    off = compute_json(capsys, "--no-scale")
    on = compute_json(capsys)
    for h_off, h_on in zip(off["heads"], on["heads"], strict=True):
        assert h_off["scaled"] == h_off["scores"]
        np.testing.assert_allclose(h_off["scores"], h_on["scores"], rtol=0, atol=1e-15)
        np.testing.assert_allclose(
            np.array(h_on["scaled"]), np.array(h_on["scores"]) / math.sqrt(2), atol=1e-15
        )


# Presets --------------------------------------------------------------------------------


def test_presets_lists_one_line_each(capsys):
    rc, out, err = cli(capsys, "presets")
    assert rc == 0 and err == ""
    lines = out.splitlines()
    names = [line.split()[0] for line in lines]
    assert len(names) == len(set(names))
    assert names[0] == "worked-example"
    assert "gpt2-small" in names
    stages = [n for n in names if n.startswith("stage-")]
    assert [s.split("-")[1] for s in stages] == [str(i) for i in range(1, 14)]  # 13 stages
    variants = [
        *("sliding-window", "llama-style", "qk-norm", "softcap"),
        *("sinks", "alibi", "cross-attention"),
    ]
    assert set(variants) <= set(names)
    assert len(lines) == len(stages) + 2 + len(variants)  # + worked example, gpt2-small
    for line in lines:
        assert len(line.split(maxsplit=1)) == 2  # a name and a summary


@pytest.mark.parametrize(
    ("preset", "kwargs"),
    [
        ("stage-1-simple", dict(projections=False, scale=False, mask="none")),
        ("stage-3-projections", dict(scale=False, mask="none")),
        ("stage-4-scaling", dict(mask="none")),
        ("stage-5-causal-mask", dict()),
    ],
)
def test_stage_presets(capsys, preset, kwargs):
    assert_matches(compute_json(capsys, "--preset", preset), *reference(**kwargs))


def test_stage_1_is_softmax_of_x_xt_times_x(capsys):
    data = compute_json(capsys, "--preset", "stage-1-simple")
    s = X @ X.T
    w = np.exp(s - s.max(axis=1, keepdims=True))
    w /= w.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(data["output"], w @ X, atol=1e-12)


def test_flags_override_a_preset(capsys):
    data = compute_json(capsys, "--preset", "stage-1-simple", "--mask", "causal")
    assert data["scenario"]["settings"]["mask"] == "causal"
    assert data["scenario"]["settings"]["projections"] is False
    assert_matches(data, *reference(projections=False, scale=False, mask="causal"))


def parse_table(lines: list[str], title: str, start: int = 0, last: bool = False):
    """(column labels, row labels, values) of the table titled title in text output."""
    i = len(lines) - 1 - lines[::-1].index(title) if last else lines.index(title, start)
    header = lines[i + 1].split()
    rows, values = [], []
    for line in lines[i + 2 :]:
        if not line.strip():
            break
        label, *cells = line.split()
        rows.append(label)
        values.append([-np.inf if c == "-inf" else float(c) for c in cells])
    return header, rows, np.array(values)


def test_gpt2_small_sized_preset(capsys):
    from attnviz.core.presets import make_preset  # the random inputs only

    s = make_preset("gpt2-small", 3, 7)
    assert s.X.shape == (3, 768) and s.W_Q.shape == (12, 768, 64) and s.W_O.shape == (768, 768)
    heads, _, final = reference(s.X, s.W_Q, s.W_K, s.W_V, s.W_O, mask="causal")
    rc, out, err = cli(capsys, "compute", "--preset", "gpt2-small", "--n", "3", "--seed", "7")
    assert rc == 0 and err == ""
    lines = out.splitlines()
    assert "== head 12 ==" in lines and "== head 13 ==" not in lines
    for h in range(12):
        start = lines.index(f"== head {h + 1} ==")
        header, rows, w = parse_table(lines, "weights:", start)
        assert header == rows == ["t1", "t2", "t3"]
        np.testing.assert_allclose(w, heads[h]["weights"], rtol=0, atol=5.01e-5)
    header, rows, out_final = parse_table(lines, "final output (concat W_O):", last=True)
    assert header == [str(i) for i in range(1, 769)]
    np.testing.assert_allclose(out_final, final, rtol=0, atol=5.01e-5)
    # the seed picks the numbers: the same seed gives the same text, another seed does not
    assert cli(capsys, "compute", "--preset", "gpt2-small", "--n", "3", "--seed", "7")[1] == out
    assert cli(capsys, "compute", "--preset", "gpt2-small", "--n", "3", "--seed", "8")[1] != out


# Files ----------------------------------------------------------------------------------


def test_compute_from_a_file_and_override_it(capsys, tmp_path):
    path = write_worked_file(tmp_path / "w.attn.json", mask="none", scale=False)
    data = compute_json(capsys, str(path))
    assert data["scenario"] == json.loads(path.read_text("utf-8"))
    assert_matches(data, *reference(mask="none", scale=False))
    data = compute_json(capsys, str(path), "--mask", "causal-zero")
    assert data["scenario"]["settings"]["mask"] == "causal-zero"
    assert data["scenario"]["settings"]["scale"] is False
    assert_matches(data, *reference(mask="causal-zero", scale=False))


def test_scaled_turns_scaling_back_on_for_an_unscaled_file(capsys, tmp_path):
    path = write_worked_file(tmp_path / "w.attn.json", scale=False)
    data = compute_json(capsys, str(path), "--scaled")
    assert data["scenario"]["settings"]["scale"] is True
    assert_matches(data, *reference(scale=True))
    rc, out, err = cli(capsys, "compute", str(path), "--scaled", "--no-scale")
    assert rc == 2 and out == ""
    assert "not allowed with argument" in err


def test_json_scenario_reloads_to_the_same_result(capsys, tmp_path):
    first = compute_json(capsys, "--mask", "drop-after-softmax", "--positional", "sinusoidal")
    path = tmp_path / "again.attn.json"
    path.write_text(json.dumps(first["scenario"]), "utf-8")
    assert compute_json(capsys, str(path)) == first


# compute --format text ------------------------------------------------------------------


def text_table(out: str, head: int, name: str) -> list[str]:
    """The lines of one table (title, header, rows) from the text output."""
    lines = out.splitlines()
    start = lines.index(f"== head {head} ==")
    i = lines.index(f"{name}:", start)
    return lines[i + 1 : i + 2 + len(TOKENS)]


def test_text_tables_are_labelled_aligned_and_right(capsys):
    rc, out, err = cli(capsys, "compute")
    assert rc == 0 and err == ""
    heads, _concat, final = reference()
    for h in (1, 2):
        for name in ("scores", "masked", "weights"):
            table = text_table(out, h, name)
            assert table[0].split() == TOKENS
            assert len({len(line) for line in table}) == 1  # aligned columns
            for row, line in enumerate(table[1:]):
                label, *cells = line.split()
                assert label == TOKENS[row]
                want = heads[h - 1][name][row]
                for cell, w in zip(cells, want, strict=True):
                    if np.isneginf(w):
                        assert cell == "-inf"
                    else:
                        assert float(cell) == pytest.approx(w, abs=5.01e-5)
    # the masked table shows -inf exactly above the diagonal
    for row, line in enumerate(text_table(out, 1, "masked")[1:]):
        assert line.split()[1:].count("-inf") == 3 - row
    lines = out.splitlines()
    i = (
        len(lines) - 1 - lines[::-1].index("final output (concat W_O):")
    )  # the last table: the final output
    for row, line in enumerate(lines[i + 2 : i + 6]):
        label, *cells = line.split()
        assert label == TOKENS[row]
        assert [float(c) for c in cells] == pytest.approx(final[row], abs=5.01e-5)


# explain --------------------------------------------------------------------------------

EXP_LINE = re.compile(r"exp\(s\[(\S+)\] − m\) = exp\((\S+) − (\S+)\) = (\S+)$")


def explain(capsys, *argv: str) -> str:
    rc, out, err = cli(capsys, "explain", *argv)
    assert rc == 0, err
    assert err == ""
    return out


def value_of(out: str, label: str) -> str:
    m = re.search(rf"^  {re.escape(label)} = (\S+)$", out, re.M)
    assert m, f"no {label!r} line in\n{out}"
    return m.group(1)


@pytest.mark.parametrize(("head", "row", "col"), [(1, 3, 0), (2, 2, 1), (1, 1, 1)])
def test_explain_weight_cell(capsys, head, row, col):
    heads, _, _ = reference()
    s = heads[head - 1]["masked"][row]
    m = s.max()
    e = np.exp(s - m)
    out = explain(
        capsys,
        "--head",
        str(head),
        "--matrix",
        "weights",
        "--row",
        TOKENS[row],
        "--col",
        TOKENS[col],
    )
    terms = [EXP_LINE.search(line) for line in out.splitlines()]
    terms = [t for t in terms if t]
    assert [t.group(1) for t in terms] == TOKENS
    for k, t in enumerate(terms):
        assert close_to_printed(t.group(2), s[k]), (k, t.group(0))
        assert close_to_printed(t.group(3), m)
        assert close_to_printed(t.group(4), e[k]), (k, t.group(0))
    assert close_to_printed(value_of(out, "row max m"), m)
    assert close_to_printed(value_of(out, "Σ exp"), e.sum())
    assert close_to_printed(value_of(out, "value"), e[col] / e.sum())
    assert close_to_printed(value_of(out, "value"), heads[head - 1]["weights"][row, col])
    # rows and columns may be numbered from 1 instead of named
    by_number = explain(
        capsys,
        "--head",
        str(head),
        "--matrix",
        "weights",
        "--row",
        str(row + 1),
        "--col",
        str(col + 1),
    )
    assert by_number == out


def test_explain_future_weight_is_zero_with_exp_of_minus_infinity(capsys):
    out = explain(capsys, "--head", "1", "--matrix", "weights", "--row", "she", "--col", "cat")
    assert value_of(out, "value") == "0"
    assert "exp(−∞" in out


def test_explain_scaled_score(capsys):
    heads, _, _ = reference()
    Q, K = heads[1]["Q"], heads[1]["K"]
    out = explain(capsys, "--head", "2", "--matrix", "scaled", "--row", "the", "--col", "saw")
    products = Q[2] * K[1]
    for k, p in enumerate(products):
        m = re.search(
            rf"Q\[the\]\[{k + 1}\]·K\[saw\]\[{k + 1}\] = (\S+) × (\S+) = (\S+)$", out, re.M
        )
        assert m, out
        assert close_to_printed(m.group(1), Q[2, k])
        assert close_to_printed(m.group(2), K[1, k])
        assert close_to_printed(m.group(3), p)
    assert close_to_printed(value_of(out, "sum"), products.sum())
    assert close_to_printed(value_of(out, "√d_k = √2"), math.sqrt(2))
    assert close_to_printed(value_of(out, "value"), products.sum() / math.sqrt(2))


def test_explain_concat_and_final(capsys):
    heads, _concat, final = reference()
    out = explain(capsys, "--matrix", "concat", "--row", "saw", "--col", "3")
    assert close_to_printed(value_of(out, "value"), heads[1]["output"][1, 0])
    out = explain(capsys, "--matrix", "final", "--row", "4", "--col", "2")
    assert close_to_printed(value_of(out, "value"), final[3, 1])


def test_explain_masked_and_flag_overrides(capsys):
    out = explain(capsys, "--head", "1", "--matrix", "masked", "--row", "saw", "--col", "the")
    assert value_of(out, "value") == "−∞"
    out = explain(capsys, *W, "--row", "saw", "--col", "the", "--mask", "causal-zero")
    heads, _, _ = reference(mask="causal-zero")
    assert close_to_printed(value_of(out, "value"), heads[0]["weights"][1, 2])
    assert heads[0]["weights"][1, 2] > 0


def test_explain_from_a_file(capsys, tmp_path):
    path = write_worked_file(tmp_path / "w.attn.json", mask="none")
    heads, _, _ = reference(mask="none")
    out = explain(
        capsys, str(path), "--head", "1", "--matrix", "weights", "--row", "1", "--col", "4"
    )
    assert close_to_printed(value_of(out, "value"), heads[0]["weights"][0, 3])


# Errors: exit status 2, one line on stderr naming the problem, nothing on stdout. ----


def corrupt_files(tmp: Path) -> dict[str, Path]:
    good = json.loads(write_worked_file(tmp / "good.attn.json").read_text("utf-8"))
    files = {"not-json": "{ this is not json", "list": "[1, 2, 3]", "empty": ""}
    bad_shape = json.loads(json.dumps(good))
    bad_shape["heads"][1]["W_K"] = [[*row, 0.5] for row in bad_shape["heads"][1]["W_K"]]
    files["shape"] = json.dumps(bad_shape)
    nan = json.loads(json.dumps(good))
    files["nan"] = json.dumps(nan).replace("0.9", "NaN", 1)
    text = json.loads(json.dumps(good))
    text["X"][1][2] = "0.4"
    files["text"] = json.dumps(text)
    out = {}
    for name, body in files.items():
        path = tmp / f"{name}.attn.json"
        path.write_text(body, "utf-8")
        out[name] = path
    return out


ERROR_CASES = [
    (["compute", "{tmp}/missing.attn.json"], ["missing.attn.json"]),
    (["compute", "{tmp}/not-json.attn.json"], ["not-json.attn.json", "JSON"]),
    (["compute", "{tmp}/list.attn.json"], ["list.attn.json", "object"]),
    (["compute", "{tmp}/empty.attn.json"], ["empty.attn.json"]),
    (["compute", "{tmp}/shape.attn.json"], ["heads[2].W_K", "4×2", "4×3"]),
    (["compute", "{tmp}/nan.attn.json"], ["nan.attn.json", "X[1,1]", "not a finite number"]),
    (["compute", "{tmp}/text.attn.json"], ["X[2,3]", "number"]),
    (["compute", "{tmp}"], ["cannot read"]),
    (["compute", "--preset", "nope"], ["nope"]),
    (["compute", "--mask", "sideways"], ["--mask", "sideways"]),
    (["compute", "--format", "yaml"], ["--format", "yaml"]),
    (["compute", "--positional", "learned"], ["--positional", "learned"]),
    (["compute", "--frobnicate"], ["--frobnicate"]),
    (["frobnicate"], ["frobnicate"]),
    (["compute", "{tmp}/good.attn.json", "--preset", "worked-example"], ["FILE", "--preset"]),
    (["compute", "--n", "5"], ["worked-example", "n"]),
    (["compute", "--preset", "stage-3-projections", "--n", "5"], ["stage-3-projections"]),
    (["compute", "{tmp}/good.attn.json", "--n", "5"], ["--n"]),
    (["compute", "--preset", "gpt2-small", "--n", "0"], ["--n", "0"]),
    (["compute", "--preset", "gpt2-small", "--n", "five"], ["--n", "five"]),
    (["compute", "--preset", "gpt2-small", "--seed", "-3"], ["--seed"]),
    (["explain", "--head", "3", "--matrix", "weights", "--row", "1", "--col", "1"], ["--head 3"]),
    (["explain", "--head", "0", "--matrix", "weights", "--row", "1", "--col", "1"], ["--head"]),
    (["explain", *W, "--row", "9", "--col", "1"], ["--row 9", "1 to 4"]),
    (["explain", *W, "--row", "0", "--col", "1"], ["--row 0"]),
    (["explain", *W, "--row", "1", "--col", "5"], ["--col 5"]),
    (["explain", *W, "--row", "dog", "--col", "1"], ["--row", "dog"]),
    (["explain", *W, "--row", "1", "--col", "dog"], ["--col", "dog"]),
    (["explain", "--head", "1", "--matrix", "Q", "--row", "1", "--col", "she"], ["--col", "she"]),
    (["explain", "--head", "1", "--matrix", "Q", "--row", "1", "--col", "3"], ["--col 3"]),
    (["explain", "--matrix", "weights", "--row", "1", "--col", "1"], ["--head"]),
    (["explain", "--head", "1", "--matrix", "X", "--row", "1", "--col", "1"], ["--head"]),
    (["explain", "--head", "1", "--matrix", "softmax", "--row", "1", "--col", "1"], ["softmax"]),
    (["explain", *W, "--row", "1"], ["--col"]),
    (["explain", *W, "--row", "1", "--col", "1", "--no-projections", "--head", "2"], ["--head"]),
    (["explain", "--preset", "nope", *W, "--row", "1", "--col", "1"], ["nope"]),
    (["explain", "{tmp}/missing.attn.json", *W, "--row", "1", "--col", "1"], ["missing"]),
]


@pytest.mark.parametrize(("argv", "needles"), ERROR_CASES, ids=lambda v: " ".join(v)[:60])
def test_bad_input_is_one_line_and_exit_2(capsys, tmp_path, argv, needles):
    corrupt_files(tmp_path)
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    rc, out, err = cli(capsys, *argv)
    assert rc == 2
    assert out == ""
    assert err.endswith("\n") and err.count("\n") == 1, err
    assert err.startswith("attnviz: ")
    assert "Traceback" not in err
    for needle in needles:
        assert needle in err, (needle, err)


def test_bad_input_does_not_print_help_or_usage(capsys):
    rc, out, err = cli(capsys, "compute", "--mask", "sideways")
    assert rc == 2 and "usage:" not in err and out == ""


def test_superscript_digit_row_is_a_usage_error(capsys):
    rc, _, err = cli(capsys, "explain", *W, "--row", "²", "--col", "1")
    assert rc == 2 and err.count("\n") == 1


@pytest.mark.parametrize("where", ["top-level key", "settings key", "token"])
def test_newline_in_file_text_keeps_error_on_one_line(capsys, tmp_path, where):
    data = json.loads(write_worked_file(tmp_path / "g.attn.json").read_text("utf-8"))
    argv = ["compute"]
    if where == "top-level key":
        data["bad\nkey"] = 1
    elif where == "settings key":
        data["settings"]["bad\nkey"] = 1
    else:
        data["tokens"][1] = "sa\nw"
        argv = ["explain", *W, "--row", "dog", "--col", "1"]
    path = tmp_path / "nl.attn.json"
    path.write_text(json.dumps(data), "utf-8")
    rc, _, err = cli(capsys, argv[0], str(path), *argv[1:])
    assert rc == 2
    assert err.count("\n") == 1, err


# As a subprocess: the real exit status and stderr. -----------------------------------


def run_module(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "attnviz", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_subprocess_errors(tmp_path):
    (tmp_path / "bad.attn.json").write_text('{"format": "attnviz-scenario", "version": 1', "utf-8")
    for argv, needle in [
        (["compute", str(tmp_path / "missing.attn.json")], "missing.attn.json"),
        (["compute", str(tmp_path / "bad.attn.json")], "bad.attn.json"),
        (["explain", "--head", "3", "--matrix", "weights", "--row", "1", "--col", "1"], "--head"),
        (["compute", "--mask", "sideways"], "--mask"),
    ]:
        p = run_module(*argv)
        assert p.returncode == 2, (argv, p.stderr)
        assert p.stdout == ""
        assert "Traceback" not in p.stderr
        assert len(p.stderr.splitlines()) == 1, p.stderr
        assert needle in p.stderr


def test_subprocess_compute_json():
    p = run_module("compute", "--format", "json")
    assert p.returncode == 0 and p.stderr == ""
    assert_matches(json.loads(p.stdout), *reference())


# Words a newcomer can read ---------------------------------------------------------------


def test_presets_print_id_title_and_summary_in_plain_words(capsys):
    from attnviz.core.presets import PRESETS

    rc, out, err = cli(capsys, "presets")
    assert rc == 0 and err == ""
    lines = out.splitlines()
    assert len(lines) == len(PRESETS)
    for line, p in zip(lines, PRESETS.values(), strict=True):
        assert p.title and p.title != p.name and " " in p.title
        assert line.startswith(p.name + " ") and p.title in line and line.endswith(p.summary)
        assert "brief" not in (p.title + p.summary).lower()
    assert PRESETS["worked-example"].title == "Worked example"
    assert "she saw the cat" in PRESETS["worked-example"].summary
    assert PRESETS["stage-1-simple"].title.startswith("Lesson 1")
    assert PRESETS["gpt2-small"].title == "GPT-2 small (random weights)"


def test_help_says_that_attnviz_file_opens_the_window(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    out = capsys.readouterr().out
    assert exit_.value.code == 0
    assert "attnviz [FILE]" in out
    assert "opens the window" in out


def test_an_unknown_word_names_the_commands(capsys):
    from attnviz.cli import SUBCOMMANDS, build_parser

    commands = build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    assert tuple(commands) == SUBCOMMANDS
    rc, out, err = cli(capsys, "frob")
    assert (rc, out) == (2, "")
    assert err == f"attnviz: 'frob' is not a command or a file; commands: {', '.join(commands)}\n"


@pytest.mark.parametrize("path", ["x.attn.json", "missing.json", "dir/x", "./frob"])
def test_a_missing_path_that_looks_like_a_file_says_no_such_file(capsys, path):
    rc, out, err = cli(capsys, path)
    assert (rc, out) == (2, "")
    assert err == f"attnviz: {path}: no such file\n"
