"""What current models add, used through the window as a learner would: bias rows, KV
heads (GQA/MQA), cross-attention, the Variants dock (soft-cap, sinks, RoPE, QK-norm,
ALiBi slopes, scale, a custom mask), the RoPE and Heads docks, and the new presets.

Expected numbers are worked out here with plain NumPy from the values typed in (or the
brief's matrices in ``reference``), never read back from the code under test.
"""

from __future__ import annotations

import dataclasses
import math
import re

import numpy as np
import pytest
import reference as ref
from PySide6.QtCore import QEvent, QPoint, Qt
from PySide6.QtGui import QKeyEvent
from PySide6.QtWidgets import (
    QAbstractItemView,
    QApplication,
    QComboBox,
    QGroupBox,
    QInputDialog,
    QLabel,
    QLineEdit,
    QPushButton,
    QSpinBox,
)
from variant_reference import paper_slopes
from waiting import look_at_pipeline

from attnviz.core.maths.forward import compute
from attnviz.core.maths.results import HEAD_MATRICES, Result
from attnviz.core.presets import make_preset, worked_example
from attnviz.core.session import SetCells

pytestmark = pytest.mark.usefixtures("warnings_shown", "answers")

CTRL = Qt.KeyboardModifier.ControlModifier
TOKENS = ("she", "saw", "the", "cat")
FUTURE = np.triu(np.ones((4, 4), dtype=bool), k=1)
NEW_PRESETS = ("llama-style", "sinks", "alibi", "cross-attention", "qk-norm", "softcap")


# Plain references, written from the formulas -------------------------------------------------


def softmax(S: np.ndarray) -> np.ndarray:
    """Row softmax of scores that may hold −∞ (every row sees at least one key here)."""
    e = np.exp(S - S.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def masked(S: np.ndarray, hidden: np.ndarray) -> np.ndarray:
    out = S.copy()
    out[hidden] = -np.inf
    return out


def turned(A: np.ndarray, pos, base: float, style: str, dims: int) -> np.ndarray:
    """RoPE by hand, pair by pair: pair i turns by pos · base^(−2i/dims)."""
    out = np.array(A, dtype=np.float64)
    half = dims // 2
    for r, p in enumerate(pos):
        for i in range(half):
            a, b = (i, i + half) if style == "half" else (2 * i, 2 * i + 1)
            theta = p * base ** (-2 * i / dims)
            x, y = A[r, a], A[r, b]
            out[r, a] = x * math.cos(theta) - y * math.sin(theta)
            out[r, b] = x * math.sin(theta) + y * math.cos(theta)
    return out


def rms(A: np.ndarray, weight, eps: float) -> np.ndarray:
    return np.array(
        [row / math.sqrt(sum(v * v for v in row) / len(row) + eps) * weight for row in A]
    )


def close(got, want) -> None:
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)


# Driving the widgets --------------------------------------------------------------------------


def type_into(qtbot, grid, row: int, col: int, text: str) -> None:
    """Type text into a cell the way a user does: select it, type, press Enter."""
    qtbot.waitUntil(grid.isVisible)
    if QApplication.activeWindow() is not grid.window():  # (a passing popup took it)
        with qtbot.waitActive(grid.window()):
            grid.window().activateWindow()
    grid.setFocus()
    grid.setCurrentIndex(grid.model().index(row, col))
    qtbot.keyClicks(grid, text[0])  # any key opens the editor with that key in it
    editor = QApplication.focusWidget()
    assert editor is not grid and grid.state() == QAbstractItemView.State.EditingState
    qtbot.keyClicks(editor, text[1:])
    qtbot.keyClick(editor, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: grid.state() != QAbstractItemView.State.EditingState)


def type_line(qtbot, edit: QLineEdit, text: str) -> None:
    """Replace a line edit's text by typing, then press Enter."""
    qtbot.waitUntil(edit.isVisible)
    edit.setFocus()
    edit.selectAll()
    qtbot.keyClick(edit, Qt.Key.Key_Backspace)
    if text:
        qtbot.keyClicks(edit, text)
    qtbot.keyClick(edit, Qt.Key.Key_Return)


def type_spin(qtbot, spin: QSpinBox, value: int) -> None:
    """Type a number into a spin box and press Enter (what commits it)."""
    spin.setFocus()
    spin.selectAll()
    qtbot.keyClicks(spin, str(value))
    qtbot.keyClick(spin, Qt.Key.Key_Return)


def choose(qtbot, combo: QComboBox, text: str) -> None:
    """Pick an item of a closed combo box with the arrow keys (which emits activated)."""
    target = combo.findText(text)
    assert target >= 0, text
    combo.setFocus()
    while combo.currentIndex() != target:
        key = Qt.Key.Key_Down if combo.currentIndex() < target else Qt.Key.Key_Up
        qtbot.keyClick(combo, key)


def click_cell(qtbot, grid, row: int, col: int) -> None:
    qtbot.waitUntil(grid.isVisible)
    rect = grid.visualRect(grid.model().index(row, col))
    qtbot.mouseClick(grid.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())


def message(window) -> str:
    return window.statusBar().currentMessage()


def view(window, name: str, head: int = 0):
    """The Pipeline's spec of view name for head (shown in the Pipeline first)."""
    window.compute.wait()
    look_at_pipeline(window)
    window.view_state.set_head(head)
    return window.pipeline.views[name].spec


def dock(window, qtbot, title: str):
    """Bring a dock forward and return its panel once it is on screen."""
    window.bring_forward((title,))
    panel = window.panel(title)
    qtbot.waitUntil(panel.isVisible)
    return panel


