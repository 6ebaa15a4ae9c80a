"""`attnviz grad`: every gradient, the same numbers as autograd through the layer written
again in torch (backward_reference.py); bad losses get one line."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import backward_reference as ref  # noqa: E402

from attnviz.cli import main  # noqa: E402
from attnviz.core.presets import make_preset  # noqa: E402


def run(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["grad", *args])
    out, err = capsys.readouterr()
    return code, out, err


def autograd(s, kind: str, target=None, cell=(0, 0)) -> dict:
    leaves, inter = ref.forward(s, None)
    ref.loss_of(s, inter["final"], leaves["X"], kind, target, cell).backward()
    return {name: leaf.grad.numpy() for name, leaf in leaves.items() if leaf.grad is not None}


@pytest.mark.parametrize(
    ("loss", "kind", "cell"), [("next-token", "next-token", None), ("cell:3,2", "cell", (2, 1))]
)
def test_json_gives_autograd_s_gradients(capsys, loss, kind, cell):
    s = make_preset("llama-style")
    code, out, err = run(capsys, "--preset", "llama-style", "--loss", loss, "--format", "json")
    assert code == 0 and not err
    doc = json.loads(out)
    want = autograd(s, kind, cell=cell or (0, 0))
    for name, grad in want.items():
        np.testing.assert_allclose(doc["inputs"][name], grad, rtol=1e-10, atol=1e-13, err_msg=name)
    assert doc["loss"]["kind"] == kind


def test_text_names_each_gradient_and_prints_the_target_loss(capsys):
    s = make_preset("worked-example")
    X = np.asarray(s.X)
    T = np.concatenate([X[:1], X[:-1]])  # the previous token's row
    want = autograd(s, "target", target=T)
    code, out, _ = run(capsys)
    assert code == 0
    _, inter = ref.forward(s, None)
    loss = 0.5 * float(((inter["final"].detach().numpy() - T) ** 2).sum())
    assert re.search(r"^loss target \(previous-token\) = (\S+)$", out, re.M)[1] == f"{loss:.10g}"
    block = out.split("dL/dW_Q (head 2):\n")[1].split("\n\n")[0].splitlines()[1:]
    printed = np.array([[float(v) for v in line.split()[1:]] for line in block])
    np.testing.assert_allclose(printed, want["W_Q"][1], atol=5e-5)
    for name in ("dL/dX:", "dL/dW_O:", "== head 1 ==", "dL/dscores:", "dL/dfinal:"):
        assert name in out


@pytest.mark.parametrize(
    ("loss", "message"),
    [
        ("cell:5,1", "--loss cell:5,1: the output is 4×4"),
        ("cell:0,1", "--loss cell:0,1: the output is 4×4"),
        ("nonsense", "--loss 'nonsense': expected target, next-token or cell:I,J"),
    ],
)
def test_a_bad_loss_is_one_line(capsys, loss, message):
    code, out, err = run(capsys, "--loss", loss)
    assert code == 2 and not out and err.count("\n") == 1 and message in err


def test_next_token_needs_two_tokens(capsys, tmp_path):
    from attnviz.core.io.files import save_scenario
    from attnviz.core.maths.scenario import Scenario

    path = tmp_path / "one.attn.json"
    save_scenario(path, Scenario(tokens=("a",), X=np.ones((1, 2)), W_Q=np.ones((1, 2, 2)),
                                 W_K=np.ones((1, 2, 2)), W_V=np.ones((1, 2, 2)),
                                 W_O=np.ones((2, 2))))  # fmt: skip
    code, _, err = run(capsys, str(path), "--loss", "next-token")
    assert code == 2 and "at least 2 tokens" in err
