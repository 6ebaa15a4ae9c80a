"""`attnviz train`: gradient descent on the scenario's own loss, written as a scenario
(and a CSV of losses), equal to a NumPy run of the same Adam steps written here; the
zero mask's training loss falls through the leak while its inference loss does not."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from attnviz.assets import resource
from attnviz.cli import main
from attnviz.core.io.files import load_scenario, save_scenario
from attnviz.core.presets import worked_example


def run(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["train", *args])
    out, err = capsys.readouterr()
    return code, out, err


def by_hand(s, steps: int, lr: float) -> tuple[list[float], np.ndarray]:
    """Adam on W_V alone (β 0.9, 0.999, ε 1e-8) with the target loss, in plain NumPy:
    the worked example's two heads, causal, their weights fixed (W_V changes no weight)."""
    X, W_Q, W_K, W_V, W_O = (np.array(np.asarray(a)) for a in (s.X, s.W_Q, s.W_K, s.W_V, s.W_O))
    T = np.concatenate([X[:1], X[:-1]])
    P = []
    for h in range(2):
        S = (X @ W_Q[h]) @ (X @ W_K[h]).T / np.sqrt(2)
        S[np.triu_indices(4, 1)] = -np.inf
        e = np.exp(S - S.max(axis=1, keepdims=True))
        P.append(e / e.sum(axis=1, keepdims=True))
    m, v, losses = np.zeros_like(W_V), np.zeros_like(W_V), []
    for t in range(1, steps + 1):
        final = np.hstack([P[h] @ X @ W_V[h] for h in range(2)]) @ W_O
        losses.append(0.5 * float(((final - T) ** 2).sum()))
        d_concat = (final - T) @ W_O.T
        g = np.stack([X.T @ P[h].T @ d_concat[:, 2 * h : 2 * h + 2] for h in range(2)])
        m = 0.9 * m + 0.1 * g
        v = 0.999 * v + 0.001 * g * g
        W_V = W_V - 0.01 / (1 - 0.9**t) * m / (np.sqrt(v) / np.sqrt(1 - 0.999**t) + 1e-8)
    final = np.hstack([P[h] @ X @ W_V[h] for h in range(2)]) @ W_O
    losses.append(0.5 * float(((final - T) ** 2).sum()))
    return losses, W_V


def test_train_writes_the_trained_scenario_and_the_losses(capsys, tmp_path):
    out, log = tmp_path / "t.attn.json", tmp_path / "loss.csv"
    code, stdout, _ = run(capsys, "--steps", "40", "--train", "W_V", "--out", str(out),
                          "--log", str(log))  # fmt: skip
    assert code == 0
    want_losses, want_W_V = by_hand(worked_example(), 40, 0.01)
    trained = load_scenario(out)
    np.testing.assert_allclose(np.asarray(trained.W_V), want_W_V, rtol=1e-10, atol=1e-14)
    np.testing.assert_array_equal(np.asarray(trained.W_Q), np.asarray(worked_example().W_Q))
    with open(log) as f:
        rows = list(csv.DictReader(f))
    assert [int(r["step"]) for r in rows] == list(range(41))
    np.testing.assert_allclose([float(r["loss"]) for r in rows], want_losses, rtol=1e-10)
    assert f"loss {want_losses[0]:.6g} → {want_losses[-1]:.6g}" in stdout


def test_the_zero_mask_learns_to_cheat_and_fails_at_inference(capsys, tmp_path):
    losses = {}
    for mask in ("causal", "causal-zero"):
        code, stdout, _ = run(capsys, "--mask", mask, "--loss", "next-token", "--steps", "300",
                              "--out", str(tmp_path / f"{mask}.attn.json"))  # fmt: skip
        assert code == 0
        found = stdout.split("→ ")[1].split(";")[0], stdout.split("past only) ")[1].split()[0]
        losses[mask] = tuple(float(x) for x in found)
    train_causal, infer_causal = losses["causal"]
    train_zero, infer_zero = losses["causal-zero"]
    assert train_causal == pytest.approx(infer_causal, rel=1e-9)  # −∞: the two agree
    assert train_zero < 0.01 and infer_zero > 100 * train_zero  # read through the leak
    assert infer_zero > 10 * infer_causal


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--steps", "5", "--out", "x.png"], "--out x.png: name it *.attn.json or *.attn.npz"),
        (
            ["--steps", "5", "--out", "t.attn.json", "--log", "t.attn.json"],
            "--log t.attn.json: name it *.csv",
        ),
        (["--steps", "5", "--out", "t.attn.json", "--train", "W_Q,nope"], "train 'nope'"),
        (["--steps", "0", "--out", "t.attn.json"], "--steps"),
        (["--steps", "5", "--out", "t.attn.json", "--lr", "-1"], "--lr"),
    ],
)
def test_bad_arguments_are_one_line_and_write_nothing(capsys, tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, *args)
    assert code == 2 and not out and err.count("\n") == 1 and message in err
    assert not list(tmp_path.iterdir())


