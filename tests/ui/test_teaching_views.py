"""The teaching views, driven through the window: Masks, Heads, Mix, Inspector, the numbers
check and engine selector, Cost, the Lesson, the Experiments tabs and Export as code.

Every expected number comes from the plain NumPy reference (tests/reference.py) or from
arithmetic written out here, never from attnviz itself.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import reference as ref
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QApplication, QFormLayout, QMessageBox, QPushButton

from attnviz.core.lessons import STAGES
from attnviz.ui.view_state import Selection

TOKENS = ("she", "saw", "the", "cat")
D_K = 2
EXACT = 1e-12  # float64 paths computing the same sums in another order


# Independent arithmetic -------------------------------------------------------------------


def heads_of(X=ref.X, mask="causal", scale=True, Wq=ref.W_Q, Wk=ref.W_K, Wv=ref.W_V):
    """(scores, weights, output) for every head of the worked example's weights."""
    return [ref.head(X, Wq[h], Wk[h], Wv[h], mask, scale) for h in range(len(Wq))]


def final_of(X=ref.X, mask="causal", ablated=(), Wq=ref.W_Q, Wk=ref.W_K, Wv=ref.W_V, Wo=ref.W_O):
    """concat and the final output, with ablated heads left out of the W_O mix."""
    outs = [o[2] for o in heads_of(X, mask, True, Wq, Wk, Wv)]
    d_k = outs[0].shape[1]
    concat = np.concatenate(outs, axis=1)
    final = np.zeros((X.shape[0], Wo.shape[1]))
    for h, out in enumerate(outs):
        if h not in ablated:
            final += out @ Wo[h * d_k : (h + 1) * d_k]
    return concat, final


def with_cell(X: np.ndarray, row: int, col: int, value: float) -> np.ndarray:
    X = X.copy()
    X[row, col] = value
    return X


# Reading the window -----------------------------------------------------------------------


def shown_numbers(text: str) -> list[float]:
    """Every number printed in a text (Unicode minus signs included)."""
    text = text.replace("−", "-")
    return [float(m) for m in re.findall(r"-?\d+(?:\.\d+)?(?:e[+-]?\d+)?", text)]


def assert_shows(text: str, *values: float) -> None:
    """Each value is printed in text, to the 6 significant digits the Inspector uses."""
    numbers = shown_numbers(text)
    for v in values:
        assert any(abs(x - v) <= 1e-5 * max(1.0, abs(v)) for x in numbers), (v, text)


def shown_value(text: str) -> float:
    match = re.search(r"value = (\S+)", text)
    assert match, text
    return float(match.group(1).replace("−", "-").replace("∞", "inf"))


def inspector_text(window) -> str:
    return window.inspector.view.toPlainText()


def column(table, j: int) -> np.ndarray:
    return np.array([float(table.item(i, j).text()) for i in range(table.rowCount())])


def cell(table, i: int, j: int, role=Qt.ItemDataRole.DisplayRole):
    """What a table view's model gives for a cell."""
    model = table.model()
    return model.data(model.index(i, j), role)


def model_column(table, j: int) -> np.ndarray:
    return np.array([float(cell(table, i, j)) for i in range(table.model().rowCount())])


def column_row(table, i: int) -> list[float]:
    return [float(table.item(i, j).text()) for j in range(table.columnCount())]


def form_values(form: QFormLayout) -> dict[str, str]:
    values = {}
    for r in range(form.rowCount()):
        label = form.itemAt(r, QFormLayout.ItemRole.LabelRole).widget().text()
        values[label] = form.itemAt(r, QFormLayout.ItemRole.FieldRole).widget().text()
    return values


def settle() -> None:
    QApplication.processEvents()


PANELS = {
    "Masks": "masks",
    "Heads": "heads",
    "Mix": "mix",
    "Pipeline": "pipeline",
    "Experiments": "experiments",
    "Cost": "cost",
}


def bring(window, title: str):
    """Raise a dock over its tab neighbours and let its panel draw."""
    window.bring_forward((title,))
    settle()
    panel = getattr(window, PANELS[title])
    settle()  # a panel shown for the first time draws on the next turn of the event loop
    return panel


def edit_x(window, row: int, col: int, text: str) -> None:
    """Type a value into the X grid, as the spreadsheet does."""
    model = window.inputs.model
    assert model.setData(model.index(row, col), text)
    window.compute.wait()
    settle()


def click_cell(view, row: int, col: int) -> None:
    """A left click with the mouse in the middle of a heatmap cell."""
    QTest.mouseClick(
        view,
        Qt.MouseButton.LeftButton,
        Qt.KeyboardModifier.NoModifier,
        view.point_at(col + 0.5, row + 0.5).toPoint(),
    )
    settle()


def on_front(window, title: str) -> bool:
    return not window.docks[title].visibleRegion().isEmpty()


@pytest.fixture
def window(make_window, qtbot):
    w = make_window()
    w.show()
    qtbot.waitExposed(w)
    return w


@pytest.fixture
def warnings_seen(monkeypatch):
    """QMessageBox.warning is modal: record its texts instead."""
    seen: list[tuple[str, str]] = []

    def warning(parent, title, text, *args, **kwargs):
        seen.append((title, text))
        return QMessageBox.StandardButton.Ok

    monkeypatch.setattr(QMessageBox, "warning", warning)
    return seen


# Masks ----------------------------------------------------------------------------------


def check_masks(masks, X: np.ndarray, head: int, a: str, b: str) -> None:
    """Both heatmaps, their difference and the leak/shift columns against the reference."""
    Wq, Wk, Wv = ref.W_Q[head], ref.W_K[head], ref.W_V[head]
    _, wa, out_a = ref.head(X, Wq, Wk, Wv, a)
    _, wb, out_b = ref.head(X, Wq, Wk, Wv, b)
    np.testing.assert_allclose(masks.views["A"].spec.values, wa, atol=EXACT)
    np.testing.assert_allclose(masks.views["B"].spec.values, wb, atol=EXACT)
    np.testing.assert_allclose(masks.views["diff"].spec.values, wb - wa, atol=EXACT)
    assert f"head {head + 1}" in masks.views["A"].spec.title
    leak = [np.array([w[i, i + 1 :].sum() for i in range(len(X))]) for w in (wa, wb)]
    shift = np.linalg.norm(out_b - out_a, axis=1)
    final_shift = np.linalg.norm(final_of(X, b)[1] - final_of(X, a)[1], axis=1)
    assert masks.table.model().rowCount() == len(X)
    for j, expected in enumerate((leak[0], leak[1], shift, final_shift)):
        np.testing.assert_allclose(model_column(masks.table, j), expected, rtol=1e-3, atol=1e-15)