@pytest.fixture
def window(shared_window, qtbot):
    """The shared window, active, on the worked example with an empty undo history."""
    shared_window.doc.reset(worked_example(), None)
    shared_window.view_state.set_head(0)
    shared_window.compute.wait()
    if QApplication.activeWindow() is not shared_window:
        qtbot.waitExposed(shared_window)
        with qtbot.waitActive(shared_window):
            shared_window.activateWindow()
    shared_window.bring_forward(("Pipeline",))
    shared_window.statusBar().clearMessage()
    return shared_window


# Biases ---------------------------------------------------------------------------------------


def test_a_typed_bias_shifts_q_by_exactly_that_and_undo_takes_it_back(window, qtbot):
    weights = window.weights
    weights.biases.setChecked(False)  # a plain scenario: no bias rows until asked for
    assert ("b_Q", 0) not in weights.grids and not weights.b_o.isVisible()
    qtbot.mouseClick(weights.biases, Qt.MouseButton.LeftButton)
    assert weights.biases.isChecked() and weights.b_o.isVisible()
    assert ("b_Q", 0) in weights.grids and ("b_K", 0) in weights.grids
    box_labels = [label.text() for label in weights.tabs.widget(0).findChildren(QLabel)]
    assert {"bias b_Q", "bias b_K", "bias b_V"} <= set(box_labels)
    Q = ref.X @ ref.W_Q[0]

    type_into(qtbot, weights.grids[("b_Q", 0)], 0, 1, "0.5")
    assert window.doc.scenario.b_Q[0, 0].tolist() == [0.0, 0.5]
    spec = view(window, "Q")
    close(spec.values, Q + np.array([0.0, 0.5]))
    assert "+ b_Q" in spec.title and "+ biases" in window.pipeline.legend.text()
    # The scores see the shifted Q; head 2 is untouched.
    K = ref.X @ ref.W_K[0]
    close(view(window, "scores").values, (Q + np.array([0.0, 0.5])) @ K.T)
    close(view(window, "Q", 1).values, ref.X @ ref.W_Q[1])

    qtbot.keyClick(window, Qt.Key.Key_Z, CTRL)
    assert not window.doc.scenario.b_Q.any()
    close(view(window, "Q").values, Q)
    assert "+ b_Q" not in view(window, "Q").title
    assert "+ biases" not in window.pipeline.legend.text()


def test_b_k_b_v_and_b_o_rows_shift_k_v_and_the_final_output(window, qtbot):
    weights = window.weights
    weights.biases.setChecked(True)
    type_into(qtbot, weights.grids[("b_K", 0)], 0, 0, "-0.25")
    type_into(qtbot, weights.grids[("b_V", 0)], 0, 1, "1")
    type_into(qtbot, weights.grids[("b_O", None)], 0, 3, "0.125")
    X = ref.X
    Q = X @ ref.W_Q[0]
    K = X @ ref.W_K[0] + [-0.25, 0.0]
    V = X @ ref.W_V[0] + [0.0, 1.0]
    close(view(window, "K").values, K)
    close(view(window, "V").values, V)
    W = softmax(masked(Q @ K.T / math.sqrt(2), FUTURE))
    close(view(window, "weights").values, W)
    out0 = W @ V
    _, out1 = ref.head(X, ref.W_Q[1], ref.W_K[1], ref.W_V[1])[1:]
    final = np.concatenate([out0, out1], axis=1) @ ref.W_O + [0, 0, 0, 0.125]
    close(window.compute.result.final, final)
    assert window.doc.undo_stack.count() == 3
    for _ in range(3):
        window.doc.undo_stack.undo()
    _, _, out = ref.multi_head(X, ref.W_Q, ref.W_K, ref.W_V, ref.W_O)
    close(window.compute.result.final, out)


# Key/value heads --------------------------------------------------------------------------------


def group_titles(window, head: int) -> list[str]:
    """The titles of a head's grids, as its tab shows them once chosen."""
    window.weights.tabs.setCurrentIndex(head)
    return [box.title() for box in window.weights.tabs.widget(head).findChildren(QGroupBox)]


def test_one_kv_head_makes_every_head_read_the_same_keys_and_values(window, qtbot):
    weights = window.weights
    assert weights.kv_heads.value() == 2
    type_spin(qtbot, weights.kv_heads, 1)
    s = window.doc.scenario
    assert s.kv_heads == 1 and s.n_heads == 2
    for head in (0, 1):
        close(view(window, "K", head).values, ref.X @ ref.W_K[0])  # the group's first head's
        close(view(window, "V", head).values, ref.X @ ref.W_V[0])
        close(view(window, "Q", head).values, ref.X @ ref.W_Q[head])
        assert "W_K · KV head 1 (heads 1–2)" in group_titles(window, head)
        assert "W_V · KV head 1 (heads 1–2)" in group_titles(window, head)
    # Head 2 now scores against head 1's keys.
    K = ref.X @ ref.W_K[0]
    Q1 = ref.X @ ref.W_Q[1]
    close(view(window, "weights", 1).values, softmax(masked(Q1 @ K.T / math.sqrt(2), FUTURE)))
    window.doc.undo_stack.undo()
    assert window.doc.scenario.kv_heads == 2 and weights.kv_heads.value() == 2
    close(view(window, "K", 1).values, ref.X @ ref.W_K[1])


