"""`attnviz code --backward`: the exported NumPy script (the backward pass by hand) and
torch script (autograd) print the loss and every gradient `attnviz grad --format json`
gives, for the variants and all three losses; the tiled flavor refuses in one line.

The scripts of a flavor run in one fresh interpreter (test_codegen.run_scripts), so that
torch is imported once."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest
from test_codegen import (
    BASE,
    GQA,
    MQA,
    cross,
    custom_mask,
    parse_output,
    run_scripts,
    with_biases,
    with_norm_weights,
    with_relative_bias,
)

from attnviz.cli import main
from attnviz.core.io.files import save_scenario
from attnviz.core.maths.scenario import Scenario, Settings
from attnviz.core.presets import worked_example

HAS_TORCH = importlib.util.find_spec("torch") is not None

# Each case's own loss (its settings) is what both the script and `attnviz grad` use.
CASES: dict[str, Scenario] = {
    "worked-example-previous-token": worked_example(),
    "causal-zero-cell": worked_example(Settings(mask="causal-zero", loss="cell", loss_cell=(2, 1))),
    "sinusoidal-dropout-next-token": worked_example(
        Settings(
            mask="none", positional="sinusoidal", dropout=0.3, dropout_seed=5, loss="next-token"
        )
    ),
    "unscaled-copy-self": worked_example(Settings(scale=False, loss_target="copy-self")),
    "gqa-biases-alibi-sinks-softcap-first-token": with_biases(GQA).with_settings(
        positional="alibi", sinks=(0.5, -1.0, 3.0, 0.0), softcap=1.5, loss_target="first-token"
    ),
    "cross-ablated-drop-after-softmax-scale-value-cell": cross(
        BASE, m=7, alignment="bottom-right"
    ).with_settings(
        mask="drop-after-softmax", scale_value=0.7, ablated=(1,), loss="cell", loss_cell=(4, 3)
    ),
    "relative-bias-softcap-target": with_relative_bias(
        with_biases(GQA), relative_buckets=6, relative_max_distance=3, softcap=2.0
    ),
    "relative-bias-decoder-cross-next-token": with_relative_bias(
        cross(BASE, m=7, alignment="bottom-right"),
        seed=2,
        relative_buckets=5,
        relative_max_distance=4,
        relative_bidirectional=False,
        loss="next-token",
    ),
    "mqa-window-next-token": MQA.with_settings(mask="sliding-window", window=2, loss="next-token"),
    "custom-empty-row-rope": custom_mask(BASE, empty_row=2).with_settings(
        positional="rope", rope_style="interleaved", rope_dims=2
    ),
    "no-projections-cross-rope-sinks-cell": cross(BASE, m=6).with_settings(
        projections=False,
        positional="rope",
        sinks=(0.3, 0.0, 0.0, 0.0),
        loss="cell",
        loss_cell=(1, 5),
    ),
    "no-projections-causal-next-token": worked_example(
        Settings(projections=False, loss="next-token")
    ),
    "qk-norm-weights-gqa-rope": with_norm_weights(GQA).with_settings(positional="rope"),
    "qk-norm-cell": BASE.with_settings(qk_norm="rms", loss="cell", loss_cell=(3, 2)),
    "qk-norm-whole-weights-gqa-rope-biases": with_biases(with_norm_weights(GQA)).with_settings(
        qk_norm="rms-whole", positional="rope", loss="next-token"
    ),
    "qk-norm-whole-mqa-cross": with_norm_weights(cross(MQA, m=6)).with_settings(
        qk_norm="rms-whole", qk_norm_eps=0.5
    ),
    "qk-norm-whole-no-projections-cross": cross(BASE, m=6).with_settings(
        projections=False, qk_norm="rms-whole", qk_norm_eps=1e-3
    ),
    "qk-norm-no-projections-cross-alibi": cross(BASE, m=6).with_settings(
        projections=False, positional="alibi", qk_norm="rms", qk_norm_eps=1e-3
    ),
    "everything": with_biases(
        with_norm_weights(cross(GQA, m=7, alignment="bottom-right"))
    ).with_settings(
        positional="rope",
        rope_dims=2,
        softcap=3.0,
        scale_value=0.7,
        sinks=(0.1, -0.2, 0.3, 0.4),
        dropout=0.25,
        dropout_seed=9,
        ablated=(1,),
        loss="next-token",
    ),
}


def expected(s: Scenario, path: str, capsys) -> dict[str, np.ndarray]:
    """`attnviz grad FILE --format json`, by the scripts' titles."""
    assert main(["grad", path, "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    out = {"loss": np.array([[doc["loss"]["value"]]])}
    for name, a in doc["inputs"].items():
        a = np.asarray(a, dtype=np.float64)
        if a.ndim == 3:
            out.update({f"dL/d{name} head {h + 1}": m for h, m in enumerate(a)})
        else:
            out[f"dL/d{name}"] = a
    turned = s.settings.qk_norm != "none" or s.settings.positional == "rope"
    for h, head in enumerate(doc["heads"]):
        for name, a in head.items():
            if turned or name not in ("Q_rot", "K_rot"):
                out[f"dL/d{name} head {h + 1}"] = np.asarray(a, dtype=np.float64)
    out["dL/dconcat"] = np.asarray(doc["concat"], dtype=np.float64)
    out["dL/dfinal"] = np.asarray(doc["final"], dtype=np.float64)
    return out


def scripts(flavor: str, cases: dict[str, Scenario], folder, capsys) -> None:
    texts, want = {}, {}
    for name, s in cases.items():
        path = str(folder / f"{name}.attn.json")
        save_scenario(path, s)
        assert main(["code", path, "--flavor", flavor, "--backward"]) == 0
        texts[name] = capsys.readouterr().out
        want[name] = expected(s, path, capsys)
    for name, run in run_scripts(texts, folder).items():
        assert "error" not in run, f"{name}: {run.get('error')}"
        printed = parse_output(run["stdout"])
        gradients = {title: a for title, a in printed.items() if title.startswith("dL/d")}
        assert set(gradients) | {"loss"} == set(want[name]), name
        largest = max(float(np.abs(a).max(initial=0.0)) for a in want[name].values())
        for title, a in want[name].items():
            got = printed[title].reshape(a.shape) if title == "loss" else printed[title]
            np.testing.assert_allclose(
                got, a, rtol=0, atol=1e-12 * largest, err_msg=f"{name}: {title}"
            )
        assert "output" in printed and "head 1 weights" in printed  # the forward pass's lines


def test_numpy_backward_by_hand_prints_attnviz_grad(tmp_path, capsys):
    scripts("numpy", CASES, tmp_path, capsys)


@pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")
def test_torch_backward_by_autograd_prints_attnviz_grad(tmp_path, capsys):
    scripts("torch", CASES, tmp_path, capsys)


def test_numpy_backward_of_a_plain_scenario_holds_no_optional_part(capsys):
    assert main(["code", "--preset", "worked-example", "--backward"]) == 0
    text = capsys.readouterr().out
    for word in ("rope", "SOFTCAP", "ALIBI", "SINKS", "\nb_Q = ", "capped", "X_kv"):
        assert word not in text


def test_the_tiled_flavor_refuses_the_backward_pass_in_one_line(capsys):
    assert main(["code", "--flavor", "tiled", "--backward"]) == 2
    out, err = capsys.readouterr()
    assert not out and err.count("\n") == 1, err
    assert "tiled" in err and "--flavor numpy or torch" in err