def test_masks_compares_two_strategies_per_head(window):
    masks = bring(window, "Masks")
    assert (masks.mask_a.currentText(), masks.mask_b.currentText()) == ("causal", "causal-zero")
    check_masks(masks, ref.X, 0, "causal", "causal-zero")
    # The leak: −∞ gives future keys nothing, zero gives them e⁰-sized shares.
    _, w_zero, _ = ref.head(ref.X, ref.W_Q[0], ref.W_K[0], ref.W_V[0], "causal-zero")
    assert w_zero[0, 1:].sum() > 0.1
    assert f"{w_zero[0, 1:].sum():.3g}" in masks.verdict.text()  # row 1 leaks the most
    assert np.all(masks.views["diff"].spec.values[-1] == 0)  # the last row never changes

    window.view_state.set_head(1)
    settle()
    check_masks(masks, ref.X, 1, "causal", "causal-zero")

    # It follows edits of X: one cell, then a new token (appended, all zeros).
    edit_x(window, 2, 1, "1.5")
    X = with_cell(ref.X, 2, 1, 1.5)
    check_masks(masks, X, 1, "causal", "causal-zero")
    window.inputs.add()
    settle()
    X = np.vstack([X, np.zeros(4)])
    check_masks(masks, X, 1, "causal", "causal-zero")
    assert [masks.token.itemText(i) for i in range(masks.token.count())] == [*TOKENS, "t5"]
    window.doc.undo_stack.undo()
    window.doc.undo_stack.undo()
    settle()
    window.head_spin.setValue(1)  # the toolbar's head box: back to head 1
    check_masks(masks, ref.X, 0, "causal", "causal-zero")

    # Any pair of strategies.
    masks.mask_a.setCurrentText("none")
    masks.mask_b.setCurrentText("drop-after-softmax")
    check_masks(masks, ref.X, 0, "none", "drop-after-softmax")


def test_masks_causality_probe(window):
    masks = bring(window, "Masks")
    masks.token.setCurrentText("saw")
    masks.amount.setValue(0.5)
    masks.run_probe()
    settle()
    nudged = ref.X.copy()
    nudged[1] += 0.5
    changes = [
        np.abs(final_of(nudged, m)[1] - final_of(ref.X, m)[1]).max(axis=1)
        for m in ("causal", "causal-zero")
    ]
    assert changes[0][0] == 0 and changes[1][0] > 1e-3  # by hand: −∞ holds, zero leaks
    probe_a, probe_b = masks.probes
    np.testing.assert_allclose(probe_a.change, changes[0], atol=EXACT)
    np.testing.assert_allclose(probe_b.change, changes[1], atol=EXACT)
    assert probe_a.change[0] == 0  # exactly: a masked key has weight 0
    assert not probe_a.earlier_rows_changed and probe_b.earlier_rows_changed
    np.testing.assert_allclose(model_column(masks.table, 4), changes[0], rtol=1e-3, atol=1e-15)
    np.testing.assert_allclose(model_column(masks.table, 5), changes[1], rtol=1e-3, atol=1e-15)
    red = cell(masks.table, 0, 5, Qt.ItemDataRole.BackgroundRole).color()
    assert red.red() > red.blue()  # the leaked row is flagged
    assert cell(masks.table, 0, 4, Qt.ItemDataRole.BackgroundRole) is None  # no leak
    verdict = masks.verdict.text()
    moved_a = ", ".join(t for t, c in zip(TOKENS, changes[0], strict=True) if c > 0)
    moved_b = ", ".join(t for t, c in zip(TOKENS, changes[1], strict=True) if c > 0)
    assert f"under A moved: {moved_a} — no earlier output moved" in verdict
    assert f"under B moved: {moved_b}" in verdict and "the future leaked" in verdict

    # A new result (here: another head) clears the stale probe columns.
    window.view_state.set_head(1)
    settle()
    assert masks.probes is None and cell(masks.table, 0, 5) == ""


def test_the_masks_table_keeps_its_selection_through_an_edit(window):
    masks = bring(window, "Masks")
    masks.table.selectRow(2)
    edit_x(window, 1, 1, "0.7")
    X = with_cell(ref.X, 1, 1, 0.7)
    check_masks(masks, X, 0, "causal", "causal-zero")  # the new numbers
    assert [i.row() for i in masks.table.selectionModel().selectedRows()] == [2]
    window.inputs.add()  # a new token: a new table
    settle()
    assert masks.table.model().rowCount() == 5


def test_masks_under_cross_attention_label_the_keys_with_their_own_tokens(window):
    """3 queries over 5 key tokens: every map's columns are the key tokens (B − A's were
    the queries', too few, and painting it failed)."""
    from attnviz.core.presets import make_preset

    window.doc.reset(make_preset("cross-attention"), None)
    masks = bring(window, "Masks")
    window.compute.wait()
    settle()
    keys = ("le", "chat", "est", "assis", ".")
    for key in ("A-scores", "B-scores", "A", "B", "diff"):
        spec = masks.views[key].spec
        assert spec.values.shape == (3, 5) and spec.col_labels == keys, key
        assert spec.row_labels == ("the", "cat", "sat"), key
    masks.views["diff"].repaint()  # paints without an error


def test_masks_click_selects_the_cell_under_its_mask(window):
    masks = bring(window, "Masks")
    window.view_state.set_head(1)
    settle()
    click_cell(masks.views["B"], 1, 3)
    assert window.view_state.selection == Selection("weights", 1, 1, 3, mask="causal-zero")
    # The Inspector explains the weight under causal-zero: a future key with score 0.
    S, w, _ = ref.head(ref.X, ref.W_Q[1], ref.W_K[1], ref.W_V[1], "causal-zero")
    row = S[1].copy()
    row[2:] = 0.0
    e = np.exp(row - row.max())
    text = inspector_text(window)
    assert "under mask causal-zero" in text
    assert_shows(text, *e, e.sum())
    assert shown_value(text) == pytest.approx(w[1, 3], rel=1e-5)
    # The explanation follows an edit of X, still under causal-zero.
    edit_x(window, 1, 2, "-0.9")
    _, w, _ = ref.head(
        with_cell(ref.X, 1, 2, -0.9), ref.W_Q[1], ref.W_K[1], ref.W_V[1], "causal-zero"
    )
    assert shown_value(inspector_text(window)) == pytest.approx(w[1, 3], rel=1e-5)
    masks.views["A"].cellClicked.emit("weights", 1, 3)
    assert window.view_state.selection == Selection("weights", 1, 1, 3, mask="causal")
    assert shown_value(inspector_text(window)) == 0


def test_pipeline_outline_follows_head_changes(window):
    pipeline = bring(window, "Pipeline")
    click_cell(pipeline.views["weights"], 2, 1)
    assert window.view_state.selection == Selection("weights", 0, 2, 1)
    assert pipeline.views["weights"].selected == (2, 1)
    window.view_state.set_head(1)  # the Inspector still explains head 1's weight
    settle()
    assert "head 1 · row 3" in inspector_text(window)
    assert pipeline.views["weights"].selected is None  # so head 2's cell is not outlined