def test_a_kv_head_count_that_does_not_divide_the_heads_is_refused(window, qtbot):
    weights = window.weights
    type_spin(qtbot, weights.heads, 4)
    s = window.doc.scenario
    assert (s.n_heads, s.kv_heads) == (4, 4)
    count = window.doc.undo_stack.count()
    type_spin(qtbot, weights.kv_heads, 3)
    text = message(window)
    assert "3 does not divide 4" in text and "1, 2, 4" in text, text
    assert window.doc.scenario is s and window.doc.undo_stack.count() == count
    assert weights.kv_heads.value() == 4
    # A divisor goes through: heads 1–2 share KV head 1, heads 3–4 KV head 2.
    type_spin(qtbot, weights.kv_heads, 2)
    assert window.doc.scenario.kv_heads == 2 and weights.kv_heads.value() == 2
    assert "W_K · KV head 2 (heads 3–4)" in group_titles(window, 3)
    assert weights.tabs.tabToolTip(2) == "reads KV head 2"


def test_the_heads_dock_groups_heads_by_their_kv_head(window, qtbot):
    window.load_preset("llama-style")
    heads = dock(window, qtbot, "Heads")
    wanted = ["head 1 · KV 1", "head 2 · KV 1", "head 3 · KV 2", "head 4 · KV 2"]
    qtbot.waitUntil(
        lambda: [v.spec.caption if v.spec else None for v in heads.views] == wanted, timeout=3000
    )
    # A group's heads side by side, in order; a group never split across rows.
    at = [v.geometry().topLeft() for v in heads.views]
    assert at[0].y() == at[1].y() and at[0].x() < at[1].x()
    assert at[2].y() == at[3].y() and at[2].x() < at[3].x()
    # Back to one KV head per query head: plain captions.
    type_spin(qtbot, window.weights.kv_heads, 4)
    qtbot.waitUntil(lambda: heads.views[2].spec.caption == "head 3", timeout=3000)


def test_editing_a_shared_w_k_changes_its_whole_group(window, qtbot):
    window.load_preset("llama-style")
    window.compute.wait()
    before = window.doc.scenario
    K_before = [np.array(view(window, "K", h).values) for h in range(4)]
    window.view_state.set_head(1)  # head 2's tab: its W_K box is KV head 1's, shared with head 1
    grid = window.weights.tabs.widget(1).findChild(QAbstractItemView, "grid-W_K-0")
    assert grid is not None
    type_into(qtbot, grid, 2, 1, "0.75")
    window.compute.wait()
    s = window.doc.scenario
    W_K = np.array(before.W_K)
    W_K[0, 2, 1] = 0.75
    np.testing.assert_array_equal(s.W_K, W_K)
    K0 = np.array(before.X) @ W_K[0]
    for h in (0, 1):  # the group of KV head 1
        close(view(window, "K", h).values, K0)
    for h in (2, 3):  # the other group: untouched
        np.testing.assert_array_equal(view(window, "K", h).values, K_before[h])
    assert not np.allclose(K0, K_before[0])
    # The grid of head 1's tab shows the same shared cell.
    other = window.weights.tabs.widget(0).findChild(QAbstractItemView, "grid-W_K-0")
    assert other.model().index(2, 1).data() == "0.75"
    # The result equals a full compute.
    got, want = window.compute.result, compute(s)
    assert isinstance(got, Result)
    for h in range(4):
        for name in (*HEAD_MATRICES, "Q_rot", "K_rot"):
            close(got.matrix(name, h), want.matrix(name, h))
    close(got.final, want.final)


# Cross-attention --------------------------------------------------------------------------------


def test_cross_attention_keys_come_from_x_kv(window, qtbot, monkeypatch):
    inputs = window.inputs
    assert not inputs.kv_box.isVisible() and inputs.kv_grid is None
    inputs.cross.click()
    s = window.doc.scenario
    assert s.cross and s.kv_tokens == TOKENS
    qtbot.waitUntil(inputs.kv_box.isVisible)
    assert inputs.kv_grid is not None and inputs.m.value() == 4
    scores = view(window, "scores")
    assert scores.values.shape == (4, 4) and scores.col_labels == TOKENS

    # An X_kv cell changes K and V, not Q.
    type_into(qtbot, inputs.kv_grid, 0, 0, "2")
    X_kv = ref.X.copy()
    X_kv[0, 0] = 2.0
    close(view(window, "K").values, X_kv @ ref.W_K[0])
    close(view(window, "V").values, X_kv @ ref.W_V[0])
    close(view(window, "Q").values, ref.X @ ref.W_Q[0])
    np.testing.assert_array_equal(window.doc.scenario.X, ref.X)

    # Six keys: two new (zero) rows; the scores become 4 × 6 with the keys' labels.
    type_spin(qtbot, inputs.m, 6)
    s = window.doc.scenario
    assert s.m == 6 and s.kv_tokens == (*TOKENS, "k5", "k6")
    X_kv = np.vstack([X_kv, np.zeros((2, 4))])
    Q, K = ref.X @ ref.W_Q[0], X_kv @ ref.W_K[0]
    scores = view(window, "scores")
    assert scores.values.shape == (4, 6) and scores.col_labels == (*TOKENS, "k5", "k6")
    assert scores.row_labels == TOKENS
    i, j = np.indices((4, 6))
    hidden = j > i  # top-left: query i sees keys 0 … i
    close(view(window, "weights").values, softmax(masked(Q @ K.T / math.sqrt(2), hidden)))
    assert view(window, "K").values.shape == (6, 2)
    assert "× 6 keys" in window.pipeline.legend.text()

    # Renaming a key token: double-click its row label.
    monkeypatch.setattr(QInputDialog, "getText", lambda *a, **k: ("chat", True))
    header = inputs.kv_grid.verticalHeader()
    y = header.sectionViewportPosition(1) + header.sectionSize(1) // 2
    qtbot.mouseDClick(header.viewport(), Qt.MouseButton.LeftButton, pos=QPoint(5, y))
    assert window.doc.scenario.kv_tokens[1] == "chat"
    assert view(window, "weights").col_labels[1] == "chat"
    assert window.doc.scenario.tokens == TOKENS

    # Off again: keys are the tokens of X, the grid goes.
    inputs.cross.click()
    s = window.doc.scenario
    assert not s.cross and s.X_kv is None and s.m == 4
    qtbot.waitUntil(lambda: not inputs.kv_box.isVisible())
    assert inputs.kv_grid is None
    scores = view(window, "scores")
    assert scores.values.shape == (4, 4) and scores.col_labels == TOKENS
    close(view(window, "K").values, ref.X @ ref.W_K[0])
    assert "keys" not in window.pipeline.legend.text()
    # Undo brings X_kv back as it was.
    window.doc.undo_stack.undo()
    assert window.doc.scenario.m == 6 and inputs.cross.isChecked()
    close(view(window, "K").values, K)


