"""Training tasks: the shipped files are what packaging/make_tasks.py writes and say what
their descriptions promise; an example's loss and every gradient (the embedding table's
included) equal torch autograd through the layer written again in torch primitives."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from attnviz.assets import resource
from attnviz.core.maths.scenario import ScenarioError, Settings
from attnviz.core.maths.tasks import (
    TASKS,
    embedding_table,
    example_gradients,
    load_task,
    on_example,
)
from attnviz.core.presets import small_model

ROOT = Path(__file__).resolve().parent.parent


def _generator():
    spec = importlib.util.spec_from_file_location("make_tasks", ROOT / "packaging/make_tasks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", TASKS)
def test_each_file_is_what_its_generator_writes_and_small(name):
    path = resource("tasks", f"{name}.task.json")
    assert path.read_text(encoding="utf-8") == _generator().text(name)
    assert path.stat().st_size < 12_000


def raw(name):
    doc = json.loads(resource("tasks", f"{name}.task.json").read_text(encoding="utf-8"))
    return [(a.split(), b.split()) for a, b in doc["train"] + doc["held_out"]]


def test_the_tasks_ask_what_they_say():
    for tokens, targets in raw("toy-corpus"):
        assert targets == [*tokens[1:], "_"]
    for tokens, targets in raw("copy"):
        assert tokens[4] == "=" and tokens[5:] == tokens[:4]
        assert targets == ["_"] * 4 + tokens[:4] + ["_"]
    for tokens, targets in raw("previous-token"):
        assert targets == ["_", *tokens[:-1]]
    for tokens, targets in raw("previous-and-first"):
        for i in range(2, len(tokens)):
            assert targets[i].split("+") == [tokens[i - 1], tokens[0].upper()]
    for tokens, targets in raw("induction"):
        a, b = tokens[1], tokens[2]
        assert tokens[-1] == a and tokens.count(a) == 2 and targets == ["_"] * 7 + [b]


def test_each_task_holds_out_examples_it_does_not_train_on():
    for name in TASKS:
        task = load_task(name)
        assert len(task.held_out) == 16 and len(task.train) == (80 if name == "toy-corpus" else 144)
        words = {task.words(ex) for ex in task.train}
        assert len(words) == len(task.train)
        assert not any(task.words(ex) in words for ex in task.held_out)


def test_an_unknown_task_is_named():
    with pytest.raises(ScenarioError, match="task 'nope': expected one of toy-corpus"):
        load_task("nope")


@pytest.mark.parametrize(
    ("name", "settings"),
    [
        ("toy-corpus", Settings(positional="rope")),
        ("previous-and-first", Settings(mask="causal-zero", positional="sinusoidal")),
        ("copy", Settings(dropout=0.3, dropout_seed=4, qk_norm="rms")),
    ],
)
def test_an_examples_gradients_equal_autograd(name, settings):
    torch = pytest.importorskip("torch")
    import backward_reference as ref

    task = load_task(name)
    example = task.train[5]
    s = small_model(task.words(example), 6, 2, 3, seed=3, settings=settings)
    E = embedding_table(task, 6, seed=1)
    s = on_example(s, task, E, example)
    np.testing.assert_array_equal(np.asarray(s.X), E[list(example.tokens)])
    g, d_E = example_gradients(s, E, example)

    from attnviz.core.maths.forward import compute

    keep = compute(s).keep if settings.dropout else None
    leaves, inter = ref.forward(s, keep)
    E_t = ref.t(E).requires_grad_()
    log_p = torch.log_softmax(inter["final"] @ E_t.T, dim=1)
    terms = []
    for i, answers in enumerate(example.targets):
        if answers:
            terms.append(-sum(log_p[i, a] for a in answers) / len(answers))
    loss = sum(terms) / len(terms)
    loss.backward()
    want_E = E_t.grad.clone().index_add_(0, torch.tensor(example.tokens), leaves["X"].grad)
    assert g.loss == pytest.approx(loss.item(), rel=1e-12)
    np.testing.assert_allclose(d_E, want_E.numpy(), atol=1e-12 * np.abs(d_E).max())
    for w in ("W_Q", "W_K", "W_V", "W_O"):
        np.testing.assert_allclose(g.inputs[w], leaves[w].grad.numpy(), atol=1e-12, rtol=1e-9)