def test_heads_and_masks_outline_only_the_selected_cell(window):
    heads = bring(window, "Heads")
    click_cell(heads.views[0], 1, 0)
    click_cell(heads.views[1], 3, 2)
    assert window.view_state.selection == Selection("weights", 1, 3, 2)
    masks = bring(window, "Masks")
    click_cell(masks.views["A"], 1, 0)
    click_cell(masks.views["B"], 2, 3)
    assert window.view_state.selection == Selection("weights", 1, 2, 3, mask="causal-zero")
    stale = [v.selected for v in (heads.views[0], masks.views["A"])]
    assert stale == [None, None]  # one selection, one outline


# Heads ----------------------------------------------------------------------------------


def test_heads_small_multiples_and_click_selects_head(window):
    heads = bring(window, "Heads")
    expected = heads_of()
    assert len(heads.views) == 2
    for h, view in enumerate(heads.views):
        np.testing.assert_allclose(view.spec.values, expected[h][1], atol=EXACT)
        assert view.spec.levels == heads.views[0].spec.levels  # one shared 0–1 scale

    click_cell(heads.views[1], 2, 1)
    assert window.view_state.head == 1
    assert window.view_state.selection == Selection("weights", 1, 2, 1)
    assert window.head_spin.value() == 2
    assert window.weights.tabs.currentIndex() == 1
    assert heads.views[1].framed and not heads.views[0].framed
    frame = QColor("#ff7f00").rgb() & 0xFFFFFF
    corners = [view.grab().toImage().pixel(1, 1) & 0xFFFFFF for view in heads.views[:2]]
    assert corners == [0xFFFFFF, frame]  # the shown head's view is framed in orange
    pipeline = bring(window, "Pipeline")
    np.testing.assert_allclose(pipeline.views["weights"].spec.values, expected[1][1], atol=EXACT)
    np.testing.assert_allclose(pipeline.views["Q"].spec.values, ref.X @ ref.W_Q[1], atol=EXACT)
    assert shown_value(inspector_text(window)) == pytest.approx(expected[1][1][2, 1], rel=1e-5)

    # Heads follow edits too.
    bring(window, "Heads")
    edit_x(window, 0, 3, "-0.7")
    edited = heads_of(with_cell(ref.X, 0, 3, -0.7))
    for h, view in enumerate(heads.views):
        np.testing.assert_allclose(view.spec.values, edited[h][1], atol=EXACT)

    # A third head (new weights are zeros): all its scores are 0, so under the causal mask
    # row i spreads 1/(i+1) over the keys j ≤ i.
    window.weights.heads.setValue(3)
    settle()
    assert len(heads.views) == 3 and len(heads.switches) == 3
    uniform = np.tril(np.ones((4, 4))) / np.arange(1, 5)[:, None]
    np.testing.assert_allclose(heads.views[2].spec.values, uniform, atol=EXACT)
    np.testing.assert_allclose(heads.views[1].spec.values, edited[1][1], atol=EXACT)


def test_heads_ablation_is_undoable_and_changes_the_final_output(window):
    heads = bring(window, "Heads")
    doc = window.doc
    full = final_of()[1]
    without_first = final_of(ablated=(0,))[1]
    by_hand = np.concatenate([o[2] for o in heads_of()], axis=1)[:, 2:] @ ref.W_O[2:]
    np.testing.assert_allclose(without_first, by_hand, atol=EXACT)

    count = doc.undo_stack.count()
    heads.switches[0].click()  # untick head 1
    assert not heads.switches[0].isChecked()
    assert doc.scenario.settings.ablated == (0,)
    assert doc.undo_stack.count() == count + 1
    assert doc.undo_stack.undoText() == "Switch off head 1"
    np.testing.assert_allclose(window.compute.result.final, without_first, atol=EXACT)
    assert "switched off" in heads.views[0].spec.caption
    mix = bring(window, "Mix")
    np.testing.assert_allclose(mix.final.spec.values, without_first, atol=EXACT)
    assert np.all(mix.parts[0].spec.values == 0)

    doc.undo_stack.undo()
    settle()
    assert doc.scenario.settings.ablated == ()
    np.testing.assert_allclose(mix.final.spec.values, full, atol=EXACT)
    bring(window, "Heads")
    assert heads.switches[0].isChecked()
    doc.undo_stack.redo()
    settle()
    assert not heads.switches[0].isChecked()
    np.testing.assert_allclose(window.compute.result.final, without_first, atol=EXACT)


# Mix ------------------------------------------------------------------------------------


def check_mix(mix, X: np.ndarray) -> None:
    concat, final = final_of(X)
    np.testing.assert_allclose(mix.concat.spec.values, concat, atol=EXACT)
    np.testing.assert_allclose(mix.w_o.spec.values, ref.W_O, atol=0)
    np.testing.assert_allclose(mix.final.spec.values, final, atol=EXACT)
    assert len(mix.parts) == 2
    for h, view in enumerate(mix.parts):
        part = concat[:, h * D_K : (h + 1) * D_K] @ ref.W_O[h * D_K : (h + 1) * D_K]
        np.testing.assert_allclose(view.spec.values, part, atol=EXACT)
    total = sum(view.spec.values for view in mix.parts)
    np.testing.assert_allclose(total, final, atol=EXACT)
    assert mix.parts[0].spec.levels == mix.parts[1].spec.levels


def test_mix_concat_blocks_w_o_output_and_contributions(window):
    mix = bring(window, "Mix")
    check_mix(mix, ref.X)
    assert mix.concat.block_lines == [2]  # between the heads
    assert "4 × 4" in mix.diagram.text()  # concat and output: 4 tokens × 4 features

    edit_x(window, 3, 0, "-1.25")
    check_mix(mix, with_cell(ref.X, 3, 0, -1.25))
    window.doc.undo_stack.undo()
    settle()

    window.weights.d_k.setValue(3)  # the Weights panel pads new columns with zeros
    settle()
    s = window.doc.scenario
    assert s.d_k == 3
    outs = [ref.head(ref.X, s.W_Q[h], s.W_K[h], s.W_V[h])[2] for h in range(2)]
    concat = np.concatenate(outs, axis=1)
    np.testing.assert_allclose(mix.concat.spec.values, concat, atol=EXACT)
    np.testing.assert_allclose(mix.final.spec.values, concat @ s.W_O, atol=EXACT)
    for h, view in enumerate(mix.parts):
        part = outs[h] @ s.W_O[3 * h : 3 * h + 3]
        np.testing.assert_allclose(view.spec.values, part, atol=EXACT)
    assert mix.concat.block_lines == [3]


# Inspector ------------------------------------------------------------------------------