def test_training_never_overwrites_its_input(capsys, tmp_path):
    path = tmp_path / "w.attn.json"
    save_scenario(path, worked_example())
    before = path.read_bytes()
    code, _, err = run(capsys, str(path), "--steps", "5", "--out", str(path))
    assert code == 2 and "nothing was written" in err and path.read_bytes() == before


def summary(stdout: str) -> dict[str, float]:
    """The losses the last line names: train (after the arrow), held-out, inference."""
    found = {
        "train": stdout.split("→ ")[1].split(";")[0],
        "held_out": stdout.split("held-out loss ")[1].split(";")[0],
        "inference": stdout.split("past only) ")[1].split()[0],
    }
    return {k: float(v) for k, v in found.items()}


def test_the_leak_lesson_is_reproduced_from_the_command_line(capsys, tmp_path):
    """Lesson 10's figures: the zero mask's training loss far below −∞'s, its inference
    loss (the held-out sentences generated token by token) far above."""
    doc = json.loads(resource("tasks", "toy-corpus.task.json").read_text(encoding="utf-8"))
    first_held_out = doc["held_out"][0][0].split()
    losses = {}
    for mask in ("causal", "causal-zero"):
        log = tmp_path / f"{mask}.csv"
        out = str(tmp_path / f"{mask}.attn.json")
        code, stdout, _ = run(capsys, "--preset", "stage-10-leak", "--task", "toy-corpus",
                              "--mask", mask, "--seed", "2", "--steps", "300", "--lr", "0.02",
                              "--out", out, "--log", str(log))  # fmt: skip
        assert code == 0 and "on toy-corpus for 300 steps (adam, lr 0.02, seed 2)" in stdout
        losses[mask] = summary(stdout)
        with open(log) as f:
            rows = list(csv.DictReader(f))
        assert len(rows) == 301 and rows[-1]["step"] == "300"
        assert float(rows[-1]["loss"]) == pytest.approx(losses[mask]["train"], rel=1e-5)
        assert float(rows[-1]["inference"]) == pytest.approx(losses[mask]["inference"], rel=1e-5)
        assert sum(bool(r["held_out"]) for r in rows) == 101  # every hundredth, and the start
        trained = load_scenario(tmp_path / f"{mask}.attn.json")
        assert list(trained.tokens) == first_held_out  # the layer over a held-out sentence
    causal, zero = losses["causal"], losses["causal-zero"]
    assert causal["inference"] == pytest.approx(causal["held_out"], rel=1e-9)
    assert zero["train"] < causal["train"] / 100 and zero["inference"] > 10 * causal["inference"]


def test_an_interrupted_run_writes_nothing(capsys, tmp_path, monkeypatch):
    from attnviz.core.maths import training

    calls = []

    def interrupted(self):
        calls.append(1)
        if len(calls) == 5:
            raise KeyboardInterrupt
        return 1.0

    monkeypatch.setattr(training.Trainer, "step", interrupted)
    out, log = tmp_path / "t.attn.json", tmp_path / "t.csv"
    code, stdout, err = run(capsys, "--steps", "50", "--out", str(out), "--log", str(log))
    assert code == 130 and "interrupted" in err and not stdout
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--task", "copy", "--loss", "cell"], "--loss and --target apply to --task scenario"),
        (["--task", "nope"], "argument --task: invalid choice: 'nope'"),
        (["--task", "copy", "--train", "X"], "train 'X': expected some of E, W_Q"),
        (["--task", "copy", "--batch", "300"], "batch: expected a whole number from 1 to 256"),
        (["--task", "copy", "--preset", "cross-attention"], "a task trains self-attention"),
    ],
)
def test_bad_task_arguments_are_one_line(capsys, tmp_path, args, message):
    code, out, err = run(capsys, "--steps", "5", "--out", str(tmp_path / "t.attn.json"), *args)
    assert code == 2 and not out and err.count("\n") == 1 and message in err
    assert not list(tmp_path.iterdir())


def test_the_task_names_are_the_shipped_tasks():
    from attnviz.cli import TASK_NAMES
    from attnviz.core.maths.tasks import TASKS

    assert TASK_NAMES == TASKS