def test_bottom_right_alignment_lines_the_last_query_up_with_the_last_key(window, qtbot):
    window.inputs.cross.click()
    type_spin(qtbot, window.inputs.m, 6)
    variants = dock(window, qtbot, "Variants")
    choose(qtbot, variants.alignment, "bottom-right")
    assert window.doc.scenario.settings.causal_alignment == "bottom-right"
    i, j = np.indices((4, 6))
    np.testing.assert_array_equal(np.isneginf(view(window, "masked").values), j > i + 2)
    assert "bottom-right" in window.pipeline.legend.text()


# The Variants dock ----------------------------------------------------------------------------


def test_soft_cap_and_scale_typed_in_the_variants_dock(window, qtbot):
    variants = dock(window, qtbot, "Variants")
    S = (ref.X @ ref.W_Q[0]) @ (ref.X @ ref.W_K[0]).T
    type_line(qtbot, variants.softcap, "0.5")
    assert window.doc.scenario.settings.softcap == 0.5
    close(view(window, "scaled").values, 0.5 * np.tanh(S / math.sqrt(2) / 0.5))
    assert "soft-cap 0.5" in window.pipeline.legend.text()
    type_line(qtbot, variants.scale_value, "0.25")
    close(view(window, "scaled").values, 0.5 * np.tanh(S * 0.25 / 0.5))
    assert "× 0.25" in window.pipeline.legend.text()

    # Text that is not a number, or a cap that is not positive: a message, nothing changed.
    count, s = window.doc.undo_stack.count(), window.doc.scenario
    for bad in ("abc", "0", "-2"):
        type_line(qtbot, variants.softcap, bad)
        assert "nothing was changed" in message(window), bad
        assert "oft" in message(window), message(window)  # names the soft-cap
        assert window.doc.scenario is s and window.doc.undo_stack.count() == count
        assert variants.softcap.text() == "0.5"
    # Empty turns it off again.
    type_line(qtbot, variants.softcap, "")
    assert window.doc.scenario.settings.softcap is None
    close(view(window, "scaled").values, S * 0.25)


def test_sinks_take_a_share_of_each_row(window, qtbot):
    variants = dock(window, qtbot, "Variants")
    assert "sink" not in window.pipeline.names
    type_line(qtbot, variants.sinks, "0.5, 2")
    assert window.doc.scenario.settings.sinks == (0.5, 2.0)
    look_at_pipeline(window)
    assert "sink" in window.pipeline.names and "sink" in window.pipeline.legend.text()
    for head, sink in ((0, 0.5), (1, 2.0)):
        scaled, _, _ = ref.head(ref.X, ref.W_Q[head], ref.W_K[head], ref.W_V[head])
        e = np.where(FUTURE, 0.0, np.exp(scaled))
        Z = e.sum(axis=1) + math.exp(sink)
        share = math.e**sink / Z
        close(view(window, "sink", head).values[:, 0], share)
        W = view(window, "weights", head).values
        close(W, e / Z[:, None])
        close(W.sum(axis=1), 1 - share)
        assert view(window, "sink", head).col_labels == ("sink",)

    # Bad text, or not one number per head: a message, nothing changed.
    count, s = window.doc.undo_stack.count(), window.doc.scenario
    for bad, says in (("abc", "Sinks"), ("1 2 3", "3 numbers for 2"), ("1", "1 numbers for 2")):
        type_line(qtbot, variants.sinks, bad)
        assert says in message(window) and "nothing was changed" in message(window), bad
        assert window.doc.scenario is s and window.doc.undo_stack.count() == count
        assert variants.sinks.text() == "0.5, 2"
    # Cleared: no sink, rows sum to 1 again and the view goes.
    type_line(qtbot, variants.sinks, "")
    assert window.doc.scenario.settings.sinks is None
    assert "sink" not in window.pipeline.names
    close(view(window, "weights").values.sum(axis=1), np.ones(4))


def test_alibi_slopes_typed_per_head(window, qtbot):
    window.pos_box.textActivated.emit("alibi")  # the toolbar's Position box
    variants = dock(window, qtbot, "Variants")
    i, j = np.indices((4, 4))
    S = (ref.X @ ref.W_Q[1]) @ (ref.X @ ref.W_K[1]).T / math.sqrt(2)
    # The paper's slopes for 2 heads: 2^(−8/2 · h), h = 1, 2.
    close(view(window, "scaled", 1).values, S - 2**-8 * np.abs(i - j))
    type_line(qtbot, variants.alibi, "0.5 0.25")
    assert window.doc.scenario.settings.alibi_slopes == (0.5, 0.25)
    close(view(window, "scaled", 1).values, S - 0.25 * np.abs(i - j))
    type_line(qtbot, variants.alibi, "0.5")
    assert "1 numbers for 2" in message(window)
    assert window.doc.scenario.settings.alibi_slopes == (0.5, 0.25)