def test_inspector_follows_pipeline_heads_mix_and_edits(window):
    pipeline = bring(window, "Pipeline")

    # A weight: the exponentials (row max subtracted), their sum and the quotient.
    pipeline.views["weights"].cellClicked.emit("weights", 2, 1)
    assert window.view_state.selection == Selection("weights", 0, 2, 1)
    S, w, _ = ref.head(ref.X, ref.W_Q[0], ref.W_K[0], ref.W_V[0])
    visible = S[2, :3]
    e = np.exp(visible - visible.max())
    text = inspector_text(window)
    assert "head 1 · row 3 (the) · column 2" in text
    assert_shows(text, visible.max(), *e, e.sum(), e[1] / e.sum())
    assert shown_value(text) == pytest.approx(w[2, 1], rel=1e-5)

    # A scaled score: the products, their sum, √d_k and the quotient.
    pipeline.views["scaled"].cellClicked.emit("scaled", 1, 0)
    Q, K = ref.X @ ref.W_Q[0], ref.X @ ref.W_K[0]
    products = Q[1] * K[0]
    text = inspector_text(window)
    assert_shows(text, *products, products.sum(), math.sqrt(2), products.sum() / math.sqrt(2))
    assert shown_value(text) == pytest.approx(S[1, 0], rel=1e-5)

    # A masked score: −∞ for a future key.
    pipeline.views["masked"].cellClicked.emit("masked", 0, 3)
    assert shown_value(inspector_text(window)) == -math.inf
    # A head output: the weighted sum of the value rows.
    pipeline.views["output"].cellClicked.emit("output", 3, 1)
    V = ref.X @ ref.W_V[0]
    terms = w[3] * V[:, 1]
    text = inspector_text(window)
    assert_shows(text, *terms[terms != 0])
    assert shown_value(text) == pytest.approx(terms.sum(), rel=1e-5)

    # From the Heads view: the other head's weight.
    heads = bring(window, "Heads")
    heads.views[1].cellClicked.emit("weights", 3, 2)
    w2 = heads_of()[1][1]
    assert "head 2 · row 4 (cat)" in inspector_text(window)
    assert shown_value(inspector_text(window)) == pytest.approx(w2[3, 2], rel=1e-5)

    # From the Mix view: a concat cell is head 2's output; a final cell sums both heads.
    mix = bring(window, "Mix")
    concat, final = final_of()
    click_cell(mix.concat, 1, 3)
    assert window.view_state.selection == Selection("concat", None, 1, 3)
    assert shown_value(inspector_text(window)) == pytest.approx(concat[1, 3], rel=1e-5)
    mix.final.cellClicked.emit("final", 2, 0)
    per_head = [concat[2, 2 * h : 2 * h + 2] @ ref.W_O[2 * h : 2 * h + 2, 0] for h in range(2)]
    text = inspector_text(window)
    assert_shows(text, *per_head)
    assert shown_value(text) == pytest.approx(final[2, 0], rel=1e-5)

    # An edit recomputes the selected cell's arithmetic.
    edit_x(window, 2, 2, "0.1")
    edited = final_of(with_cell(ref.X, 2, 2, 0.1))[1]
    assert abs(edited[2, 0] - final[2, 0]) > 1e-3
    assert shown_value(inspector_text(window)) == pytest.approx(edited[2, 0], rel=1e-5)


# The numbers check and the engine selector ----------------------------------------------


def test_numbers_badge_is_idle_and_torch_unloaded_at_start(tmp_path):
    # A fresh interpreter: this test process may already have imported torch.
    settings, data = str(tmp_path / "settings.ini"), str(tmp_path / "data")
    code = textwrap.dedent(
        f"""
        import json, os, sys
        os.environ["QT_QPA_PLATFORM"] = "offscreen"
        from pathlib import Path
        from PySide6.QtCore import QSettings
        from PySide6.QtWidgets import QApplication
        app = QApplication([])
        from attnviz.ui.main_window import MainWindow
        w = MainWindow(QSettings({settings!r}, QSettings.Format.IniFormat), Path({data!r}))
        w.show()
        app.processEvents()
        heavy = ("torch", "transformers", "tokenizers", "huggingface_hub", "safetensors")
        loaded = any(m.split(".")[0] in heavy for m in sys.modules)
        print(json.dumps([loaded, w.badge.active, w.badge.text()]))
        w.doc.undo_stack.setClean()
        w.close()
        """
    )
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    torch_loaded, active, text = json.loads(run.stdout.strip().splitlines()[-1])
    assert not torch_loaded and not active
    assert "click to run" in text


def test_numbers_badge_turns_green(window):
    pytest.importorskip("torch")
    badge = window.badge
    assert not badge.active
    badge.start()
    window.compute.wait()
    text = badge.text()
    assert text.startswith("✓"), text
    diffs = [float(x) for x in re.findall(r"(?:torch|SDPA) ([0-9.]+e[+-]\d+)", text)]
    assert diffs and max(diffs) < 1e-9, text
    colour = re.search(r"color: #([0-9a-fA-F]{6})", badge.styleSheet()).group(1)
    r, g, b = (int(colour[k : k + 2], 16) for k in (0, 2, 4))
    assert g > r and g > b  # green

    edit_x(window, 1, 1, "2.5")  # active: it checks every new result
    window.compute.wait()
    assert badge.text().startswith("✓")


def check_views(window, X: np.ndarray) -> None:
    """Pipeline, Heads and Mix show the reference numbers for X (head 1 in the Pipeline)."""
    scores, w, out = ref.head(X, ref.W_Q[0], ref.W_K[0], ref.W_V[0])
    pipeline = bring(window, "Pipeline")
    np.testing.assert_allclose(pipeline.views["scaled"].spec.values, scores, atol=EXACT)
    np.testing.assert_allclose(pipeline.views["weights"].spec.values, w, atol=EXACT)
    np.testing.assert_allclose(pipeline.views["output"].spec.values, out, atol=EXACT)
    heads = bring(window, "Heads")
    for h, (_, wh, _) in enumerate(heads_of(X)):
        np.testing.assert_allclose(heads.views[h].spec.values, wh, atol=EXACT)
    mix = bring(window, "Mix")
    np.testing.assert_allclose(mix.final.spec.values, final_of(X)[1], atol=EXACT)


def test_engine_selector_torch_float64_shows_the_same_numbers(window):
    pytest.importorskip("torch")
    window.engine_box.textActivated.emit("torch float64")
    window.compute.wait()
    settle()
    assert window.view_state.engine == "torch-float64"
    assert window.engine_box.currentText() == "torch float64"
    check_views(window, ref.X)
    edit_x(window, 0, 1, "0.35")
    check_views(window, with_cell(ref.X, 0, 1, 0.35))
    window.engine_box.textActivated.emit("NumPy float64")
    window.compute.wait()
    assert window.view_state.engine == "numpy"
    check_views(window, with_cell(ref.X, 0, 1, 0.35))


