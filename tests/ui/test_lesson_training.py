"""The training stages' "Try this" (lessons 10-13), done through the window: the stage
sets up the Training dock, Step plays the stage's run, and what the dock, Heads and
Pipeline then show is checked against the trained layer in independent NumPy
(variant_reference.py) and a cross-entropy written here."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from variant_reference import reference
from waiting import look_at_pipeline, settle

from attnviz.core.lessons import STAGES

pytestmark = pytest.mark.usefixtures("warnings_shown", "answers")


@pytest.fixture
def trained(shown_window, qtbot):
    """Go to a training stage, press Step in the Training dock, wait for the run."""

    def go(number: int):
        window = shown_window()
        window.resize(1440, 900)
        window.lesson.go(number - 1)
        settle(qtbot, window)
        panel = window.training_panel
        assert panel.steps.value() == STAGES[number - 1].training.steps
        panel.step_button.click()
        window.training.wait()
        settle(qtbot, window)
        return window, panel

    return go


def last(panel, key: str, other: bool = False) -> float:
    return float(panel.curves[key, other].yData[-1])


def cross_entropy(window, examples, mask: str | None = None) -> float:
    """The mean loss over the task's examples, by hand, from the run's layer and table."""
    run = window.training.run
    layer, E, task = run.main.layer, run.main.E, run.main.task
    values = []
    for ex in examples:
        s = layer.with_settings(dropout=0.0, **({"mask": mask} if mask else {}))
        s = dataclasses.replace(s, X=E[list(ex.tokens)], tokens=task.words(ex))
        logits = reference(s)["final"] @ E.T
        log_p = logits - logits.max(axis=1, keepdims=True)
        log_p -= np.log(np.exp(log_p).sum(axis=1, keepdims=True))
        values.append(np.mean([-np.mean(log_p[i, list(a)]) for i, a in enumerate(ex.targets) if a]))
    return float(np.mean(values))


def heads_shown(window, qtbot) -> list[np.ndarray]:
    window.bring_forward(("Heads",))
    heads = window.heads
    qtbot.waitUntil(lambda: all(v.spec is not None for v in heads.views), timeout=10000)
    weights = reference(window.doc.scenario)["weights"]
    assert len(heads.views) == len(weights)
    for view, want in zip(heads.views, weights, strict=True):
        np.testing.assert_allclose(view.spec.values, want, atol=1e-12)
    return [view.spec.values for view in heads.views]


def test_stage_10_the_zero_mask_trains_far_lower_and_generates_far_worse(trained, qtbot):
    window, panel = trained(10)
    task = window.training.run.main.task
    assert window.doc.scenario.settings.mask == "causal-zero"  # the views: the leaky run
    zero_train, causal_train = last(panel, "train"), last(panel, "train", other=True)
    zero_infer, causal_infer = last(panel, "inference"), last(panel, "inference", other=True)
    assert zero_train == pytest.approx(cross_entropy(window, task.train), rel=1e-9)
    assert zero_infer == pytest.approx(cross_entropy(window, task.held_out, "causal"), rel=1e-9)
    assert zero_train < 0.002 and causal_train > 0.7  # the lesson's "about 0.001 … 0.77"
    assert zero_infer > 14 and causal_infer < 0.9  # "past 14, against 0.84"
    n = window.doc.scenario.n
    for P in heads_shown(window, qtbot):  # a quarter to a half of each row on the future
        assert 0.25 < np.triu(P, 1).sum() / (n - 1) < 0.6


def test_stage_11_unscaled_stays_near_chance_with_one_hot_rows(trained, qtbot):
    window, panel = trained(11)
    task = window.training.run.main.task
    chance = np.log(len(task.vocabulary))
    assert not window.doc.scenario.settings.scale
    assert last(panel, "train") == pytest.approx(cross_entropy(window, task.train), rel=1e-9)
    assert last(panel, "train") > 0.85 * chance and last(panel, "train", other=True) < 0.25
    look_at_pipeline(window)
    shown = window.pipeline.views["weights"].spec.values
    np.testing.assert_allclose(shown, reference(window.doc.scenario)["weights"][0], atol=1e-12)
    assert shown[1:].max(axis=1).mean() > 0.85  # almost one-hot


def test_stage_12_one_head_reads_the_previous_letter_the_other_the_first(trained, qtbot):
    window, panel = trained(12)
    n = window.doc.scenario.n
    mass = [
        (np.mean([P[i, i - 1] for i in range(2, n)]), np.mean([P[i, 0] for i in range(2, n)]))
        for P in heads_shown(window, qtbot)
    ]
    previous = max(range(2), key=lambda h: mass[h][0])
    first = 1 - previous
    assert mass[previous][0] > 0.6 and mass[previous][1] < 0.1
    assert mass[first][1] > 0.9 and mass[first][0] < 0.1
    assert panel.slider.maximum() > 10  # snapshots to scrub back through
    panel.slider.setValue(0)
    settle(qtbot, window)
    untrained = heads_shown(window, qtbot)  # the start: neither pattern yet
    assert max(np.mean([P[i, 0] for i in range(2, n)]) for P in untrained) < 0.9


def test_stage_13_the_steps_under_dropout_lose_more_than_the_layer_without_it(trained):
    window, panel = trained(13)
    task = window.training.run.main.task
    assert window.doc.scenario.settings.dropout == 0.3
    assert last(panel, "train") == pytest.approx(cross_entropy(window, task.train), rel=1e-9)
    assert last(panel, "inference") == pytest.approx(
        cross_entropy(window, task.held_out, "causal"), rel=1e-9
    )
    assert last(panel, "seen") > last(panel, "train") + 0.15
    assert last(panel, "inference") < last(panel, "seen")