def test_rope_settings_turn_q_as_typed(window, qtbot):
    window.load_preset("llama-style")
    variants = dock(window, qtbot, "Variants")
    s = window.doc.scenario
    Q = np.array(s.X) @ s.W_Q[0]
    pos = range(s.n)
    assert "Q_rot" in window.pipeline.names and "K_rot" in window.pipeline.names
    spec = view(window, "Q_rot")
    close(spec.values, turned(Q, pos, 10000.0, "half", 4))
    assert "RoPE" in spec.title
    type_line(qtbot, variants.rope_base, "100")
    assert window.doc.scenario.settings.rope_base == 100.0
    close(view(window, "Q_rot").values, turned(Q, pos, 100.0, "half", 4))
    choose(qtbot, variants.rope_style, "interleaved")
    assert window.doc.scenario.settings.rope_style == "interleaved"
    close(view(window, "Q_rot").values, turned(Q, pos, 100.0, "interleaved", 4))
    type_spin(qtbot, variants.rope_dims, 2)
    assert window.doc.scenario.settings.rope_dims == 2
    got = view(window, "Q_rot").values
    close(got, turned(Q, pos, 100.0, "interleaved", 2))
    close(got[:, 2:], Q[:, 2:])  # the features past rope_dims are not turned
    # K turns the same way (positions 0 … n − 1 for the keys too).
    K = np.array(s.X) @ s.W_K[0]
    close(view(window, "K_rot").values, turned(K, pos, 100.0, "interleaved", 2))
    # A base RoPE cannot use: refused with a message.
    type_line(qtbot, variants.rope_base, "1")
    assert "rope_base" in message(window) and "nothing was changed" in message(window)
    assert window.doc.scenario.settings.rope_base == 100.0
    assert variants.rope_base.text() == "100"


def test_qk_norm_adds_weight_rows_and_normalises_q_and_k(window, qtbot):
    variants = dock(window, qtbot, "Variants")
    assert "Q_rot" not in window.pipeline.names
    assert ("q_norm", 0) not in window.weights.grids
    choose(qtbot, variants.qk_norm, "rms")
    assert window.doc.scenario.settings.qk_norm == "rms"
    assert ("q_norm", 0) in window.weights.grids and ("k_norm", 1) in window.weights.grids
    labels = {label.text() for label in window.weights.tabs.widget(0).findChildren(QLabel)}
    assert {"norm weights q_norm", "norm weights k_norm"} <= labels
    Q, K = ref.X @ ref.W_Q[0], ref.X @ ref.W_K[0]
    close(view(window, "Q_rot").values, rms(Q, np.ones(2), 1e-6))
    close(view(window, "K_rot").values, rms(K, np.ones(2), 1e-6))
    assert "QK-norm" in window.pipeline.legend.text()

    window.bring_forward(("Pipeline",))
    type_into(qtbot, window.weights.grids[("q_norm", 0)], 0, 0, "2")
    type_line(qtbot, dock(window, qtbot, "Variants").eps, "0.5")
    assert window.doc.scenario.settings.qk_norm_eps == 0.5
    Qn, Kn = rms(Q, np.array([2.0, 1.0]), 0.5), rms(K, np.ones(2), 0.5)
    close(view(window, "Q_rot").values, Qn)
    close(view(window, "scores").values, Qn @ Kn.T)
    type_line(qtbot, variants.eps, "abc")
    assert "QK-norm eps" in message(window) and "nothing was changed" in message(window)
    assert window.doc.scenario.settings.qk_norm_eps == 0.5
    # Off again: the turned views and the weight rows go; the scores are Q Kᵀ once more.
    choose(qtbot, variants.qk_norm, "none")
    assert "Q_rot" not in window.pipeline.names and ("q_norm", 0) not in window.weights.grids
    close(view(window, "scores").values, Q @ K.T)


def test_qk_norm_over_all_heads_is_offered_and_normalises_the_token_whole(window, qtbot):
    variants = dock(window, qtbot, "Variants")
    choices = [variants.qk_norm.itemText(i) for i in range(variants.qk_norm.count())]
    assert choices == ["none", "rms", "rms-whole"]
    tip = variants.qk_norm.itemData(2, Qt.ItemDataRole.ToolTipRole)
    assert "every head" in tip and "OLMo 2" in tip
    assert "rms-whole" in variants.qk_norm.toolTip()
    choose(qtbot, variants.qk_norm, "rms-whole")
    assert window.doc.scenario.settings.qk_norm == "rms-whole"
    assert ("q_norm", 0) in window.weights.grids and ("k_norm", 1) in window.weights.grids
    # one RMS per token over both heads' Q (K) features together
    Qs = [ref.X @ ref.W_Q[h] for h in range(2)]
    Ks = [ref.X @ ref.W_K[h] for h in range(2)]
    rq = np.sqrt(sum((Q**2).sum(axis=1) for Q in Qs) / 4 + 1e-6)[:, None]
    rk = np.sqrt(sum((K**2).sum(axis=1) for K in Ks) / 4 + 1e-6)[:, None]
    close(view(window, "Q_rot").values, Qs[0] / rq)
    close(view(window, "K_rot").values, Ks[0] / rk)
    assert "QK-norm" in window.pipeline.legend.text()
    choose(qtbot, variants.qk_norm, "none")
    assert "Q_rot" not in window.pipeline.names


# The custom mask ----------------------------------------------------------------------------------


def prefix_lm(n: int, m: int, size: int) -> np.ndarray:
    return np.array(
        [[1.0 if j <= i or (i < size and j < size) else 0.0 for j in range(m)] for i in range(n)]
    )


