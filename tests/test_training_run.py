"""The training run the window plays (attnviz.core.maths.training_run), without Qt: its
curves are a fresh Trainer's losses at the same steps, the comparison run differs as the
leak predicts, snapshots stay few, and a chunk stops between steps."""

from __future__ import annotations

import numpy as np
import pytest

from attnviz.core.maths.losses import gradients
from attnviz.core.maths.optimizers import Optimizer
from attnviz.core.maths.scenario import ScenarioError
from attnviz.core.maths.tasks import load_task
from attnviz.core.maths.training import Trainer
from attnviz.core.maths.training_run import MAX_POINTS, RunConfig, TrainingRun, compared
from attnviz.core.presets import worked_example

ROPE = worked_example().with_settings(positional="rope")


def test_the_curves_are_a_fresh_trainers_losses_at_the_same_steps():
    config = RunConfig(optimizer="sgd", lr=0.05, seed=3, eval_every=2)
    run = TrainingRun(worked_example(), config)
    assert run.advance(60.0, lambda: False, limit=6) == 6
    fresh = Trainer(worked_example(), Optimizer("sgd", lr=0.05), seed=3)
    points = {p.step: p.main for p in run.progress().points}
    assert sorted(points) == [0, 2, 4, 6]
    for step in range(7):
        if step in points:
            expected = fresh.losses()
            assert points[step].train == expected.train
            assert points[step].inference == expected.inference
        if step < 6:
            fresh.step()


def test_one_sgd_step_is_w_minus_lr_times_its_gradient():
    run = TrainingRun(worked_example(), RunConfig(optimizer="sgd", lr=0.1, trains=("W_Q",)))
    g = gradients(worked_example()).inputs["W_Q"]  # the reference backward pass
    run.advance(60.0, lambda: False, limit=1)
    expected = np.asarray(worked_example().W_Q) - 0.1 * g
    np.testing.assert_allclose(run.progress().scenario.W_Q, expected, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(run.progress().scenario.W_K, worked_example().W_K)


def test_the_leaky_mask_trains_lower_and_generates_worse():
    config = RunConfig(task="toy-corpus", compare="mask", lr=0.02, seed=0, eval_every=20)
    run = TrainingRun(ROPE, config)
    run.advance(600.0, lambda: False, limit=60)
    progress = run.progress()
    assert progress.names == ("causal −∞", "causal-zero")
    last = progress.points[-1]
    assert last.step == 60 and last.other is not None
    assert last.other.train < last.main.train  # the leak reads the answer
    assert last.other.inference > last.main.inference  # and generation cannot
    assert last.main.inference == pytest.approx(last.main.held_out)  # −∞: the same pass


def test_the_comparison_changes_one_setting():
    assert compared(ROPE, "mask").settings.mask == "causal-zero"
    assert compared(ROPE.with_settings(mask="causal-zero"), "mask").settings.mask == "causal"
    assert compared(ROPE, "scale").settings.scale is False
    assert compared(ROPE.with_settings(dropout=0.1), "dropout").settings.dropout == 0.0
    with pytest.raises(ScenarioError):
        compared(ROPE, "colour")


def test_snapshots_are_the_layer_at_their_step_and_stay_few():
    run = TrainingRun(worked_example(), RunConfig(optimizer="sgd", lr=0.01, eval_every=1))
    run.advance(600.0, lambda: False, limit=2 * MAX_POINTS + 5)
    progress = run.progress()
    assert len(progress.snapshots) <= MAX_POINTS and progress.snapshots[0][0] == 0
    steps = [step for step, _ in progress.snapshots]
    assert steps == sorted(steps)
    step, scenario = progress.snapshots[len(steps) // 2]
    fresh = Trainer(worked_example(), Optimizer("sgd", lr=0.01))
    for _ in range(step):
        fresh.step()
    np.testing.assert_array_equal(scenario.W_Q, fresh.scenario.W_Q)


def test_a_chunk_stops_between_steps_when_asked():
    run = TrainingRun(worked_example(), RunConfig())
    asked = iter([False, False, True])
    assert run.advance(60.0, lambda: next(asked)) == 2
    assert run.steps == 2 and run.steps_per_second > 0


def test_a_bad_setting_is_refused_before_the_run():
    with pytest.raises(ScenarioError):
        TrainingRun(worked_example(), RunConfig(task="poetry"))
    with pytest.raises(ScenarioError):
        TrainingRun(worked_example(), RunConfig(compare="colour"))


def test_the_same_run_is_the_same_settings_whatever_the_evaluation():
    plain = RunConfig(optimizer="sgd", lr=0.05)
    assert plain.same_run(RunConfig(optimizer="sgd", lr=0.05, eval_every=3))
    assert plain.same_run(RunConfig(optimizer="sgd", lr=0.05, trains=("W_V", "W_O", "W_Q", "W_K")))
    assert not plain.same_run(RunConfig(optimizer="sgd", lr=0.01))
    assert not plain.same_run(RunConfig(optimizer="sgd", lr=0.05, trains=("W_Q",)))


def test_each_point_keeps_the_mean_loss_its_steps_saw():
    dropped = ROPE.with_settings(dropout=0.3)
    config = RunConfig(task="toy-corpus", compare="dropout", lr=0.02, seed=1, eval_every=3)
    run = TrainingRun(dropped, config)
    run.advance(600.0, lambda: False, limit=6)
    task = load_task("toy-corpus")
    for scenario, side in ((dropped, 0), (ROPE, 1)):
        fresh = Trainer(scenario, Optimizer("adam", lr=0.02), task, seed=1)
        seen = [fresh.step() for _ in range(6)]
        got = [p.seen[side] for p in run.progress().points]
        assert got[0] is None
        assert got[1:] == pytest.approx([np.mean(seen[:3]), np.mean(seen[3:])], rel=1e-12)
