"""Training steps against torch autograd plus torch.optim, step for step in float64, over
100 steps, through the layer written again in torch primitives (backward_reference.py)."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import backward_reference as ref  # noqa: E402
from scenario_strategies import VARIANTS, make  # noqa: E402

from attnviz.core.maths.losses import preset_target  # noqa: E402
from attnviz.core.maths.optimizers import Optimizer, State, train_step  # noqa: E402
from attnviz.core.maths.scenario import ScenarioError  # noqa: E402

STEPS = 100


def torch_optimizer(kind: str, params, opt: Optimizer):
    if kind == "sgd":
        return torch.optim.SGD(params, lr=opt.lr, weight_decay=opt.weight_decay)
    if kind == "momentum":
        return torch.optim.SGD(
            params, lr=opt.lr, momentum=opt.momentum, weight_decay=opt.weight_decay
        )
    made = torch.optim.Adam if kind == "adam" else torch.optim.AdamW
    return made(params, lr=opt.lr, betas=opt.betas, eps=opt.eps, weight_decay=opt.weight_decay)


def torch_run(s, opt: Optimizer, trains, steps: int) -> tuple[list[float], dict]:
    leaves, _ = ref.forward(s, None)
    params = [leaves[name] for name in trains]
    optimizer = torch_optimizer(opt.kind, params, opt)
    losses = []
    st = s.settings
    for _ in range(steps):
        optimizer.zero_grad()
        values = {name: leaf.detach().numpy().copy() for name, leaf in leaves.items()}
        current = dataclasses.replace(s, **values)
        leaves_now, inter = ref.forward(current, None)  # a fresh graph on the current values …
        T = preset_target(values["X"], st.loss_target) if st.loss == "target" else None
        L = ref.loss_of(current, inter["final"], leaves_now["X"], st.loss, T, st.loss_cell)
        L.backward()
        for name, leaf in zip(trains, params, strict=True):  # … its gradients to our params
            leaf.grad = leaves_now[name].grad.clone()
        if opt.clip is not None:
            torch.nn.utils.clip_grad_norm_(params, opt.clip)
        optimizer.step()
        losses.append(L.item())
    return losses, {name: leaves[name].detach().numpy() for name in trains}


OPTIMIZER_CASES = {  # each optimiser, with weight decay and clipping
    "sgd": Optimizer("sgd", lr=0.05),
    "sgd-decay": Optimizer("sgd", lr=0.05, weight_decay=0.01),
    "momentum": Optimizer("momentum", lr=0.02, momentum=0.9),
    "adam": Optimizer("adam", lr=0.01),
    "adam-decay-clip": Optimizer("adam", lr=0.01, weight_decay=0.01, clip=0.5),
    "adamw": Optimizer("adamw", lr=0.01, weight_decay=0.1),
}


@pytest.mark.parametrize("opt", OPTIMIZER_CASES.values(), ids=OPTIMIZER_CASES.keys())
@pytest.mark.parametrize("variant", ["plain", "everything-rope"])
def test_a_hundred_steps_equal_torch_optim(opt, variant):
    s = make(**VARIANTS[variant]).with_settings(loss="next-token")
    trains = ("W_Q", "W_K", "W_V", "W_O", "X")
    want_losses, want = torch_run(s, opt, trains, STEPS)
    state, losses = State(), []
    for _ in range(STEPS):
        s, state, value = train_step(s, opt, state, trains)
        losses.append(value)
    # (a loss near 0 is a difference of nearly equal numbers: to 1e-10 of where it began)
    np.testing.assert_allclose(losses, want_losses, rtol=1e-10, atol=1e-10 * want_losses[0])
    for name in trains:
        got = np.asarray(getattr(s, name))
        scale = np.abs(want[name]).max()
        assert np.abs(got - want[name]).max() <= 1e-10 * scale, name
    assert losses[-1] < losses[0]  # it learned


def test_only_the_chosen_matrices_move():
    s = make()
    moved, _, _ = train_step(s, Optimizer("sgd"), State(), ("W_V",))
    assert not np.array_equal(moved.W_V, s.W_V)
    for name in ("X", "W_Q", "W_K", "W_O", "b_O"):
        np.testing.assert_array_equal(
            np.asarray(getattr(moved, name)), np.asarray(getattr(s, name))
        )


@pytest.mark.parametrize(
    ("make_it", "message"),
    [
        (lambda: Optimizer("rmsprop"), "optimizer 'rmsprop'"),
        (lambda: Optimizer(lr=-1.0), "lr: expected a number in [0, 1000), got -1.0"),
        (lambda: Optimizer(clip=0.0), "clip: expected a positive number"),
        (lambda: train_step(make(), Optimizer(), State(), ("settings",)), "train 'settings'"),
    ],
)
def test_bad_options_are_named(make_it, message):
    with pytest.raises(ScenarioError, match=re.escape(message)):
        make_it()