def blocks(n: int, m: int, size: int) -> np.ndarray:
    return np.array(
        [[1.0 if j <= i and j // size == i // size else 0.0 for j in range(m)] for i in range(n)]
    )


def test_a_custom_mask_drawn_by_clicking_cells(window, qtbot):
    variants = dock(window, qtbot, "Variants")
    assert variants.mask_grid is None and variants.use_custom.isVisible()
    variants.use_custom.click()
    s = window.doc.scenario
    assert s.settings.mask == "custom" and window.mask_box.currentText() == "custom"
    causal = np.tril(np.ones((4, 4)))
    np.testing.assert_array_equal(s.mask_matrix, causal)
    grid = variants.mask_grid
    assert grid is not None and not variants.use_custom.isVisible()

    # Clicking query "the" × key "saw" hides exactly that key from that query.
    click_cell(qtbot, grid, 2, 1)
    expected = causal.copy()
    expected[2, 1] = 0.0
    np.testing.assert_array_equal(window.doc.scenario.mask_matrix, expected)
    hidden = expected == 0
    spec = view(window, "masked")
    np.testing.assert_array_equal(np.isneginf(spec.values), hidden)
    np.testing.assert_array_equal(spec.masked, hidden)
    scaled, _, _ = ref.head(ref.X, ref.W_Q[0], ref.W_K[0], ref.W_V[0])
    W = view(window, "weights").values
    close(W, softmax(masked(scaled, hidden)))
    assert W[2, 1] == 0.0 and W[2, 0] > 0 and W[2, 2] > 0
    # Clicking it again lets it see the key again; clicking a future cell opens it.
    click_cell(qtbot, grid, 2, 1)
    np.testing.assert_array_equal(window.doc.scenario.mask_matrix, causal)
    click_cell(qtbot, grid, 0, 3)
    assert window.doc.scenario.mask_matrix[0, 3] == 1.0
    assert np.isfinite(view(window, "masked").values[0, 3])
    window.doc.undo_stack.undo()
    assert window.doc.scenario.mask_matrix[0, 3] == 0.0
    # Back to the toolbar's causal mask: the grid goes, the button comes back.
    window.mask_box.textActivated.emit("causal")
    qtbot.wait(20)  # the old grid is deleted later
    assert variants.mask_grid is None and variants.use_custom.isVisible()
    np.testing.assert_array_equal(np.isneginf(view(window, "masked").values), FUTURE)


@pytest.mark.parametrize(
    ("shape", "size", "make"), [("prefix-LM", 2, prefix_lm), ("blocks", 2, blocks)]
)
def test_fill_makes_a_ready_made_mask(window, qtbot, shape, size, make):
    variants = dock(window, qtbot, "Variants")
    fill = next(b for b in variants.findChildren(QPushButton) if b.text() == "Fill")
    choose(qtbot, variants.shape, shape)
    type_spin(qtbot, variants.shape_size, size)
    fill.click()  # from the plain causal mask: switches to the custom mask and fills it
    expected = make(4, 4, size)
    s = window.doc.scenario
    assert s.settings.mask == "custom"
    np.testing.assert_array_equal(s.mask_matrix, expected)
    np.testing.assert_array_equal(np.isneginf(view(window, "masked").values), expected == 0)
    assert variants.mask_grid is not None
    model = variants.mask_grid.model()
    shown = [[model.index(i, j).data() for j in range(4)] for i in range(4)]
    assert shown == [[f"{v:g}" for v in row] for row in expected]
    window.doc.undo_stack.undo()  # the fill
    np.testing.assert_array_equal(window.doc.scenario.mask_matrix, np.tril(np.ones((4, 4))))


def test_the_mask_shapes_worked_out_here_match_ones_drawn_by_hand():
    """The test's own prefix-LM and blocks, checked against shapes drawn by hand."""
    np.testing.assert_array_equal(
        prefix_lm(4, 4, 2), [[1, 1, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]]
    )
    np.testing.assert_array_equal(
        blocks(4, 4, 2), [[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 1, 1]]
    )


# The RoPE dock -----------------------------------------------------------------------------------


def test_the_rope_dock_lists_the_pairs_and_checks_the_shift(window, qtbot):
    rope = dock(window, qtbot, "RoPE")
    qtbot.waitUntil(lambda: not rope.table.isVisible())  # drawn once on screen
    assert "RoPE is off" in rope.status.text()
    window.load_preset("llama-style")
    s = window.doc.scenario
    qtbot.waitUntil(lambda: rope.table.isVisible() and rope.table.rowCount() == s.d_k // 2)
    cells = [[rope.table.item(r, c).text() for c in range(3)] for r in range(2)]
    assert [row[0] for row in cells] == ["1&3", "2&4"]  # half pairs: i with i + d_k/2
    for i, row in enumerate(cells):
        assert float(row[1]) == pytest.approx(10000 ** (-2 * i / 4), rel=1e-3)
    check = next(b for b in rope.findChildren(QPushButton) if b.text() == "Check the scores")
    assert rope.shift.value() == 1000
    check.click()
    found = re.search(r"changed by at most (\S+),", rope.shift_result.text())
    assert found, rope.shift_result.text()
    assert float(found.group(1)) < 1e-12
    # The pair drawn turning: query 3's own position (in orange) is what RoPE made of it.
    type_spin(qtbot, rope.token, 3)
    x, y = own_vector(rope)
    Q_rot = turned(np.array(s.X) @ s.W_Q[0], range(8), 10000.0, "half", 4)
    close([x, y], Q_rot[2, [0, 2]])  # pair 1: features 1 and 3
    # The theta heatmap: position × speed for each pair.
    theta = rope.angle_view.spec.values
    assert theta.shape == (8, 2)
    close(theta, np.arange(8)[:, None] * np.array([1.0, 10000**-0.5]))


# Presets ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NEW_PRESETS)
def test_each_new_preset_loads_and_computes(window, qtbot, name):
    window.load_preset(name)
    window.compute.wait()
    s = window.doc.scenario
    assert "Loaded" in message(window)
    result = window.compute.result
    assert isinstance(result, Result) and result.n_heads == s.n_heads
    want = compute(make_preset(name))
    for h in range(s.n_heads):
        for view_name in HEAD_MATRICES:
            a, b = result.matrix(view_name, h), want.matrix(view_name, h)
            np.testing.assert_array_equal(np.isneginf(a), np.isneginf(b))
            close(a[np.isfinite(b)], b[np.isfinite(b)])
        close(result.matrix("weights", h).sum(axis=1) + result.heads[h].sink, 1.0)
    scores = view(window, "scores")
    assert scores.values.shape == (s.n, s.m) and scores.col_labels == s.key_tokens
    names = window.pipeline.names
    assert ("Q_rot" in names) == (name in ("llama-style", "qk-norm"))
    assert ("sink" in names) == (name == "sinks")


def test_each_new_preset_against_its_own_description(window, qtbot):
    window.load_preset("alibi")
    s = window.doc.scenario
    Q, K = np.array(s.X) @ s.W_Q[3], np.array(s.X) @ s.W_K[3]
    i, j = np.indices((8, 8))
    close(view(window, "scaled", 3).values, Q @ K.T / math.sqrt(2) - np.abs(i - j) / 256)
    window.load_preset("cross-attention")
    scores = view(window, "scores")
    assert scores.values.shape == (3, 5)
    assert scores.col_labels == ("le", "chat", "est", "assis", ".")
    assert scores.row_labels == ("the", "cat", "sat")
    assert not np.isneginf(view(window, "masked").values).any()  # no mask
    window.load_preset("qk-norm")  # RMS over d_k, times the learned weights, then scaled
    s = window.doc.scenario
    Q, K = s.X @ s.W_Q[1], s.X @ s.W_K[1]
    Qn = Q / np.sqrt((Q**2).mean(axis=1, keepdims=True) + 1e-6) * s.q_norm[1, 0]
    Kn = K / np.sqrt((K**2).mean(axis=1, keepdims=True) + 1e-6) * s.k_norm[1, 0]
    close(view(window, "scaled", 1).values, Qn @ Kn.T / 2)
    assert np.abs(Q @ K.T).max() > 100 > 4 * np.abs(Qn @ Kn.T).max()  # X is ten times larger
    window.load_preset("softcap")
    s = window.doc.scenario
    raw = (s.X @ s.W_Q[0]) @ (s.X @ s.W_K[0]).T / math.sqrt(2)
    close(view(window, "scaled").values, 2 * np.tanh(raw / 2))
    assert np.abs(raw).max() > 30
    window.load_preset("llama-style")
    assert (window.doc.scenario.n_heads, window.doc.scenario.kv_heads) == (4, 2)
    assert window.weights.kv_heads.value() == 2 and window.weights.tabs.count() == 4


@pytest.mark.parametrize("name", NEW_PRESETS)
def test_the_numbers_badge_agrees_on_each_new_preset(window, qtbot, name):
    pytest.importorskip("torch")
    window.load_preset(name)
    window.compute.wait()
    badge = window.badge
    badge.start()
    window.compute.wait()
    qtbot.waitUntil(lambda: badge.text() != "checking…", timeout=20_000)
    assert badge.text().startswith("✓"), badge.text()
    badge.active = False  # the next test's window starts unchecked


def own_vector(rope) -> tuple[float, float]:
    """Where the orange line of the RoPE dock's pair plot (the query at its own place) ends."""
    own = [
        item for item in rope.plot.listDataItems() if item.opts["pen"].color().name() == "#e6550d"
    ]
    assert len(own) == 1
    x, y = own[0].getData()
    return float(x[-1]), float(y[-1])


def test_the_rope_pair_plot_marks_the_query_at_its_own_position_under_bottom_right(window, qtbot):
    s = make_preset("cross-attention").with_settings(
        positional="rope", causal_alignment="bottom-right", mask="causal"
    )
    window.doc.replace(s, "RoPE over cross-attention")
    rope = dock(window, qtbot, "RoPE")
    qtbot.waitUntil(lambda: rope.angle_view.spec is not None)
    # 3 queries over 5 keys, bottom-right: the queries sit at positions 2, 3, 4.
    close(rope.angle_view.spec.values[:, 0], [2.0, 3.0, 4.0])
    type_spin(qtbot, rope.token, 1)
    x, y = own_vector(rope)  # query 1, pair 1 (features 1 and 2 of d_k 2)
    Q = np.array(s.X) @ s.W_Q[0]
    close([x, y], turned(Q, [2, 3, 4], 10000.0, "half", 2)[0])
    # Positions read as rows do, from 1: query 1 sits at key position 3 of 5.
    assert "its own, 3, in orange" in rope.plot.getPlotItem().titleLabel.text
    marks = [i.toPlainText() for i in rope.plot.getPlotItem().items if hasattr(i, "toPlainText")]
    assert marks == ["p1", "p2", "p3"]  # from the first position to its own
    assert "(p − 1) × its frequency" in rope.status.text()


def test_the_rope_dock_does_not_call_rope_off_while_it_turns_q(window, qtbot):
    window.load_preset("llama-style")
    window.act_projections.setChecked(False)  # the toolbar's Projections box
    s = window.doc.scenario
    assert not s.settings.projections and window.pos_box.currentText() == "rope"
    assert "Q_rot" in window.pipeline.names and "RoPE" in window.pipeline.legend.text()
    rope = dock(window, qtbot, "RoPE")
    qtbot.waitUntil(lambda: rope.table.isVisible())
    assert "Choose Position → rope" not in rope.status.text()
    assert rope.table.rowCount() == s.d_model // 2  # Q = X: pairs of d_model features


def test_undoing_the_custom_mask_never_paints_a_grid_without_its_matrix(window, qtbot):
    variants = dock(window, qtbot, "Variants")
    variants.use_custom.click()
    click_cell(qtbot, variants.mask_grid, 2, 1)
    qtbot.wait(20)  # drawn
    with qtbot.capture_exceptions() as errors:
        # Ctrl+Z held down: two presses queued before the window draws again.
        for _ in range(2):
            for kind in (QEvent.Type.KeyPress, QEvent.Type.KeyRelease):
                QApplication.postEvent(window, QKeyEvent(kind, Qt.Key.Key_Z, CTRL))
        qtbot.wait(50)
    assert window.doc.scenario.settings.mask == "causal"
    assert variants.mask_grid is None
    assert not errors, "".join(str(e[1]) for e in errors[:1])


def test_the_alibi_view_shows_each_heads_bias(window, qtbot):
    window.load_preset("alibi")  # 8 tokens, 4 heads: slopes 2^-2, 2^-4, 2^-6, 2^-8
    assert "alibi" in window.pipeline.names
    i, j = np.arange(8)[:, None], np.arange(8)[None, :]
    for head, slope in enumerate((2**-2, 2**-4, 2**-6, 2**-8)):
        close(view(window, "alibi", head).values, -slope * np.abs(i - j))
    # After an edit the bias is as it was (it depends on the positions alone).
    window.doc.replace(make_preset("gpt2-small", n=128).with_settings(positional="alibi"), "")
    window.doc.push(SetCells(window.doc.session, "W_K", 3, 1, 1, np.array([[2.5]])))
    i, j = np.arange(128)[:, None], np.arange(128)[None, :]
    close(view(window, "alibi", 3).values, -paper_slopes(12)[3] * np.abs(i - j))
    # The torch engine's heads bring no rule: the term is what their scaled scores hold.
    window.load_preset("alibi")
    window.view_state.set_engine("torch-float64")
    window.compute.wait()
    assert window.compute.result.heads[1].rule is None
    i, j = np.arange(8)[:, None], np.arange(8)[None, :]
    close(view(window, "alibi", 1).values, -(2**-4) * np.abs(i - j))
    window.view_state.set_engine("numpy")
    window.change_setting(positional="none")
    window.compute.wait()
    assert "alibi" not in window.pipeline.names


def test_a_models_own_rope_frequencies_are_shown_and_can_go_back_to_the_bases(window, qtbot):
    window.load_preset("llama-style")  # d_k 4: two pairs
    s = window.doc.scenario
    window.doc.replace(s.with_settings(rope_frequencies=(0.9, 0.01), rope_factor=1.5), "scaled")
    variants = dock(window, qtbot, "Variants")
    assert "the model's own, 2 pairs" in variants.rope_scaled.text()
    assert "× 1.5" in variants.rope_scaled.text()
    Q = np.array(s.X) @ s.W_Q[0]
    pos = np.arange(s.n)
    want = Q.copy()
    for i, f in enumerate((0.9, 0.01)):
        a, b = Q[:, i], Q[:, i + 2]
        want[:, i] = 1.5 * (a * np.cos(pos * f) - b * np.sin(pos * f))
        want[:, i + 2] = 1.5 * (a * np.sin(pos * f) + b * np.cos(pos * f))
    close(view(window, "Q_rot").values, want)
    qtbot.mouseClick(variants.rope_unscale, Qt.MouseButton.LeftButton)
    st = window.doc.scenario.settings
    assert st.rope_frequencies is None and st.rope_factor == 1.0
    close(view(window, "Q_rot").values, turned(Q, pos, 10000.0, "half", 4))
    assert not variants.rope_unscale.isEnabled()
    window.doc.undo_stack.undo()
    assert window.doc.scenario.settings.rope_frequencies == (0.9, 0.01)


def test_t5s_relative_bias_is_chosen_shown_and_set_in_the_variants_dock(window, qtbot):
    from variant_reference import t5_bucket

    window.pos_box.textActivated.emit("relative-bias")  # the toolbar's Position box
    variants = dock(window, qtbot, "Variants")
    s = window.doc.scenario
    assert s.relative_bias.shape == (32, 2) and not s.relative_bias.any()
    assert "32 buckets × 2 heads" in variants.relative_table.text()
    table = np.arange(16.0).reshape(8, 2) / 10
    window.doc.replace(
        dataclasses.replace(s.with_settings(relative_buckets=8, relative_max_distance=5),
                            relative_bias=table), "T5",
    )  # fmt: skip
    window.compute.wait()
    assert variants.relative_buckets.value() == 8 and variants.relative_distance.value() == 5
    assert "alibi" in window.pipeline.names  # the positional term's view
    want = [[table[t5_bucket(j - i, True, 8, 5), 1] for j in range(4)] for i in range(4)]
    close(view(window, "alibi", 1).values, np.array(want))
    variants.relative_direction.textActivated.emit("unidirectional (decoder)")
    assert window.doc.scenario.settings.relative_bidirectional is False
    variants.relative_buckets.setValue(6)
    variants.relative_buckets.editingFinished.emit()
    window.compute.wait()
    assert window.doc.scenario.relative_bias.shape == (6, 2)
    np.testing.assert_array_equal(window.doc.scenario.relative_bias, table[:6])
    variants.relative_distance.setValue(2)  # a decoder's 6 buckets: 3 exact distances
    variants.relative_distance.editingFinished.emit()
    assert "relative_max_distance" in message(window)
    assert window.doc.scenario.settings.relative_max_distance == 5
