"""The Training dock: a run plays off the UI thread, is one undoable step, draws a fresh
Trainer's losses, puts the trained weights in every view, scrubs through its snapshots,
pauses for an edit, compares two runs, resets, and fits the dock at 1280 × 720."""

from __future__ import annotations

import numpy as np
import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication, QLabel, QScrollArea

from attnviz.core.maths.optimizers import Optimizer
from attnviz.core.maths.tasks import load_task
from attnviz.core.maths.training import Trainer
from attnviz.core.maths.training_run import RunConfig
from attnviz.core.presets import worked_example
from attnviz.core.session import SetCells
from tests.ui.waiting import settle

SGD = RunConfig(optimizer="sgd", lr=0.05, seed=2, eval_every=2)


@pytest.fixture
def train(make_window, qtbot):
    def make(scenario=None, size=(1440, 900)):
        window = make_window(scenario or worked_example())
        window.resize(*size)
        window.show()
        qtbot.waitExposed(window)
        window.workspaces.switch("train")
        settle(qtbot, window)
        return window, window.training_panel

    return make


def fresh_trainer(steps: int, config: RunConfig = SGD, scenario=None) -> Trainer:
    """An independent Trainer, stepped ``steps`` times."""
    task = None if config.task is None else load_task(config.task)
    trainer = Trainer(
        scenario or worked_example(), Optimizer(config.optimizer, lr=config.lr), task,
        seed=config.seed, batch=config.batch,
    )  # fmt: skip
    for _ in range(steps):
        trainer.step()
    return trainer


def grid_values(window, name: str, head: int | None) -> np.ndarray:
    """What the Weights dock's grid shows (its full-precision edit text)."""
    model = window.weights.grids[(name, head)].model()
    return np.array([
        [float(model.data(model.index(r, c), Qt.ItemDataRole.EditRole))
         for c in range(model.columnCount())]
        for r in range(model.rowCount())
    ])  # fmt: skip


def test_play_then_pause_is_one_undo_step_and_undo_restores_the_start(train, qtbot):
    window, panel = train()
    before, entries = window.doc.scenario, window.doc.undo_stack.count()
    panel.set_config(SGD)
    qtbot.keyClick(panel.play_button, Qt.Key.Key_Space)  # Space: play
    assert window.training.running
    qtbot.waitUntil(lambda: window.training.progress.step >= 4, timeout=20000)
    panel.toggle()  # pause
    window.training.wait()
    steps = window.training.progress.step
    assert window.doc.undo_stack.count() == entries + 1
    assert window.doc.undo_stack.undoText() == f"Train {steps} steps"
    trained = fresh_trainer(steps).scenario
    np.testing.assert_array_equal(window.doc.scenario.W_Q, trained.W_Q)
    settle(qtbot, window)
    np.testing.assert_array_equal(grid_values(window, "W_Q", 0), trained.W_Q[0])
    window.doc.undo_stack.undo()
    assert window.doc.scenario is before
    np.testing.assert_array_equal(grid_values(window, "W_Q", 0), before.W_Q[0])


def test_the_curves_are_a_fresh_trainers_losses(train):
    window, panel = train()
    panel.start(SGD, steps=6)
    window.training.wait()
    curve = panel.curves["train", False]
    steps, shown = list(curve.xData), list(curve.yData)
    assert steps == [0, 2, 4, 6]
    trainer = fresh_trainer(0)
    expected = []
    for step in range(7):
        if step in steps:
            expected.append(trainer.losses().train)
        if step < 6:
            trainer.step()
    np.testing.assert_allclose(shown, expected, rtol=1e-12)
    assert "step 6" in panel.readout.text()
    assert "inference" in panel.legend.text() and "held" not in panel.legend.text()


