"""Every lesson stage's "Try this", done through the window, against independent NumPy."""

from __future__ import annotations

import re

import numpy as np
import pytest
import reference as ref
from waiting import look_at_pipeline, settle

from attnviz.core.lessons import STAGES
from attnviz.core.maths.experiments import scaling_variance
from attnviz.core.maths.scoring import softmax_rows
from attnviz.core.presets import make_preset
from attnviz.core.session import SetCells
from attnviz.ui.view_state import Selection

pytestmark = pytest.mark.usefixtures("warnings_shown", "answers")
EXACT = 1e-12
MASKS_AB = ("causal", "causal-zero")


def softmax(S: np.ndarray) -> np.ndarray:
    e = np.exp(S - S.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


@pytest.fixture
def stage(shown_window, qtbot):
    """Go to a lesson stage (numbered from 1) in a fresh window; returns the window."""

    def go(number: int):
        window = shown_window()
        window.lesson.go(number - 1)
        settle(qtbot, window)
        assert window.lesson.index == number - 1
        return window

    return go


def set_rows(window, name: str, head, row: int, values: np.ndarray) -> None:
    doc = window.doc
    doc.push(SetCells(doc.session, name, head, row, 0, np.atleast_2d(values)))


def shown(window, view: str) -> np.ndarray:
    look_at_pipeline(window)
    return window.pipeline.views[view].spec.values


def test_stage_1_scores_are_dot_products_and_equal_rows_score_alike(stage, qtbot):
    window = stage(1)
    np.testing.assert_allclose(shown(window, "scores"), ref.X @ ref.X.T, atol=EXACT)
    window.view_state.select(Selection("scores", 0, 1, 2))
    settle(qtbot, window)
    text = window.inspector.view.toPlainText()
    for a, b in zip(ref.X[1], ref.X[2], strict=True):  # each product x_1k · x_2k is listed
        assert f"{a * b:.4g}".replace("-", "−") in text or f"{a * b:.4g}" in text
    set_rows(window, "X", None, 2, ref.X[1])
    settle(qtbot, window)
    X = ref.X.copy()
    X[2] = X[1]
    S = shown(window, "scores")
    np.testing.assert_allclose(S, X @ X.T, atol=EXACT)
    np.testing.assert_array_equal(S[1], S[2])


def test_stage_2_a_row_ten_times_larger_saturates_softmax_and_a_shift_changes_nothing(stage, qtbot):
    window = stage(2)
    before = shown(window, "scores")
    shift = softmax_rows(before + 10.0)[0]
    np.testing.assert_allclose(shift, softmax(before), atol=EXACT)  # softmax sees differences
    set_rows(window, "X", None, 1, ref.X[1] * 10)
    settle(qtbot, window)
    X = ref.X.copy()
    X[1] *= 10
    weights = shown(window, "weights")
    np.testing.assert_allclose(weights, softmax(X @ X.T), atol=EXACT)
    assert weights[1, 1] > 0.999  # one-hot on itself
    assert shown(window, "scores")[1, 1] == pytest.approx(100 * ref.X[1] @ ref.X[1])


def test_stage_3_no_token_attends_most_to_itself_and_w_k_equal_to_w_q_makes_scores_symmetric(
    stage, qtbot
):
    window = stage(3)
    S = (ref.X @ ref.W_Q[0]) @ (ref.X @ ref.W_K[0]).T  # no scaling, no mask at this stage
    weights = shown(window, "weights")
    np.testing.assert_allclose(weights, softmax(S), atol=EXACT)
    assert all(weights[i].argmax() != i for i in range(4))
    set_rows(window, "W_K", 0, 0, ref.W_Q[0])  # paste the W_Q grid into W_K
    settle(qtbot, window)
    S = shown(window, "scores")
    Q = ref.X @ ref.W_Q[0]
    np.testing.assert_allclose(S, Q @ Q.T, atol=EXACT)
    np.testing.assert_allclose(S, S.T, atol=EXACT)


def test_stage_4_variance_near_d_k_unscaled_and_one_scaled_then_scale_off_sharpens_rows(
    stage, qtbot
):
    window = stage(4)
    experiments = window.experiments
    assert experiments.tabText(experiments.currentIndex()) == "Scaling"
    stats = scaling_variance((2, 64, 512), pairs=4000, seed=1)
    for st in stats:  # the claim, against what it says: var(q·k) = d_k, var(q·k/√d_k) = 1
        assert st.var_raw == pytest.approx(st.d_k, rel=0.15)
        assert st.var_scaled == pytest.approx(1.0, rel=0.15)
    scaled_before = shown(window, "weights").max(axis=1)
    window.change_setting(scale=False)
    settle(qtbot, window)
    np.testing.assert_array_equal(shown(window, "scaled"), shown(window, "scores"))
    S = (ref.X @ ref.W_Q[0]) @ (ref.X @ ref.W_K[0]).T
    after = shown(window, "weights")
    np.testing.assert_allclose(after, softmax(S), atol=EXACT)
    assert np.all(after.max(axis=1) >= scaled_before - EXACT)


def test_stage_4_the_gradients_tab_shows_less_gradient_through_softmax_unscaled(stage, qtbot):
    window = stage(4)
    tab = window.experiments.gradient
    assert "Gradients" in window.lesson.text.toPlainText()  # the stage points to the tab
    qtbot.waitUntil(lambda: "times less" in tab.note.text(), timeout=20000)
    pattern = r"At d_k = 64: (\S+) scaled, (\S+) unscaled \((\S+) times less\)"
    found = re.search(pattern, tab.note.text())
    assert found, tab.note.text()
    scaled, unscaled, ratio = (float(x) for x in found.groups())
    assert ratio == pytest.approx(scaled / unscaled, rel=0.01)
    assert 2 < ratio < 10  # the claim: a few times less at d_k = 64 (test_experiments: 1024)


def test_stage_5_the_probe_moves_no_earlier_output_under_minus_infinity_but_does_under_zero(
    stage, qtbot
):
    window = stage(5)
    masks = window.masks
    qtbot.waitUntil(lambda: masks.comparison is not None, timeout=5000)
    w_zero = ref.head(ref.X, ref.W_Q[0], ref.W_K[0], ref.W_V[0], "causal-zero")[1]
    future = np.triu(np.ones((4, 4), dtype=bool), k=1)
    leak = masks.views["B"].strip.columns[0]
    np.testing.assert_allclose(leak.values, (w_zero * future).sum(axis=1), atol=EXACT)
    masks.token.setCurrentIndex(1)  # the second token
    masks.amount.setValue(0.5)
    masks.run_probe()
    qtbot.waitUntil(lambda: masks.probes is not None, timeout=5000)

    def final(mask: str, X: np.ndarray) -> np.ndarray:
        return ref.multi_head(X, ref.W_Q, ref.W_K, ref.W_V, ref.W_O, mask)[2]

    nudged = ref.X.copy()
    nudged[1] += 0.5
    moved = {m: np.abs(final(m, nudged) - final(m, ref.X)).max(axis=1) for m in MASKS_AB}
    assert moved["causal"][0] == 0 and moved["causal-zero"][0] > 0
    probe_a, probe_b = masks.probes
    np.testing.assert_allclose(probe_a.change, moved["causal"], atol=EXACT)
    np.testing.assert_allclose(probe_b.change, moved["causal-zero"], atol=EXACT)
    assert not probe_a.earlier_rows_changed and probe_b.earlier_rows_changed


def test_stage_6_switching_a_head_off_changes_the_output_by_its_contribution(stage, qtbot):
    window = stage(6)
    heads, mix = window.heads, window.mix
    qtbot.waitUntil(lambda: len(heads.switches) == 2, timeout=5000)
    outs = [o[2] for o in (ref.head(ref.X, ref.W_Q[h], ref.W_K[h], ref.W_V[h]) for h in (0, 1))]
    parts = [outs[h] @ ref.W_O[2 * h : 2 * h + 2] for h in (0, 1)]
    window.docks["Mix"].raise_()
    qtbot.waitUntil(lambda: len(mix.parts) == 2 and mix.parts[1].spec is not None, timeout=5000)
    for h in (0, 1):
        np.testing.assert_allclose(mix.parts[h].spec.values, parts[h], atol=EXACT)
    heads.switches[1].setChecked(False)
    settle(qtbot, window)
    qtbot.waitUntil(lambda: "switched off" in mix.parts[1].spec.title, timeout=5000)
    np.testing.assert_allclose(mix.final.spec.values, parts[0], atol=EXACT)


def test_stage_7_opens_the_kv_cache_whose_rows_match_full_attention_and_prices_128000(stage, qtbot):
    window = stage(7)
    experiments = window.experiments
    assert experiments.tabText(experiments.currentIndex()) == "KV cache"
    cost = window.cost
    cost.length.setValue(128000)
    text = " ".join(cost.what_form.itemAt(i).widget().text() for i in range(cost.what_form.count()))
    assert "16,384,000,000" in text  # 128,000² scores per head: about 16 billion
    assert "billion" in STAGES[6].explanation and "128000" in STAGES[6].try_this
    kv = experiments.kv_cache
    for _ in range(3):
        kv.step()
        qtbot.waitUntil(lambda: kv.cache is not None, timeout=5000)
    qtbot.waitUntil(lambda: kv.cache.t >= 3, timeout=10000)
    match = re.search(r"max difference (\S+)<", kv.labels["match"].text())
    assert match and float(match[1].replace("−", "-")) <= 1e-12, kv.labels["match"].text()


def rope_half(A: np.ndarray, pos: np.ndarray, base: float = 10000.0) -> np.ndarray:
    """RoPE with half pairs over every feature, written out here."""
    half = A.shape[-1] // 2
    theta = pos[:, None] * base ** (-np.arange(half) * 2.0 / A.shape[-1])
    a, b = A[..., :half], A[..., half:]
    return np.concatenate(
        [a * np.cos(theta) - b * np.sin(theta), a * np.sin(theta) + b * np.cos(theta)], axis=-1
    )


def test_stage_8_mqa_halves_the_cache_rope_ignores_a_shift_then_window_and_sinks(stage, qtbot):
    window = stage(8)
    s = window.doc.scenario
    assert (s.n_heads, s.kv_heads, s.settings.positional) == (4, 2, "rope")
    cache = window.cost.costs()[0].kv_cache_numbers
    assert cache == 2 * s.n * 2 * s.d_k  # K and V of 2 key/value heads per token

    # Weights: KV heads 1. Every head now reads the first group's K (multi-query).
    window.weights.kv_heads.setValue(1)
    settle(qtbot, window)
    s = window.doc.scenario
    K = s.X @ s.W_K[0]
    for h in range(4):
        np.testing.assert_allclose(window.compute.result.K[h], K, atol=EXACT)
    assert window.cost.costs()[0].kv_cache_numbers == cache // 2

    # RoPE: every position moved by 1000 changes no score (rotated here, independently).
    rope_panel = window.panel("RoPE")
    window.bring_forward(("RoPE",))
    settle(qtbot, window)
    rope_panel.check_shift()
    change = float(re.search(r"at most (\S+),", rope_panel.shift_result.text())[1])
    assert change < 1e-12
    pos = np.arange(s.n)
    Q, K = s.X @ s.W_Q[0], s.X @ s.W_K[0]
    moved = rope_half(Q, pos + 1000) @ rope_half(K, pos + 1000).T
    np.testing.assert_allclose(moved, rope_half(Q, pos) @ rope_half(K, pos).T, atol=1e-12)
    np.testing.assert_allclose(window.compute.result.scores[0], moved, atol=1e-12)

    # The sliding-window preset: weights only on the last 4 keys of each row.
    window.doc.replace(make_preset("sliding-window"), "Preset")
    settle(qtbot, window)
    n = window.doc.scenario.n
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    band = (j <= i) & (j > i - 4)
    weights = window.compute.result.weights
    assert (weights[:, ~band] == 0).all() and (weights[:, band] > 0).all()

    # The sinks preset: each row sums to 1 − exp(sink) / (exp(sink) + Σ exp(scores)).
    window.doc.replace(make_preset("sinks"), "Preset")
    settle(qtbot, window)
    s, r = window.doc.scenario, window.compute.result
    for h, sink in enumerate(s.settings.sinks):
        S = (s.X @ s.W_Q[h]) @ (s.X @ s.W_K[h]).T / np.sqrt(s.d_k)
        S[np.triu_indices(s.n, 1)] = -np.inf
        z = np.exp(S).sum(axis=1)
        np.testing.assert_allclose(r.row_sum[h], z / (z + np.exp(sink)), atol=EXACT)
        assert (r.row_sum[h] < 1).all()


def minus_sign(x: float) -> str:
    return f"{x:.2f}".replace("-", "−")


def test_stage_9_a_rising_maximum_rescales_the_sum_tiles_past_the_diagonal_are_skipped(
    stage, qtbot
):
    from PySide6.QtCore import Qt

    window = stage(9)
    assert not window.docks["Tiling"].visibleRegion().isEmpty()  # brought forward
    panel = window.panel("Tiling")
    qtbot.waitUntil(lambda: panel.pass_ is not None, timeout=5000)
    assert (panel.block_q.value(), panel.block_k.value()) == (2, 2)
    S = (ref.X @ ref.W_Q[0]) @ (ref.X @ ref.W_K[0]).T / np.sqrt(2)
    S[np.triu_indices(4, 1)] = -np.inf
    dense = softmax(S) @ (ref.X @ ref.W_V[0])

    panel.setFocus()
    for _ in range(4):  # "press Step (→) four times"
        qtbot.keyClick(panel, Qt.Key.Key_Right)
    assert panel.position == 4 == panel.steps
    # Row 4 (cat): its second tile (keys 3–4) holds a larger score, so m rises...
    m_old, m_new = S[3, :2].max(), S[3, :4].max()
    assert m_new > m_old
    # ... and l is rescaled by e^(m_old − m_new) before the tile's terms are added.
    l_old = np.exp(S[3, :2] - m_old).sum()
    l_new = l_old * np.exp(m_old - m_new) + np.exp(S[3, 2:4] - m_new).sum()
    assert l_new == pytest.approx(np.exp(S[3] - m_new).sum(), rel=1e-14)
    m_col, l_col = panel.scores.strip.columns
    assert m_col.values[3] == pytest.approx(m_new, abs=EXACT)
    assert l_col.values[3] == pytest.approx(l_new, abs=EXACT)
    assert f"e^({minus_sign(m_old)}−{minus_sign(m_new)})" in panel.arithmetic.text()
    # Then the output equals dense attention.
    np.testing.assert_allclose(panel.out_view.spec.values, dense, atol=EXACT)

    # B_r = B_c = 1: 16 tiles, the 6 above the diagonal (key after query) skipped.
    panel.block_q.setValue(1)
    panel.block_k.setValue(1)
    qtbot.waitUntil(lambda: panel.steps == 16, timeout=5000)
    above = {(i, i + 1, j, j + 1) for i in range(4) for j in range(4) if j > i}
    assert len(above) == 6 and set(panel.grid.skipped) == above

    # float16: the output moves by less than 10⁻³.
    panel.precision.setCurrentText("float16")
    qtbot.waitUntil(lambda: panel.pass_.tiling.precision == "float16", timeout=5000)
    while panel.buttons["step"].isEnabled():
        panel.buttons["step"].click()
    moved = np.abs(panel.out_view.spec.values - dense).max()
    assert 0 < moved < 1e-3
