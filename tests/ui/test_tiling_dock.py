"""The Tiling dock driven through a whole pass: keys and buttons, block sizes, precision,
edits, refusals. Expected numbers are computed here with NumPy (or by the dense engine)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import reference as ref
from PySide6.QtCore import QRect, QRectF, Qt
from PySide6.QtGui import QColor, QImage, QPainter
from waiting import settle

from attnviz.core.maths.forward import compute
from attnviz.core.maths.tiling import tiles
from attnviz.core.presets import make_preset, small_model
from attnviz.core.session import SetCells

pytestmark = pytest.mark.usefixtures("warnings_shown", "answers")
EXACT = 1e-12


def causal_scores(X: np.ndarray, h: int) -> np.ndarray:
    """Head h of the worked example's weights on X, scaled and causal, written out here."""
    S = (X @ ref.W_Q[h]) @ (X @ ref.W_K[h]).T / math.sqrt(2)
    S[np.triu_indices(len(X), 1)] = -np.inf
    return S


def tiles_in_order(n: int, m: int, bq: int, bk: int) -> list[tuple[int, int, int, int]]:
    """(r0, r1, c0, c1) of every tile, query blocks outside, key blocks inside."""
    return [
        (r0, min(n, r0 + bq), c0, min(m, c0 + bk))
        for r0 in range(0, n, bq)
        for c0 in range(0, m, bk)
    ]