def test_scrubbing_shows_the_layer_at_that_step_and_makes_it_the_result(train, qtbot):
    window, panel = train()
    before = window.doc.scenario
    panel.start(SGD, steps=6)
    window.training.wait()
    entries = window.doc.undo_stack.count()
    panel.slider.setValue(1)  # the snapshot at step 2
    assert panel.slider_label.text() == "step 2"
    np.testing.assert_array_equal(window.doc.scenario.W_Q, fresh_trainer(2).scenario.W_Q)
    settle(qtbot, window)
    np.testing.assert_array_equal(grid_values(window, "W_Q", 1), fresh_trainer(2).scenario.W_Q[1])
    assert window.doc.undo_stack.count() == entries
    assert window.doc.undo_stack.undoText() == "Train 2 steps"
    window.doc.undo_stack.undo()
    assert window.doc.scenario is before


def test_an_edit_during_a_run_pauses_it_and_is_applied(train, qtbot):
    window, panel = train()
    panel.start(SGD)
    qtbot.waitUntil(lambda: window.doc.undo_stack.count() >= 1, timeout=20000)
    shown = window.doc.scenario
    window.doc.push(SetCells(window.doc.session, "X", None, 0, 0, np.array([[7.5]])))
    assert not window.training.running
    assert window.doc.scenario.X[0, 0] == 7.5
    np.testing.assert_array_equal(window.doc.scenario.W_Q, shown.W_Q)  # the run stopped there
    qtbot.wait(300)  # nothing of the run arrives after the edit
    assert window.doc.scenario.X[0, 0] == 7.5 and not window.training.running
    window.doc.undo_stack.undo()  # the edit
    np.testing.assert_array_equal(window.doc.scenario.X, shown.X)
    np.testing.assert_array_equal(window.doc.scenario.W_Q, shown.W_Q)
    window.doc.undo_stack.undo()  # the run
    np.testing.assert_array_equal(window.doc.scenario.W_Q, worked_example().W_Q)


def test_the_leaky_comparison_run_learns_lower_and_generates_worse(train):
    rope = worked_example().with_settings(positional="rope")
    window, panel = train(rope)
    config = RunConfig(task="toy-corpus", compare="mask", lr=0.02, seed=0, eval_every=20)
    panel.start(config, steps=60)
    window.training.wait()
    assert window.doc.scenario.tokens == tuple(
        load_task("toy-corpus").words(load_task("toy-corpus").held_out[0])
    )
    zero_train, causal_train = panel.curves["train", True], panel.curves["train", False]
    assert list(zero_train.xData) == [0, 20, 40, 60]
    assert zero_train.yData[-1] < causal_train.yData[-1]
    assert panel.curves["inference", True].yData[-1] > panel.curves["inference", False].yData[-1]
    expected = fresh_trainer(60, config, rope).losses()
    assert causal_train.yData[-1] == pytest.approx(expected.train, rel=1e-12)
    for name in ("train (causal −∞)", "train (causal\u2011zero)", "inference (causal\u2011zero)"):
        assert name.replace(" ", "&nbsp;") in panel.legend.text()


def test_controls_that_cannot_change_mid_run_are_off_and_say_why(train, qtbot):
    window, panel = train()
    panel.start(SGD)
    assert not panel.task.isEnabled() and "pause" in panel.task.toolTip()
    assert not panel.optimizer.isEnabled() and panel.play_button.text() == "Pause"
    window.training.pause()
    window.training.wait()
    assert panel.task.isEnabled() and "pause" not in panel.task.toolTip()


def test_reset_forgets_the_run_but_not_the_history(train):
    window, panel = train()
    panel.start(SGD, steps=4)
    window.training.wait()
    trained, entries = window.doc.scenario, window.doc.undo_stack.count()
    panel.reset_button.click()
    assert panel.curves["train", False].xData is None  # nothing drawn
    assert not panel.slider.isEnabled() and "No run yet" in panel.readout.text()
    assert window.doc.scenario is trained and window.doc.undo_stack.count() == entries
    panel.start(SGD, steps=2)  # a new run from the trained layer
    window.training.wait()
    assert list(panel.curves["train", False].xData) == [0, 2]