def test_engine_failure_falls_back_to_numpy(window, monkeypatch, warnings_seen):
    import attnviz.core.maths.torch_engine as torch_engine

    def broken(*args, **kwargs):
        raise RuntimeError("no device today")

    monkeypatch.setattr(torch_engine, "compute_torch", broken)
    window.view_state.set_engine("torch-float64")
    window.compute.wait()
    settle()
    assert window.view_state.engine == "numpy"
    assert window.engine_box.currentText() == "NumPy float64"
    assert len(warnings_seen) == 1
    title, text = warnings_seen[0]
    assert title and "no device today" in text and "NumPy" in text
    assert "no device today" in window.statusBar().currentMessage()
    # The window keeps working on the NumPy engine.
    check_views(window, ref.X)
    edit_x(window, 3, 3, "0.05")
    check_views(window, with_cell(ref.X, 3, 3, 0.05))


# Cost -----------------------------------------------------------------------------------


def expected_cost(n: int, heads: int, d_k: int, causal: bool) -> dict[str, int]:
    flops = 4 * n * n * d_k * heads
    return {
        "per_head": n * n,
        "scores": heads * n * n,
        "float32": 4 * heads * n * n,
        "float16": 2 * heads * n * n,
        "flops": flops // 2 if causal else flops,
        "kv": 2 * n * heads * d_k,
    }


def check_cost_form(form: QFormLayout, c: dict[str, int], causal: bool) -> dict[str, str]:
    values = form_values(form)
    assert f"({c['per_head']:,})" in values["scores per head (n²)"]
    assert f"({c['scores']:,})" in values["scores, all heads"]
    assert f"({c['flops']:,})" in values["attention FLOPs"]
    assert ("(causal: half)" in values["attention FLOPs"]) == causal
    return values


def test_cost_now_and_what_if(window):
    cost = bring(window, "Cost")
    # The worked example: n = 4, 2 heads of d_k 2, causal.
    c = expected_cost(4, 2, 2, True)
    assert c == {
        "per_head": 16,
        "scores": 32,
        "float32": 128,
        "float16": 64,
        "flops": 128,
        "kv": 32,
    }
    values = check_cost_form(cost.now_form, c, True)
    assert values["score memory"] == "128 B float32\n64 B float16"
    assert values["KV cache per layer"] == "32 numbers · 64 B float16"
    assert cost.now_box.title() == "Now: n = 4, 2 × d_k 2"

    # What if n = 131072 (128k tokens): about 17 billion scores per head.
    assert cost.length.value() == 131072
    c = expected_cost(131072, 2, 2, True)
    assert c["per_head"] == 17_179_869_184 and c["float32"] == 128 * 2**30
    values = check_cost_form(cost.what_form, c, True)
    assert values["scores per head (n²)"].startswith("17.2 billion")
    assert values["score memory"] == "128.0 GiB float32\n64.0 GiB float16"
    assert c["kv"] == 2**20 and c["flops"] == 137_438_953_472
    assert values["attention FLOPs"].startswith("137.4 billion")
    assert values["KV cache per layer"] == "1.0 million numbers · 2.0 MiB float16"
    assert cost.what_box.title() == "What if n = 131,072"
    # Sharing K and V at this shape (2 heads of 2, one layer, bfloat16): 2·2·2·2 = 16 B a
    # token with a K/V head per query head, half with one shared; at n = 131,072.
    shared = form_values(cost.share_form)
    assert shared["MHA: 2 K/V heads"] == "16 B per token · 2.0 MiB for 131,072 tokens"
    assert shared["MQA: 1 K/V head"] == "8 B per token · 1.0 MiB for 131,072 tokens"
    models = form_values(cost.models_form)
    assert (
        models["Llama-3-8B (GQA, 4 per group)"]
        == "128.0 KiB per token · 16.0 GiB for 131,072 tokens"
    )
    assert models["Mistral-7B v0.1 (GQA, 4 per group)"].endswith(
        "512.0 MiB for 131,072 tokens (window: last 4,096 kept)"
    )

    # It follows the scenario: no mask (full FLOPs), projections off (1 head of d_model).
    window.change_setting(mask="none")
    check_cost_form(cost.now_form, expected_cost(4, 2, 2, False), False)
    window.change_setting(projections=False)
    check_cost_form(cost.now_form, expected_cost(4, 1, 4, False), False)
    cost.length.setValue(1000)
    check_cost_form(cost.what_form, expected_cost(1000, 1, 4, False), False)
    window.doc.undo_stack.undo()
    window.doc.undo_stack.undo()
    check_cost_form(cost.now_form, expected_cost(4, 2, 2, True), True)


def test_cost_does_not_halve_flops_for_the_leaky_zero_mask(window):
    cost = bring(window, "Cost")
    window.change_setting(mask="causal-zero")
    # Future scores are 0, not −∞: every key gets weight, weights · V is the full n² work.
    flops = form_values(cost.now_form)["attention FLOPs"]
    assert "(causal: half)" not in flops
    assert int(re.search(r"\(([\d,]+)\)", flops)[1].replace(",", "")) > 4 * 16 * 2 * 2 // 2


# Lesson ---------------------------------------------------------------------------------

# What each stage sets up, from the brief: (projections, scale, mask), the dock on top.
STAGE_SETTINGS = {
    1: (False, False, "none", "Pipeline"),
    2: (False, False, "none", "Pipeline"),
    3: (True, False, "none", "Pipeline"),
    4: (True, True, "none", "Experiments"),
    5: (True, True, "causal", "Masks"),
    6: (True, True, "causal", "Heads"),
    7: (True, True, "causal", "Cost"),
    8: (True, True, "causal", "Pipeline"),
    9: (True, True, "causal", "Tiling"),
    10: (True, True, "causal-zero", "Training"),
    11: (True, False, "causal", "Training"),
    12: (True, True, "causal", "Training"),
    13: (True, True, "causal", "Training"),
}


