"""The toolbar's sliding window: chosen as a mask, sized by its own spin box, undoable."""

from __future__ import annotations

import numpy as np


def test_choosing_and_sizing_the_window(make_window, qtbot):
    window = make_window()
    window.show()
    qtbot.waitExposed(window)
    assert not window.window_action.isVisible()  # only with the sliding-window mask
    window.mask_box.textActivated.emit("sliding-window")
    assert window.doc.scenario.settings.mask == "sliding-window"
    assert window.window_action.isVisible() and window.window_spin.value() == 4
    window.window_spin.setValue(2)  # what pressing Enter on a typed 2 commits
    window.compute.wait()
    assert window.doc.scenario.settings.window == 2
    # The Pipeline's masked scores: −∞ outside i − 2 < j ≤ i, hatched there.
    i, j = np.indices((4, 4))
    hidden = (j > i) | (j <= i - 2)
    spec = window.pipeline.views["masked"].spec
    np.testing.assert_array_equal(np.isneginf(spec.values), hidden)
    np.testing.assert_array_equal(spec.masked, hidden)
    assert "sliding window of 2" in window.pipeline.legend.text()
    window.doc.undo_stack.undo()
    assert window.doc.scenario.settings.window == 4 and window.window_spin.value() == 4
    window.doc.undo_stack.undo()
    assert window.doc.scenario.settings.mask == "causal"
    assert not window.window_action.isVisible()
