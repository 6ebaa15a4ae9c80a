"""The Inspector's training step of one entry (core/maths/explain_step.py) against torch:
the entry before the step, its gradient, the optimiser's buffers after it (torch.optim's
state) and the entry after it, for each optimiser, with weight decay and clipping."""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")

import backward_reference as ref  # noqa: E402
from test_optimizers import OPTIMIZER_CASES, torch_optimizer  # noqa: E402

from attnviz.core.maths.explain_step import explain_step  # noqa: E402
from attnviz.core.maths.optimizers import Optimizer  # noqa: E402
from attnviz.core.maths.training import Trainer  # noqa: E402
from attnviz.core.presets import worked_example  # noqa: E402

TRAINS = ("W_Q", "W_O")
CELL = ("W_Q", (1, 2, 0))
STEPS = 4


def torch_steps(s, opt: Optimizer, steps: int):
    """The run in torch; the last step's entry before, raw gradient, state and after."""
    leaves, _ = ref.forward(s, None)
    params = [leaves[name] for name in TRAINS]
    optimizer = torch_optimizer(opt.kind, params, opt)
    for _ in range(steps):
        before = {name: leaf.detach().numpy().copy() for name, leaf in leaves.items()}
        optimizer.zero_grad()
        now, inter = ref.forward(dataclasses.replace(s, **before), None)
        ref.loss_of(s, inter["final"], now["X"], "next-token", None, None).backward()
        raw = {name: now[name].grad.detach().numpy().copy() for name in TRAINS}
        for name, leaf in zip(TRAINS, params, strict=True):
            leaf.grad = now[name].grad.clone()
        if opt.clip is not None:
            torch.nn.utils.clip_grad_norm_(params, opt.clip)
        optimizer.step()
    name, cell = CELL
    state = optimizer.state[params[TRAINS.index(name)]]
    buffers = {k: v.detach().numpy()[cell] for k, v in state.items() if k != "step"}
    after = params[TRAINS.index(name)].detach().numpy()[cell]
    return before[name][cell], raw[name][cell], buffers, after


@pytest.mark.parametrize("opt", OPTIMIZER_CASES.values(), ids=OPTIMIZER_CASES.keys())
def test_the_step_written_out_is_the_step_taken(opt):
    s = worked_example().with_settings(loss="next-token")
    trainer = Trainer(s, opt, trains=TRAINS)
    for _ in range(STEPS):
        trainer.step()
    name, cell = CELL
    e = explain_step(trainer.last, name, cell, "W_Q[3,1] (head 2)")
    assert e.value == trainer.layer.W_Q[cell]  # the entry the run holds, to the bit
    before, raw, buffers, after = torch_steps(s, opt, STEPS)
    steps = {step.label.split(",")[0].split(" =")[0]: step.value for step in e.steps}
    assert steps[f"p before step {STEPS}"] == pytest.approx(before, rel=1e-10)
    assert steps["g"] == pytest.approx(raw, rel=1e-10)
    assert e.value == pytest.approx(after, rel=1e-10)
    if opt.kind in ("adam", "adamw"):
        assert steps["m"] == pytest.approx(buffers["exp_avg"], rel=1e-10)
        assert steps["v"] == pytest.approx(buffers["exp_avg_sq"], rel=1e-10)
    if opt.kind == "momentum":
        assert steps["b"] == pytest.approx(buffers["momentum_buffer"], rel=1e-10)
    assert ("clipped" in " ".join(step.label for step in e.steps)) == (opt.clip is not None)
    assert f"step {STEPS}" in e.note and opt.kind in e.note


def test_an_entry_that_did_not_train_has_no_step():
    trainer = Trainer(worked_example(), Optimizer("sgd"), trains=("W_Q",))
    trainer.step()
    with pytest.raises(KeyError):
        explain_step(trainer.last, "W_K", (0, 0, 0), "W_K[1,1] (head 1)")
    with pytest.raises(IndexError):
        explain_step(trainer.last, "W_Q", (5, 0, 0), "W_Q[1,1] (head 6)")
