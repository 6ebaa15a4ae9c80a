"""The Trainer: a run is the same bit for bit from the same seed; a task's full-batch run
equals torch autograd plus torch.optim step for step (the embedding table included);
losses are measured without dropout; wrong settings get one clear message."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest

from attnviz.core.maths.optimizers import Optimizer
from attnviz.core.maths.scenario import ScenarioError, Settings
from attnviz.core.maths.tasks import Example, Task, load_task
from attnviz.core.maths.training import Trainer, inference_view
from attnviz.core.presets import make_preset, small_model


def state(trainer: Trainer) -> dict[str, np.ndarray]:
    s = trainer.layer
    return {"E": trainer.E, **{w: np.asarray(getattr(s, w)) for w in ("W_Q", "W_K", "W_V", "W_O")}}


def test_the_same_seed_gives_the_same_run_bit_for_bit():
    def run(seed: int) -> tuple[list[float], dict[str, np.ndarray]]:
        trainer = Trainer(make_preset("stage-13-dropout"), Optimizer("adam", lr=0.02),
                          load_task("toy-corpus"), seed=seed)  # fmt: skip
        return [trainer.step() for _ in range(15)], state(trainer)

    (a_losses, a), (b_losses, b), (c_losses, _) = run(3), run(3), run(4)
    assert a_losses == b_losses and a_losses != c_losses
    for name in a:
        np.testing.assert_array_equal(a[name], b[name])


def tiny_task() -> Task:
    """Three examples over four words; position i names a word or two."""
    ex = (
        Example((0, 1, 2), ((), (2,), (3, 0))),
        Example((3, 3, 1, 0), ((1,), (), (0,), (2,))),
        Example((2, 0), ((0, 1), (1,))),
    )
    return Task("tiny", "Tiny", "", ("w", "x", "y", "z"), ex, ex[:1])


@pytest.mark.parametrize("kind", ["sgd", "momentum", "adam", "adamw"])
def test_a_full_batch_task_run_equals_autograd_and_torch_optim(kind):
    torch = pytest.importorskip("torch")
    import backward_reference as ref

    task = tiny_task()
    s = small_model(("a", "b", "c"), 4, 2, 2, seed=2, settings=Settings(positional="rope"))
    opt = Optimizer(kind, lr=0.05, weight_decay=0.01 if kind != "sgd" else 0.0)
    trainer = Trainer(s, opt, task, seed=9, batch=3)  # every example every step
    names = ("W_Q", "W_K", "W_V", "W_O")
    params = {"E": ref.t(trainer.E).requires_grad_(),
              **{w: ref.t(getattr(s, w)).requires_grad_() for w in names}}  # fmt: skip
    made = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}
    if kind == "momentum":
        optimizer = torch.optim.SGD(params.values(), lr=0.05, momentum=0.9, weight_decay=0.01)
    else:
        optimizer = made[kind](params.values(), lr=0.05, weight_decay=opt.weight_decay)
    for _ in range(30):
        optimizer.zero_grad()
        grads = {name: torch.zeros_like(p) for name, p in params.items()}
        total = 0.0
        for ex in task.train:
            E = params["E"].detach()
            values = {w: params[w].detach().numpy() for w in names}
            one = dataclasses.replace(
                s, X=E.numpy()[list(ex.tokens)], tokens=("t",) * len(ex.tokens), **values
            )
            leaves, inter = ref.forward(one, None)
            E_leaf = E.clone().requires_grad_()
            log_p = torch.log_softmax(inter["final"] @ E_leaf.T, dim=1)
            terms = [
                -sum(log_p[i, a] for a in ans) / len(ans) for i, ans in enumerate(ex.targets) if ans
            ]
            loss = sum(terms) / len(terms) / 3
            loss.backward()
            total += loss.item()
            grads["E"] += E_leaf.grad.index_add(0, torch.tensor(ex.tokens), leaves["X"].grad)
            for w in names:
                grads[w] += leaves[w].grad
        for name, p in params.items():
            p.grad = grads[name]
        optimizer.step()
        assert trainer.step() == pytest.approx(total, rel=1e-10)
    got = state(trainer)
    for name, p in params.items():
        np.testing.assert_allclose(got[name], p.detach().numpy(), rtol=1e-10, atol=1e-12)


def test_losses_are_measured_without_dropout_and_steps_train_with_it():
    task = load_task("toy-corpus")
    opt = Optimizer("sgd", lr=0.0)  # nothing moves: only dropout tells the runs apart
    dropped = Trainer(make_preset("stage-13-dropout"), opt, task, seed=1)
    plain = Trainer(make_preset("stage-13-dropout").with_settings(dropout=0.0), opt, task, seed=1)
    assert dropped.losses() == plain.losses()
    assert dropped.step() != plain.step()


def test_under_a_task_the_scenario_is_the_layer_over_the_first_held_out_example():
    task = load_task("copy")
    trainer = Trainer(make_preset("stage-10-leak"), Optimizer("adam"), task, seed=0)
    trainer.step()
    s = trainer.scenario
    assert s.tokens == tuple(task.vocabulary[i] for i in task.held_out[0].tokens)
    np.testing.assert_array_equal(np.asarray(s.X), trainer.E[list(task.held_out[0].tokens)])


@pytest.mark.parametrize(
    ("mask", "seen"),
    [("causal", "causal"), ("causal-zero", "causal"), ("none", "causal"),
     ("drop-after-softmax", "causal"), ("sliding-window", "sliding-window")],
)  # fmt: skip
def test_inference_sees_only_the_past(mask, seen):
    s = make_preset("worked-example").with_settings(mask=mask, dropout=0.5)
    assert inference_view(s).settings.mask == seen and inference_view(s).settings.dropout == 0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"seed": -1}, "seed: expected an integer in [0, 2^32)"),
        ({"batch": 0}, "batch: expected a whole number from 1 to 256"),
        ({"trains": ["X"]}, "train 'X': expected some of E, W_Q"),
    ],
)
def test_wrong_settings_are_named(kwargs, message):
    with pytest.raises(ScenarioError, match=re.escape(message)):
        Trainer(make_preset("worked-example"), Optimizer(), load_task("copy"), **kwargs)


def test_a_task_refuses_cross_attention():
    with pytest.raises(ScenarioError, match="a task trains self-attention"):
        Trainer(make_preset("cross-attention"), Optimizer(), load_task("copy"))


@pytest.mark.parametrize("task", [None, "copy"])
def test_a_diverging_run_is_named_and_stays_at_its_last_good_step(task):
    trainer = Trainer(make_preset("stage-10-leak"), Optimizer("sgd", lr=900.0),
                      None if task is None else load_task(task), seed=0)  # fmt: skip
    with pytest.raises(ScenarioError, match=r"step [\d,]+ diverged \(.*\); try a smaller") as e:
        for _ in range(500):
            trainer.step()
    k = int(re.search(r"step ([\d,]+)", str(e.value)).group(1).replace(",", ""))
    assert trainer.steps == k - 1
    assert all(np.all(np.abs(a) <= 1e6) for a in state(trainer).values() if a is not None)