def running(S: np.ndarray, order, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Each row's m and l after the first k tiles (NaN where its block has not started)."""
    n = len(S)
    m, l = np.full(n, np.nan), np.full(n, np.nan)
    for r0, r1, _, c1 in order[:k]:
        for i in range(r0, r1):
            seen = S[i, :c1]
            m[i] = seen.max()
            l[i] = np.exp(seen - m[i]).sum() if np.isfinite(m[i]) else 0.0
    return m, l


def eight_tokens():
    """8 tokens, causal (the default), two heads of d_k 4."""
    return small_model(("the", "dog", "ran", "to", "the", "old", "red", "gate"), 8, 2, 4, seed=5)


@pytest.fixture
def dock(shown_window, qtbot):
    """A shown window with the Tiling dock raised; returns (window, panel)."""

    def open_(scenario=None):
        window = shown_window(scenario=scenario)
        window.bring_forward(("Tiling",))
        panel = window.panel("Tiling")
        qtbot.waitUntil(lambda: panel.pass_ is not None, timeout=10000)
        panel.setFocus()
        return window, panel

    return open_


def strip(panel) -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
    m_col, l_col = panel.scores.strip.columns
    assert (m_col.title, l_col.title) == ("m", "l")
    return np.asarray(m_col.values), np.asarray(l_col.values), m_col.texts


def test_keys_step_through_a_whole_pass_and_the_output_equals_dense_attention(dock, qtbot):
    window, panel = dock()
    S = causal_scores(ref.X, 0)
    order = tiles_in_order(4, 4, 2, 2)
    assert panel.steps == len(order) == 4
    assert panel.grid.current is None and "Before the first tile" in panel.where.text()
    for k, tile in enumerate(order, start=1):
        qtbot.keyClick(panel, Qt.Key.Key_Right)
        assert panel.position == k
        assert panel.grid.current == tile  # the highlighted tile follows the steps
        m, l = running(S, order, k)
        shown_m, shown_l, texts = strip(panel)
        started = ~np.isnan(m)
        np.testing.assert_allclose(shown_m[started], m[started], atol=EXACT)
        np.testing.assert_allclose(shown_l[started], l[started], atol=EXACT)
        assert all(t == "–" for t in np.array(texts)[~started])
        colours = panel.scores.strip.columns[0].colors
        assert [i for i, c in enumerate(colours) if c == "#ff7f00"] == list(range(*tile[:2]))
        assert f"Step {k} of 4" in panel.where.text()
        assert panel.arithmetic.text().startswith(f"row {tile[0] + 1} (")
    assert not panel.buttons["step"].isEnabled()
    dense = compute(window.doc.scenario).heads[0].output
    np.testing.assert_allclose(panel.out_view.spec.values, dense, atol=EXACT)
    np.testing.assert_allclose(
        panel.out_view.spec.values, ref.head(ref.X, *ref_w(0))[2], atol=EXACT
    )
    assert "Output equals dense attention" in panel.check.text()
    # Back undoes a step: the last tile is no longer done, its rows' output not final.
    qtbot.keyClick(panel, Qt.Key.Key_Left)
    assert panel.position == 3 and panel.grid.current == order[2]
    m, l = running(S, order, 3)
    np.testing.assert_allclose(strip(panel)[0], m, atol=EXACT)
    assert panel.bands["out"].pending_from == 2  # rows 3–4 wait for their last tile
    np.testing.assert_array_equal(panel.out_view.spec.values[2:], 0)


def ref_w(h: int):
    return ref.W_Q[h], ref.W_K[h], ref.W_V[h]


def test_buttons_play_and_reset(dock, qtbot):
    _, panel = dock()
    qtbot.mouseClick(panel.buttons["step"], Qt.MouseButton.LeftButton)
    qtbot.mouseClick(panel.buttons["step"], Qt.MouseButton.LeftButton)
    assert panel.position == 2
    qtbot.mouseClick(panel.buttons["back"], Qt.MouseButton.LeftButton)
    assert panel.position == 1
    qtbot.mouseClick(panel.buttons["reset"], Qt.MouseButton.LeftButton)
    assert panel.position == 0 and panel.grid.current is None
    panel.speed.setCurrentText("fast")
    panel.setFocus()
    qtbot.keyClick(panel, Qt.Key.Key_Space)  # play
    assert panel.timer.isActive() and panel.buttons["play"].text() == "Pause"
    qtbot.waitUntil(lambda: panel.position == panel.steps, timeout=5000)
    qtbot.waitUntil(lambda: not panel.timer.isActive(), timeout=2000)  # stops at the end
    assert panel.buttons["play"].text() == "Play"


def test_block_sizes_change_the_number_of_steps(dock, qtbot):
    window, panel = dock(eight_tokens())
    s = window.doc.scenario
    for bq, bk in ((1, 3), (3, 2), (8, 8), (2, 2)):
        panel.block_q.setValue(bq)
        panel.block_k.setValue(bk)
        order = tiles_in_order(8, 8, bq, bk)
        # Causal: a tile is skipped when its first key comes after its last query.
        skipped = sum(c0 > r1 - 1 for _, r1, c0, _ in order)
        qtbot.waitUntil(lambda order=order: panel.steps == len(order), timeout=5000)
        assert panel.position == 0
        assert f"{len(order)} tiles, {skipped} skipped by the mask" in panel.where.text()
        clicks = 0
        while panel.buttons["step"].isEnabled():
            qtbot.mouseClick(panel.buttons["step"], Qt.MouseButton.LeftButton)
            clicks += 1
        assert clicks == len(order)
        shaded = {(r0, r1, c0, c1) for r0, r1, c0, c1 in panel.grid.skipped}
        assert shaded == {t for t in order if t[2] > t[1] - 1}
    assert (bq, bk) == (2, 2) and skipped == 6  # 6 of 16 tiles above the diagonal
    Q, K, V = s.X @ s.W_Q[0], s.X @ s.W_K[0], s.X @ s.W_V[0]
    S = Q @ K.T / math.sqrt(s.d_k)
    S[np.triu_indices(8, 1)] = -np.inf
    W = np.exp(S - S.max(axis=1, keepdims=True))
    W /= W.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(panel.out_view.spec.values, W @ V, atol=EXACT)


def test_float16_shows_its_error_against_float64(dock, qtbot):
    window, panel = dock()
    assert not panel.error_view.isVisible()
    panel.precision.setCurrentText("float16")
    qtbot.waitUntil(lambda: panel.pass_.tiling.precision == "float16", timeout=5000)
    assert panel.error_view.isVisible()
    s = window.doc.scenario
    error = np.abs(tiles(s, 0, 2, 2, "float16").output - tiles(s, 0, 2, 2).output)
    assert 0 < error.max() < 1e-2
    unit = 10.0 ** math.floor(math.log10(error.max()))
    spec = panel.error_view.spec
    np.testing.assert_allclose(spec.values * unit, error, rtol=1e-12, atol=0)
    assert f"1e{math.floor(math.log10(error.max()))}".replace("-", "−") in spec.caption
    assert "float16" in panel.check.text()
    panel.precision.setCurrentText("float64")
    qtbot.waitUntil(lambda: not panel.error_view.isVisible(), timeout=5000)


def test_float16_overflow_is_named_not_shown_as_zero(dock, qtbot):
    s = make_preset("worked-example")
    _, panel = dock(dataclasses.replace(s, X=np.asarray(s.X) * 1e5))
    panel.precision.setCurrentText("float16")
    qtbot.waitUntil(lambda: panel.pass_.tiling.precision == "float16", timeout=5000)
    with np.errstate(over="ignore"):
        Q16 = (np.asarray(s.X) * 1e5 @ np.asarray(s.W_Q)[0]).astype(np.float16)
    assert np.isinf(Q16[3]).any()  # the last row's query leaves float16's range
    assert "4 (cat)" in panel.check.text() and "overflowed in float16" in panel.check.text()
    for _ in range(panel.steps):
        panel.step()
    assert np.isnan(panel.out_view.spec.values[3]).all()  # not a row of zeros


def test_an_edit_to_x_recomputes_and_another_head_is_shown(dock, qtbot):
    window, panel = dock()
    doc = window.doc
    qtbot.keyClick(panel, Qt.Key.Key_Right)
    doc.push(SetCells(doc.session, "X", None, 3, 0, np.array([[2.0, -1.0]])))
    settle(qtbot, window)
    X = ref.X.copy()
    X[3, :2] = [2.0, -1.0]
    S = causal_scores(X, 0)
    np.testing.assert_allclose(panel.scores.spec.values, S, atol=EXACT)
    assert panel.position == 1  # the same tiles: the step is kept
    for _ in range(panel.steps):
        panel.step()
    np.testing.assert_allclose(panel.out_view.spec.values, ref.head(X, *ref_w(0))[2], atol=EXACT)
    window.view_state.set_head(1)
    qtbot.waitUntil(lambda: panel.pass_.tiling.head == 1, timeout=5000)
    np.testing.assert_allclose(panel.scores.spec.values, causal_scores(X, 1), atol=EXACT)
    assert panel.scores.spec.caption.startswith("head 2")


def test_a_mask_a_kernel_does_not_do_is_refused_with_a_message(dock, qtbot):
    window, panel = dock()
    window.change_setting(mask="causal-zero")
    settle(qtbot, window)
    qtbot.waitUntil(lambda: panel.refusal.isVisible(), timeout=5000)
    assert "causal-zero" in panel.refusal.text() and "−∞" in panel.refusal.text()
    assert not panel.body.isVisible() and not panel.buttons["step"].isEnabled()
    qtbot.keyClick(panel, Qt.Key.Key_Right)  # nothing to step: no error
    window.change_setting(mask="causal")
    settle(qtbot, window)
    qtbot.waitUntil(lambda: panel.body.isVisible(), timeout=5000)
    assert not panel.refusal.isVisible() and panel.buttons["step"].isEnabled()


def test_too_many_tiles_are_refused_until_the_blocks_grow(dock, qtbot):
    _, panel = dock(make_preset("gpt2-small", n=128))
    panel.block_q.setValue(1)
    panel.block_k.setValue(1)  # 16,384 tiles
    qtbot.waitUntil(lambda: panel.refusal.isVisible(), timeout=5000)
    assert "16,384 tiles" in panel.refusal.text()
    panel.block_q.setValue(16)
    panel.block_k.setValue(16)
    qtbot.waitUntil(lambda: panel.steps == 64, timeout=10000)
    assert panel.body.isVisible() and not panel.refusal.isVisible()


WORDS = ("the", "cat", "sat", "on", "the", "mat", "and", "it", "was", "so", "warm", "then", "yes")


@pytest.mark.parametrize("words", [3, 7, 9, 11, 13])
def test_long_key_labels_leave_the_m_and_l_headers_alone(dock, qtbot, words):
    """Above the m and l columns beside the scores nothing but their own headers: the
    view's pixels there are those of the headers drawn alone (by the same strip)."""
    tokens = ("[CLS]", *WORDS[:words], "[SEP]")  # as a BERT-style tokenizer gives them
    window, panel = dock(small_model(tokens, 8, 2, 4, seed=3))
    view = panel.scores
    settle(qtbot, window)
    rows, cols = view.spec.values.shape
    top_left, bottom_right = view.point_at(0, 0), view.point_at(cols, rows)
    shot = view.grab().toImage().convertToFormat(QImage.Format.Format_RGB32)
    alone = QImage(shot.size(), QImage.Format.Format_RGB32)
    alone.fill(QColor("white"))
    painter = QPainter(alone)
    cells = QRectF(top_left, bottom_right)
    view.strip.paint(painter, cells.right(), cells.top(), cells.height() / rows, cells)
    painter.end()
    band = QRect(
        round(cells.right()), round(cells.top()) - 18, round(view.strip.width()), 16
    )  # the headers' line
    differ = sum(
        shot.pixel(x, y) != alone.pixel(x, y)
        for x in range(band.left(), band.right() + 1)
        for y in range(band.top(), band.bottom() + 1)
    )
    assert differ <= 2, f"{differ} pixels of the m/l headers' line are not the headers"