@pytest.mark.parametrize("size", [(1280, 720), (1440, 900)], ids=["1280x720", "1440x900"])
def test_the_dock_fits_its_words_at_the_window_sizes(train, size):
    window, panel = train(size=size)
    panel.start(RunConfig(compare="mask", eval_every=1), steps=2)
    window.training.wait()
    for _ in range(5):
        QApplication.processEvents()
    scroll = window.docks["Training"].widget()
    assert isinstance(scroll, QScrollArea)
    viewport = scroll.viewport().size()
    assert panel.width() <= viewport.width() and panel.height() <= viewport.height()
    for label in panel.findChildren(QLabel):
        if label.isVisible() and not label.wordWrap() and label.text():
            assert label.fontMetrics().horizontalAdvance(label.text()) <= label.width() + 1, (
                label.text()
            )
    assert panel.legend.isVisible() and panel.slider.isVisible()


def test_play_goes_on_with_the_same_settings_and_starts_anew_with_others(train):
    window, panel = train()
    panel.start(SGD, steps=4)
    window.training.wait()
    panel.set_config(SGD)
    panel.step_button.click()  # one more step of the same run
    window.training.wait()
    assert window.training.progress.step == 5
    np.testing.assert_array_equal(window.doc.scenario.W_Q, fresh_trainer(5).scenario.W_Q)
    panel.lr.setValue(0.01)  # another rate: a new run from what the document shows
    panel.step_button.click()
    window.training.wait()
    assert window.training.progress.step == 1


def test_the_loss_axis_labels_a_few_round_values_in_range():
    from attnviz.ui.panels.training import log_ticks

    assert [label for _, label in log_ticks(0.18, 36.4)] == ["0.3", "1", "3", "10", "30"]
    assert [label for _, label in log_ticks(0.05, 0.3)] == ["0.05", "0.1", "0.2"]
    for position, label in log_ticks(0.6, 12.2):
        assert position == pytest.approx(np.log10(float(label)))  # the axis is log10


def test_under_dropout_the_steps_own_losses_are_drawn_above_the_evaluated_ones(train):
    window, panel = train(worked_example().with_settings(positional="rope", dropout=0.3))
    config = RunConfig(task="toy-corpus", compare="dropout", lr=0.02, seed=0, eval_every=10)
    panel.start(config, steps=40)
    window.training.wait()
    seen, train_curve = panel.curves["seen", False], panel.curves["train", False]
    assert list(seen.xData) == [10, 20, 30, 40]
    fresh = fresh_trainer(0, config, worked_example().with_settings(positional="rope", dropout=0.3))
    steps = [fresh.step() for _ in range(40)]
    expected = [np.mean(steps[k : k + 10]) for k in range(0, 40, 10)]
    np.testing.assert_allclose(seen.yData, expected, rtol=1e-12)
    assert seen.yData[-1] > train_curve.yData[-1]  # dropout's noise costs while training
    assert not panel.curves["seen", True].xData  # the twin trains without dropout
    assert "steps,&nbsp;with&nbsp;dropout" in panel.legend.text()


def test_a_trained_cell_clicked_shows_its_last_step_in_the_inspector(train, qtbot):
    window, panel = train()
    config = RunConfig(optimizer="adam", lr=0.05, seed=2, eval_every=2)
    panel.start(config, steps=3)
    window.training.wait()
    settle(qtbot, window)
    grid = window.weights.grids[("W_Q", 1)]
    grid.setCurrentIndex(grid.model().index(2, 0))  # head 2's W_Q[3,1], as a click does
    text = window.inspector.view.toPlainText()
    assert "W_Q[3,1] (head 2): the last training step" in text
    before = fresh_trainer(2, config).layer.W_Q[1, 2, 0]
    after = window.doc.scenario.W_Q[1, 2, 0]
    for value in (before, after):  # the entry before and after step 3, with Adam's m and v
        assert f"{value:.6g}".replace("-", "−") in text
    assert "m = m + (1 − β₁)·(g − m)" in text.replace("\u00a0", " ")
    window.doc.undo_stack.undo()  # the grids no longer show the run's last step
    settle(qtbot, window)
    assert "latest training step here" in window.inspector.view.toPlainText()