def test_lesson_walks_the_thirteen_stages(window):
    lesson, doc = window.lesson, window.doc
    assert not lesson.previous.isEnabled()
    start = doc.undo_stack.count()
    for number in range(1, 14):
        lesson.next.click()
        settle()
        projections, scale, mask, front = STAGE_SETTINGS[number]
        st = doc.scenario.settings
        assert (st.projections, st.scale, st.mask) == (projections, scale, mask), number
        assert lesson.index == number - 1
        assert doc.undo_stack.count() == start + number  # one undo step per stage
        assert doc.undo_stack.undoText() == f"Lesson stage {number}"
        assert on_front(window, front), (number, front)
        assert f"Stage {number} of 13" in lesson.text.toPlainText()
        rehearsal = STAGES[number - 1].training
        if rehearsal:  # the Training dock is set to the stage's run, ready for Step
            config = window.training_panel.config()
            assert (config.task, config.lr, config.compare) == (
                rehearsal.task,
                rehearsal.lr,
                rehearsal.compare or None,
            )
            assert window.training_panel.steps.value() == rehearsal.steps
            assert window.training.progress is None  # no run of an earlier stage shown
        if number == 1:
            # softmax(X Xᵀ) X, by hand.
            S = ref.X @ ref.X.T
            w = np.exp(S - S.max(axis=1, keepdims=True))
            w /= w.sum(axis=1, keepdims=True)
            pipeline = bring(window, "Pipeline")
            np.testing.assert_allclose(pipeline.views["weights"].spec.values, w, atol=EXACT)
            np.testing.assert_allclose(pipeline.views["output"].spec.values, w @ ref.X, atol=EXACT)
        if number == 5:
            assert not on_front(window, "Pipeline")  # Masks is on top of its tab group
    assert not lesson.next.isEnabled()
    for _ in range(4):  # back through the training stages
        doc.undo_stack.undo()
    assert doc.scenario.n == 4  # stage 9: the worked example, in tiles
    doc.undo_stack.undo()  # back to stage 8's scenario, as if stage 9 had never been chosen
    lesson.index = 7
    s = doc.scenario  # stage 8: llama-style, 4 query heads over 2 key/value heads
    assert (s.n, s.d_model, s.n_heads, s.kv_heads, s.d_k) == (8, 8, 4, 2, 4)
    assert s.settings.positional == "rope"

    lesson.previous.click()
    settle()
    s = doc.scenario
    assert lesson.index == 6 and (s.n, s.d_model, s.n_heads, s.d_k) == (64, 768, 12, 64)
    assert window.cost.now_box.title() == "Now: n = 64, 12 × d_k 64"  # GPT-2-small sizes
    assert doc.undo_stack.undoText() == "Lesson stage 7"
    lesson.previous.click()
    settle()
    assert lesson.index == 5 and doc.scenario.n == 4
    assert doc.undo_stack.undoText() == "Lesson stage 6"
    assert on_front(window, "Heads")
    doc.undo_stack.undo()  # back to stage 7's scenario
    assert doc.scenario.n == 64
    doc.undo_stack.undo()  # stage 8's
    assert doc.scenario.n == 8
    doc.undo_stack.undo()  # stage 7's, the first time
    assert doc.scenario.n == 64
    doc.undo_stack.undo()  # stage 6's
    assert doc.scenario.n == 4 and doc.scenario.settings.mask == "causal"

    # Leave the lesson at stage 3 (projections, no scaling, no mask) and keep editing.
    lesson.go(2)
    settle()
    count = doc.undo_stack.count()
    edit_x(window, 1, 0, "-0.25")
    assert doc.undo_stack.count() == count + 1
    X = with_cell(ref.X, 1, 0, -0.25)
    _, w, _ = ref.head(X, ref.W_Q[0], ref.W_K[0], ref.W_V[0], "none", scale=False)
    pipeline = bring(window, "Pipeline")
    np.testing.assert_allclose(pipeline.views["weights"].spec.values, w, atol=EXACT)
    window.change_setting(mask="causal")
    assert doc.scenario.settings.mask == "causal" and doc.scenario.X[1, 0] == -0.25
    _, w, _ = ref.head(X, ref.W_Q[0], ref.W_K[0], ref.W_V[0], "causal", scale=False)
    np.testing.assert_allclose(pipeline.views["weights"].spec.values, w, atol=EXACT)


# Experiments ----------------------------------------------------------------------------


def test_experiments_scaling_table_and_saturation(window):
    tab = window.experiments.scaling
    tab.worker.wait()
    assert tab.table.rowCount() == 3
    for i in range(3):
        d_k, mean, var, mean_scaled, var_scaled = column_row(tab.table, i)
        pairs = tab.pairs.value()
        assert d_k in (2, 64, 512)
        # q·k: mean 0, variance d_k; relative spread of a sample variance ≲ 2 % here.
        assert abs(mean) < 5 * math.sqrt(d_k / pairs)
        assert var == pytest.approx(d_k, rel=0.1)
        assert abs(mean_scaled) < 5 / math.sqrt(pairs)
        assert var_scaled == pytest.approx(1, rel=0.1)
        assert var_scaled == pytest.approx(var / d_k, rel=1e-3)

    # Saturation: [2, 1, 0, -1] and the same scores × 8, by hand.
    row = np.array([2.0, 1.0, 0.0, -1.0])
    plain = np.exp(row) / np.exp(row).sum()
    sharp = np.exp(8 * row - 16) / np.exp(8 * row - 16).sum()
    assert np.round(plain, 2).tolist() == [0.64, 0.24, 0.09, 0.03]
    assert np.round(sharp, 2).tolist() == [1, 0, 0, 0]
    note = tab.saturation_note.text()
    lists = [json.loads(x) for x in re.findall(r"\[[^\]]*\]", note)]
    assert lists == [np.round(plain, 2).tolist(), np.round(sharp, 2).tolist()], note
    assert f"largest weight {plain.max():.2f} → {sharp.max():.2f}" in note

    tab.factor.setValue(10)  # factor 1: nothing changes
    lists = [json.loads(x) for x in re.findall(r"\[[^\]]*\]", tab.saturation_note.text())]
    assert lists[0] == lists[1] == np.round(plain, 2).tolist()


def test_experiments_position_permutation(window):
    doc = window.doc
    experiments = bring(window, "Experiments")
    tab = experiments.position
    experiments.setCurrentWidget(tab)
    window.change_setting(mask="none")
    reverse = next(b for b in tab.findChildren(QPushButton) if b.text() == "Reverse tokens")

    before = final_of(ref.X, "none")[1]
    count = doc.undo_stack.count()
    reverse.click()
    assert doc.scenario.tokens == TOKENS[::-1]
    assert doc.undo_stack.count() == count + 1
    np.testing.assert_allclose(window.compute.result.final, before[::-1], atol=EXACT)
    np.testing.assert_allclose(
        window.compute.result.final, final_of(ref.X[::-1], "none")[1], atol=EXACT
    )
    assert "no mask and no position encoding: the outputs were only permuted" in tab.note.text()
    doc.undo_stack.undo()
    assert doc.scenario.tokens == TOKENS
    np.testing.assert_array_equal(doc.scenario.X, ref.X)

    # With sinusoidal positions, reversing the tokens changes the outputs for real.
    window.change_setting(positional="sinusoidal")
    pe = ref.sinusoidal(4, 4)
    with_pe = final_of(ref.X + pe, "none")[1]
    np.testing.assert_allclose(window.compute.result.final, with_pe, atol=EXACT)
    reverse.click()
    reversed_pe = final_of(ref.X[::-1] + pe, "none")[1]
    np.testing.assert_allclose(window.compute.result.final, reversed_pe, atol=EXACT)
    assert np.abs(reversed_pe - with_pe[::-1]).max() > 1e-3
    assert "position sinusoidal: the outputs changed" in tab.note.text()


