"""The training lessons' claims, for five seeds each (the run's seed: the embedding table's
start, the batches' order, the dropout masks), on the lessons' own presets. Each claim's
losses are checked once more against the trained layer computed by independent NumPy
(variant_reference.py) and a cross-entropy written here."""

from __future__ import annotations

import numpy as np
import pytest
from variant_reference import reference

from attnviz.core.maths.optimizers import Optimizer
from attnviz.core.maths.tasks import Task, load_task, on_example
from attnviz.core.maths.training import Trainer
from attnviz.core.presets import make_preset

SEEDS = range(5)


def cross_entropy(trainer: Trainer, task: Task, examples, *, mask: str | None = None) -> float:
    """The mean loss over the examples, by hand: the trained layer in NumPy, logits
    against E, the uniform target over each position's answers."""
    values = []
    for ex in examples:
        s = on_example(trainer.layer, task, trainer.E, ex).with_settings(dropout=0.0)
        if mask:
            s = s.with_settings(mask=mask)
        logits = reference(s)["final"] @ trainer.E.T
        log_p = logits - logits.max(axis=1, keepdims=True)
        log_p -= np.log(np.exp(log_p).sum(axis=1, keepdims=True))
        scored = [-np.mean(log_p[i, list(a)]) for i, a in enumerate(ex.targets) if a]
        values.append(np.mean(scored))
    return float(np.mean(values))


def trained(preset: str, task: str, seed: int, steps: int, lr: float, **settings) -> Trainer:
    s = make_preset(preset)
    if settings:
        s = s.with_settings(**settings)
    trainer = Trainer(s, Optimizer("adam", lr=lr), load_task(task), seed=seed)
    for _ in range(steps):
        trainer.step()
    return trainer


@pytest.mark.parametrize("seed", SEEDS)
def test_the_zero_mask_reads_the_answer_in_training_and_fails_at_inference(seed):
    task = load_task("toy-corpus")
    causal = trained("stage-10-leak", "toy-corpus", seed, 300, 0.02, mask="causal")
    zero = trained("stage-10-leak", "toy-corpus", seed, 300, 0.02, mask="causal-zero")
    c, z = causal.losses(), zero.losses()
    assert z.train == pytest.approx(cross_entropy(zero, task, task.train), rel=1e-9)
    assert z.inference == pytest.approx(
        cross_entropy(zero, task, task.held_out, mask="causal"), rel=1e-9
    )
    assert c.inference == pytest.approx(c.held_out, rel=1e-12)  # −∞: the two agree
    assert z.train < c.train / 100  # the leak: far below what −∞ can reach …
    assert z.inference > 10 * c.inference  # … and far worse once the future is gone
    # every future key scores 0: the leaky heads keep weight on the future (the answer among it)
    n = zero.scenario.n
    for head in reference(zero.scenario)["weights"]:
        assert np.triu(head, 1).sum() / (n - 1) > 0.2


@pytest.mark.parametrize("seed", SEEDS)
def test_without_scaling_a_wide_head_barely_learns(seed):
    task = load_task("previous-token")
    unscaled = trained("stage-11-saturation", "previous-token", seed, 100, 0.01)
    scaled = trained("stage-11-saturation", "previous-token", seed, 100, 0.01, scale=True)
    chance = np.log(len(task.vocabulary))
    u, s = unscaled.losses(), scaled.losses()
    assert u.train == pytest.approx(cross_entropy(unscaled, task, task.train), rel=1e-9)
    assert u.train > 0.85 * chance and u.held_out > 0.85 * chance
    assert s.train < 0.1 * chance and s.held_out < 0.15 * chance
    # what Pipeline shows (the first held-out example): rows one-hot, or on the letter before
    stuck = reference(unscaled.scenario)["weights"][0][1:]
    learned = reference(scaled.scenario)["weights"][0]
    assert stuck.max(axis=1).mean() > 0.85
    assert np.mean([learned[i, i - 1] for i in range(1, len(learned))]) > 0.6


@pytest.mark.parametrize("seed", SEEDS)
def test_two_heads_take_one_pattern_each(seed):
    task = load_task("previous-and-first")
    trainer = trained("stage-12-specialise", "previous-and-first", seed, 600, 0.01)
    mass = np.zeros((2, 2))  # head × (previous token, first token)
    for ex in task.held_out:
        weights = reference(on_example(trainer.layer, task, trainer.E, ex))["weights"]
        for h, P in enumerate(weights):
            rows = range(2, len(ex.tokens))
            mass[h] += [np.mean([P[i, i - 1] for i in rows]), np.mean([P[i, 0] for i in rows])]
    mass /= len(task.held_out)
    previous, first = np.argmax(mass[:, 0]), np.argmax(mass[:, 1])
    assert previous != first
    assert mass[previous, 0] > 0.6 and mass[previous, 1] < 0.1
    assert mass[first, 1] > 0.9 and mass[first, 0] < 0.1
    assert trainer.losses().held_out < np.log(2) + 0.5  # both answers, each near ½ (chance: ln 24)


@pytest.mark.parametrize("seed", SEEDS)
def test_dropout_raises_the_training_loss_not_the_inference_loss(seed):
    task = load_task("toy-corpus")
    trainer = Trainer(make_preset("stage-13-dropout"), Optimizer("adam", lr=0.02),
                      task, seed=seed)  # fmt: skip
    with_dropout = [trainer.step() for _ in range(300)]
    losses = trainer.losses()
    assert losses.train == pytest.approx(cross_entropy(trainer, task, task.train), rel=1e-9)
    assert losses.inference == pytest.approx(
        cross_entropy(trainer, task, task.held_out, mask="causal"), rel=1e-9
    )
    assert np.mean(with_dropout[-50:]) > losses.train + 0.15