def test_experiments_kv_cache_steps_match_full_attention(window):
    experiments = bring(window, "Experiments")
    tab = experiments.kv_cache
    experiments.setCurrentWidget(tab)
    settle()
    weights = [w for _, w, _ in heads_of()]
    for t in range(4):
        assert tab.step_button.isEnabled()
        tab.step_button.click()
        assert f"t = {t + 1} of 4: {TOKENS[t]}" in tab.labels["token"].text()
        numbers = 2 * (t + 1) * 2 * D_K
        assert tab.labels["cache"].text().startswith(f"{numbers:,} numbers")
        assert f"{8 * numbers:,} B float64" in tab.labels["bytes"].text()
        diff = float(re.search(r"max difference ([0-9.e+-]+)", tab.labels["match"].text())[1])
        assert diff < 1e-12
        bars = [item.opts["height"] for item in tab.plot.getPlotItem().items]
        assert len(bars) == 2
        assert tab.plot.grab().toImage().pixel(3, 3) & 0xFFFFFF == 0xFFFFFF  # white, as all
        for h in range(2):
            np.testing.assert_allclose(bars[h], weights[h][t, : t + 1], atol=EXACT)
    assert not tab.step_button.isEnabled()

    # An edit starts the cache over, and the steps follow the edited X.
    edit_x(window, 0, 0, "0.4")
    assert tab.step_button.isEnabled() and tab.labels["token"].text() == "–"
    tab.step_button.click()
    tab.step_button.click()
    edited = heads_of(with_cell(ref.X, 0, 0, 0.4))
    bars = [item.opts["height"] for item in tab.plot.getPlotItem().items]
    for h in range(2):
        np.testing.assert_allclose(bars[h], edited[h][1][1, :2], atol=EXACT)


# Export as code -------------------------------------------------------------------------


def read_script_output(stdout: str) -> dict[str, list[list[float]]]:
    blocks: dict[str, list[list[float]]] = {}
    title = ""
    for line in stdout.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        if line.startswith("["):
            blocks[title].append(json.loads(line))
        else:
            title = line.strip()
            blocks[title] = []
    return blocks


@pytest.mark.parametrize(
    ("flavor", "rich"), [("numpy", False), ("numpy", True), ("torch", True), ("tiled", False)]
)
def test_export_as_code_runs_and_prints_the_output(window, monkeypatch, tmp_path, flavor, rich):
    if flavor == "torch":
        pytest.importorskip("torch")
    from PySide6.QtWidgets import QFileDialog

    target = tmp_path / f"attention_{flavor}.py"
    monkeypatch.setattr(
        QFileDialog, "getSaveFileName", lambda *a, **k: (str(target), "Python (*.py)")
    )
    edit_x(window, 2, 3, "-0.45")
    X, mask, ablated = with_cell(ref.X, 2, 3, -0.45), "causal", ()
    if rich:  # sinusoidal positions, the leaky zero mask and head 2 switched off
        window.change_setting(positional="sinusoidal")
        window.change_setting(mask="causal-zero")
        window.change_setting(ablated=(1,))
        X, mask, ablated = X + ref.sinusoidal(4, 4), "causal-zero", (1,)
    window.files.export_code(flavor)
    assert target.exists()
    run = subprocess.run(
        [sys.executable, str(target)], capture_output=True, text=True, timeout=60, check=True
    )
    blocks = read_script_output(run.stdout)
    expected = final_of(X, mask, ablated)[1]
    np.testing.assert_allclose(np.array(blocks["output"]), expected, atol=EXACT)
    for h, (_, w, _) in enumerate(heads_of(X, mask)):
        np.testing.assert_allclose(np.array(blocks[f"head {h + 1} weights"]), w, atol=EXACT)


def test_the_tiled_script_of_a_mask_no_kernel_does_is_refused_with_a_message(
    window, monkeypatch, tmp_path, warnings_shown
):
    from PySide6.QtWidgets import QFileDialog

    asked = []
    monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda *a, **k: asked.append(a) or ("", ""))
    window.change_setting(mask="causal-zero")
    window.files.export_code("tiled")
    assert asked == [] and "causal-zero" in warnings_shown[-1][1]


# Text that fits ------------------------------------------------------------------------


def cost_labels_fit(panel, scroll) -> None:
    """Every label lies inside the scroll area and has room for each of its words."""
    from PySide6.QtCore import QPoint
    from PySide6.QtWidgets import QGroupBox, QLabel

    viewport = scroll.viewport()
    assert scroll.horizontalScrollBar().maximum() == 0  # nothing hidden off to the right
    labels = [w for w in panel.findChildren(QLabel) if w.isVisible() and w.text()]
    assert len(labels) >= 20
    for label in labels:
        room = label.contentsRect().width()
        right = label.mapTo(viewport, QPoint(label.width(), 0)).x()
        assert right <= viewport.width(), label.text()
        words = label.text().split() if label.wordWrap() else label.text().splitlines()
        for word in words:  # a wrapped label breaks between words, never inside one
            assert label.fontMetrics().horizontalAdvance(word) <= room, (word, room)
    for box in panel.findChildren(QGroupBox):
        assert box.fontMetrics().horizontalAdvance(box.title()) < box.width()


@pytest.mark.parametrize("width", [300, 280])
def test_cost_numbers_fit_a_narrow_dock(qtbot, width):
    from PySide6.QtWidgets import QScrollArea

    from attnviz.core.presets import make_preset
    from attnviz.ui.panels.cost import MAX_WHAT_IF, CostPanel
    from attnviz.ui.workspace import Workspace

    # GPT-2 small's 12 heads of 64: long numbers, e.g. 206,158,430,208 scores at n = 128k.
    panel = CostPanel(Workspace.create(make_preset("gpt2-small", n=8)))
    scroll = QScrollArea()  # as in the window's docks
    scroll.setWidgetResizable(True)
    scroll.setWidget(panel)
    qtbot.addWidget(scroll)
    scroll.resize(width, 700)
    scroll.show()
    qtbot.waitExposed(scroll)
    for n in (131072, 1000, 40_000, 1_000_000, 3_000_000, MAX_WHAT_IF):
        panel.length.setValue(n)
        settle()
        assert f"({12 * n * n:,})" in form_values(panel.what_form)["scores, all heads"]
        cost_labels_fit(panel, scroll)


CELL_REFERENCE = re.compile(r"\w+\[[^\[\]]*\]")  # V[ she,1], in the text as the view lays it out


@pytest.mark.parametrize("width", [300, 220])
def test_inspector_never_breaks_a_cell_reference(qtbot, width):
    from attnviz.core.presets import make_preset
    from attnviz.ui.panels.inspector import InspectorPanel
    from attnviz.ui.workspace import Workspace

    # Tokens as a tokenizer writes them: a leading space, a hyphen, ideographs.
    tokens = [" she", " saw", "well-known", "天气很好"]
    panel = InspectorPanel(Workspace.create(make_preset("worked-example").with_tokens(tokens)))
    qtbot.addWidget(panel)
    panel.resize(width, 900)
    panel.show()
    qtbot.waitExposed(panel)
    cells = [
        Selection("output", 0, 3, 0),
        Selection("weights", 1, 2, 1),
        Selection("scores", 0, 3, 2),
        Selection("final", None, 2, 1),
        Selection("Q", 1, 2, 0),
    ]
    for cell in cells:
        panel.view_state.select(cell)
        panel.compute.wait()
        settle()
        document = panel.view.document()
        document.setTextWidth(panel.view.viewport().width())
        found = []
        block = document.begin()
        while block.isValid():  # every paragraph and table cell
            layout, text = block.layout(), block.text()
            for m in CELL_REFERENCE.finditer(text):
                first = layout.lineForTextPosition(m.start()).lineNumber()
                last = layout.lineForTextPosition(m.end() - 1).lineNumber()
                shown = m.group().replace("\u2060", "").replace("\xa0", " ")
                assert first == last, (shown, [text])
                found.append(shown)
            block = block.next()
        assert len(found) >= 4, (cell, found)
        assert any(any(t in ref for t in tokens) for ref in found), found
    # the head output's terms name the value rows as typed: V[ she,1]
    panel.view_state.select(cells[0])
    panel.compute.wait()
    settle()
    assert "V[ she,1]" in panel.view.toPlainText().replace("\u2060", "")


# Okabe & Ito's colour-blind-safe palette, as published.
OKABE_ITO = {"#e69f00", "#56b4e9", "#009e73", "#f0e442", "#0072b2", "#d55e00", "#cc79a7", "#000000"}


def bar_colours(plot_widget) -> list[str]:
    import pyqtgraph as pg

    items = plot_widget.getPlotItem().items
    return [pg.mkBrush(item.opts["brush"]).color().name() for item in items]


def legend_entries(label) -> dict[str, str]:
    """name -> colour of each swatch (■) in a legend label, read as Qt lays it out."""
    from PySide6.QtGui import QTextDocument

    document = QTextDocument()
    document.setHtml(label.text())
    entries: dict[str, str] = {}
    colour = None
    block = document.begin()
    while block.isValid():
        it = block.begin()
        while not it.atEnd():
            fragment = it.fragment()
            if fragment.text() == "■":
                colour = fragment.charFormat().foreground().color().name()
            elif colour:
                entries[fragment.text().replace("\xa0", " ").strip()] = colour
                colour = None
            it += 1
        block = block.next()
    return entries


def apart(a, b) -> bool:
    """Two widgets that do not overlap on screen."""
    ra = a.rect().translated(a.mapToGlobal(a.rect().topLeft()))
    rb = b.rect().translated(b.mapToGlobal(b.rect().topLeft()))
    return not ra.intersects(rb)


def test_experiments_bars_have_legends_in_colour_blind_safe_colours(window):
    experiments = bring(window, "Experiments")
    scaling = experiments.scaling
    scaling.worker.wait()
    settle()
    for plot, legend, names in (
        (scaling.variance_plot, scaling.variance_legend, 2),
        (scaling.saturation_plot, scaling.saturation_legend, 2),
    ):
        colours = bar_colours(plot)
        assert len(set(colours)) == names and set(colours) <= OKABE_ITO
        entries = legend_entries(legend)
        assert len(entries) == names and set(entries.values()) == set(colours)
        assert legend.isVisible() and apart(legend, plot)

    tab = experiments.kv_cache
    experiments.setCurrentWidget(tab)
    settle()
    for _ in range(3):
        tab.step_button.click()
    settle()
    colours = bar_colours(tab.plot)
    assert len(colours) == 2 and len(set(colours)) == 2 and set(colours) <= OKABE_ITO
    assert legend_entries(tab.legend) == {"head 1": colours[0], "head 2": colours[1]}
    assert tab.legend.isVisible() and apart(tab.legend, tab.plot)


def drawn_ticks(plot_widget) -> tuple[list[float], list[tuple[object, str]]]:
    """The tick values of the bottom axis over its range, and the labels it draws."""
    from PySide6.QtGui import QImage, QPainter

    axis = plot_widget.getPlotItem().getAxis("bottom")
    lo, hi = axis.range
    values = [v for _, level in axis.tickValues(lo, hi, axis.width()) for v in level]
    image = QImage(10, 10, QImage.Format.Format_ARGB32)
    painter = QPainter(image)
    _, _, text_specs = axis.generateDrawSpecs(painter)
    painter.end()
    return values, [(rect, text) for rect, _, text in text_specs]


def assert_integer_axis(plot_widget, names: list[str]) -> None:
    from itertools import pairwise

    from PySide6.QtGui import QFontMetricsF

    values, labels = drawn_ticks(plot_widget)
    assert values and all(v == int(v) for v in values), values
    # room under the tick marks for a whole line of text: no descender (the _ of d_k) cut
    axis = plot_widget.getPlotItem().getAxis("bottom")
    room = axis.height() - max(0, axis.style["tickLength"])
    assert room >= QFontMetricsF(axis.font()).height(), room
    assert labels and {text for _, text in labels} <= set(names), labels
    rects = sorted((rect for rect, _ in labels), key=lambda r: r.left())
    assert all(a.right() <= b.left() for a, b in pairwise(rects)), "labels overlap"


def test_experiments_index_axes_have_integer_ticks_only(window):
    experiments = bring(window, "Experiments")
    scaling = experiments.scaling
    scaling.worker.wait()
    settle()
    assert_integer_axis(scaling.saturation_plot, ["1", "2", "3", "4"])
    assert_integer_axis(scaling.variance_plot, ["d_k = 2", "d_k = 64", "d_k = 512"])
    # zoomed in between two bars, and with many scores: still whole numbers, apart
    scaling.saturation_plot.setXRange(0.3, 1.6, padding=0)
    settle()
    assert_integer_axis(scaling.saturation_plot, ["1", "2", "3", "4"])
    scaling.scores.setText(", ".join(str(k % 7 - 3) for k in range(60)))
    scaling.show_saturation()
    scaling.saturation_plot.autoRange()
    settle()
    assert_integer_axis(scaling.saturation_plot, [str(k) for k in range(1, 61)])

    tab = experiments.kv_cache
    experiments.setCurrentWidget(tab)
    settle()
    for _ in range(4):
        tab.step_button.click()
    settle()
    assert_integer_axis(tab.plot, list(window.doc.scenario.tokens))
