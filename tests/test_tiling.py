"""FlashAttention-2's tiled pass against dense attention, step by step and in the end."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from variant_reference import random_scenario

from attnviz.cli import main
from attnviz.core.maths.forward import compute
from attnviz.core.maths.scenario import Scenario, ScenarioError
from attnviz.core.maths.tiling import blocks_for_memory, tiles, traffic
from attnviz.core.presets import make_preset, worked_example

EXACT = 1e-12


def plain_reference(s: Scenario, h: int):
    """Causal softmax attention of head h in a few lines: output, LSE and weights."""
    Q, K, V = s.X @ s.W_Q[h], s.X @ s.W_K[h], s.X @ s.W_V[h]
    S = Q @ K.T / math.sqrt(s.d_k)
    S[np.triu_indices(s.n, 1)] = -np.inf
    top = S.max(axis=1, keepdims=True)
    lse = top[:, 0] + np.log(np.exp(S - top).sum(axis=1))
    W = np.exp(S - lse[:, None])
    return W @ V, lse, W


@pytest.mark.parametrize("block_q,block_k", [(1, 1), (2, 2), (3, 2), (2, 5), (7, 7), (16, 3)])
def test_the_tiled_pass_equals_dense_attention_by_hand(block_q, block_k):
    rng = np.random.default_rng(block_q * 10 + block_k)
    s = random_scenario(rng, 7, 7, 5, 2, 2, 3, mask="causal")
    for h in range(2):
        t = tiles(s, h, block_q, block_k)
        out, lse, W = plain_reference(s, h)
        np.testing.assert_allclose(t.output, out, rtol=0, atol=EXACT)
        np.testing.assert_allclose(t.lse, lse, rtol=0, atol=EXACT)
        np.testing.assert_allclose(t.weights_from_lse, W, rtol=0, atol=EXACT)


def test_every_step_follows_the_online_softmax_recurrence():
    s = make_preset("gpt2-small", n=6)
    t = tiles(s, 3, 2, 2)
    for step in t.steps:
        if step.skipped:
            np.testing.assert_array_equal(step.m_new, step.m_old)
            continue
        np.testing.assert_allclose(step.m_new, np.maximum(step.m_old, step.scores.max(axis=1)))
        seen = np.isfinite(step.m_old)
        expected_rescale = np.where(seen, np.exp(np.where(seen, step.m_old, 0) - step.m_new), 0)
        np.testing.assert_allclose(step.rescale, expected_rescale, rtol=1e-15)
        np.testing.assert_allclose(
            step.l_new, step.rescale * step.l_old + np.exp(step.scores - step.m_new[:, None]).sum(1)
        )
        assert (step.m_new >= step.m_old).all()


def test_causal_tiles_above_the_diagonal_are_skipped_and_counted():
    s = make_preset("gpt2-small", n=10)  # causal
    t = tiles(s, 0, 3, 2)
    # Counted here: a tile is hidden when its first key comes after its last query.
    expected = sum(
        1 for r0 in range(0, 10, 3) for c0 in range(0, 10, 2) if c0 > min(10, r0 + 3) - 1
    )
    assert t.skipped == expected == 5 and len(t.steps) == 4 * 5  # 3 + 2 + 0 + 0
    assert all(s.scores.size == 0 for s in t.steps if s.skipped)
    # A tile on the diagonal is computed, its future keys masked with −∞.
    diagonal = next(x for x in t.steps if x.rows == (3, 6) and x.cols == (4, 6))
    assert np.isneginf(diagonal.scores[0, 1]) and np.isfinite(diagonal.scores[2, 1])


VARIANTS = [
    {"mask": "none"},
    {"mask": "causal"},
    {"mask": "causal", "causal_alignment": "bottom-right"},
    {"mask": "sliding-window", "window": 3},
    {"mask": "custom"},
    {"mask": "causal", "positional": "alibi"},
    {
        "mask": "none",
        "positional": "relative-bias",
        "relative_buckets": 8,
        "relative_max_distance": 3,
        "scale": False,
    },
    {"mask": "causal", "softcap": 2.0},
    {"mask": "causal", "sinks": (0.5, -1.0, 2.0, 0.0)},
    {"mask": "causal", "positional": "rope", "qk_norm": "rms"},
    {"mask": "none", "scale_value": 0.3},
]


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: "-".join(map(str, v.values())))
@given(
    n=st.integers(1, 9),
    cross=st.booleans(),
    block_q=st.integers(1, 5),
    block_k=st.integers(1, 5),
    seed=st.integers(0, 2**16),
)
@settings(max_examples=12, deadline=None)
def test_every_variant_equals_the_dense_engine(variant, n, cross, block_q, block_k, seed):
    rng = np.random.default_rng(seed)
    m = n + 2 if cross else n
    s = random_scenario(rng, n, m, 6, 4, 2, 3, **variant)  # GQA: 4 query heads over 2
    r = compute(s)
    for h in (0, 3):
        t = tiles(s, h, block_q, block_k)
        head = r.heads[h]
        np.testing.assert_allclose(t.output, head.output, rtol=0, atol=EXACT)
        np.testing.assert_allclose(t.weights_from_lse, head.weights, rtol=0, atol=EXACT)
        # The LSE, independently: log of the softmax denominator of what softmax sees.
        masked = head.masked
        sink = None if s.settings.sinks is None else s.settings.sinks[h]
        with np.errstate(divide="ignore"):
            total = np.exp(masked).sum(axis=1) + (0 if sink is None else np.exp(sink))
            np.testing.assert_allclose(t.lse, np.log(total), rtol=1e-12, atol=EXACT)


@pytest.mark.parametrize(
    "precision,bound", [("float32", 1e-6), ("float16", 1e-3), ("bfloat16", 1e-2)]
)
def test_lower_precisions_stay_within_the_stated_bounds(precision, bound):
    worst = 0.0
    for seed in range(20):
        rng = np.random.default_rng(seed)
        s = random_scenario(rng, 12, 12, 16, 1, 1, 16, mask="causal")
        # W_Q, W_K as at initialisation (÷ √d_model): scores of a few units, as in models
        s = dataclasses.replace(s, W_Q=s.W_Q / 4, W_K=s.W_K / 4)
        exact, low = tiles(s, 0, 4, 4), tiles(s, 0, 4, 4, precision)
        V = s.X @ s.W_V[0]
        error = np.abs(low.output - exact.output).max() / np.abs(V).max()
        worst = max(worst, error)
    assert 0 < worst <= bound  # relative to the largest |V|, as the README states


def test_bfloat16_rounding_matches_torch():
    torch = pytest.importorskip("torch")
    from attnviz.core.maths.tiling import _rounded

    x = np.random.default_rng(1).normal(size=1000) * 10.0 ** np.random.default_rng(2).integers(
        -8, 8, 1000
    )
    ours = _rounded(x, "bfloat16")
    theirs = torch.tensor(x, dtype=torch.float32).to(torch.bfloat16).float().numpy()
    np.testing.assert_array_equal(ours, theirs)


def test_traffic_follows_the_papers_counts():
    n, m, d = 1024, 1024, 64
    got = traffic(n, m, d, block_q=128)
    # Dense: read Q, K (2nd), write S (n²); read S (n²), write P (n²); read P, V, write O.
    assert got.dense_reads == 2 * n * d + n * m + n * m + m * d
    assert got.dense_writes == n * m + n * m + n * d
    # Tiled: Q once; K and V once per query block; O and the LSE written once.
    assert got.tiled_reads == n * d + (n // 128) * 2 * m * d
    assert got.tiled_writes == n * d + n
    assert blocks_for_memory(100_000, 64) == (64, 391)  # B_c = ⌈M/4d⌉, B_r = min(B_c, d)
    with pytest.raises(ScenarioError, match="at least 4·d"):
        blocks_for_memory(100, 64)
    # A causal pass skips tiles: fewer K and V reads, counted from the tiles it ran.
    t = tiles(make_preset("gpt2-small", n=8), 0, 2, 2)
    ran = [x for x in t.steps if not x.skipped]
    assert t.traffic().tiled_reads == 8 * 64 + sum(2 * (x.cols[1] - x.cols[0]) * 64 for x in ran)


def test_what_a_kernel_does_not_do_is_refused():
    s = worked_example()
    for mask in ("causal-zero", "drop-after-softmax"):
        with pytest.raises(ScenarioError, match=f"mask '{mask}'"):
            tiles(s.with_settings(mask=mask))
    with pytest.raises(ScenarioError, match="dropout"):
        tiles(s.with_settings(dropout=0.1))
    with pytest.raises(ScenarioError, match="block_q"):
        tiles(s, block_q=0)
    with pytest.raises(ScenarioError, match="precision 'int8'"):
        tiles(s, precision="int8")


def test_the_tiles_command_prints_json_with_one_based_ranges(capsys):
    assert main(["tiles", "--block-q", "3", "--block-k", "2", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    s = worked_example()
    out, lse, W = plain_reference(s, 0)
    assert [x["q_rows"] for x in doc["steps"]][:2] == [[1, 3], [1, 3]]
    assert doc["steps"][1]["k_cols"] == [3, 4] and doc["steps"][1]["skipped"] is False
    np.testing.assert_allclose(doc["output"], out, atol=EXACT)
    np.testing.assert_allclose(doc["lse"], lse, atol=EXACT)
    np.testing.assert_allclose(doc["weights_from_lse"], W, atol=EXACT)
    assert doc["traffic"]["dense_writes"] == 2 * 16 + 4 * 2
    assert main(["tiles", "--head", "9"]) == 2
    assert "the scenario has 2 head(s)" in capsys.readouterr().err
    assert main(["tiles", "--mask", "causal-zero"]) == 2


# The worked arithmetic of a step ------------------------------------------------------


def two(x: float) -> str:
    """Two decimals with a real minus sign, as the worked arithmetic prints them."""
    return f"{x:.2f}".replace("-", "−")


def worked_scores() -> np.ndarray:
    """Head 1 of the worked example, scaled and causal, computed here."""
    s = worked_example()
    S = (s.X @ s.W_Q[0]) @ (s.X @ s.W_K[0]).T / math.sqrt(2)
    S[np.triu_indices(4, 1)] = -np.inf
    return S


def test_describe_step_writes_out_the_rescaling_of_a_row():
    from attnviz.core.maths.tiling import describe_step

    S = worked_scores()
    t = tiles(worked_example(), 0, 2, 2)
    step = t.steps[3]  # rows 3–4 × keys 3–4, the block's last tile
    assert (step.rows, step.cols, step.last) == ((2, 4), (2, 4), True)
    m_old, m_new = S[3, :2].max(), S[3, :4].max()
    l_old = np.exp(S[3, :2] - m_old).sum()
    l_new = np.exp(S[3, :4] - m_new).sum()
    assert m_new > m_old  # the maximum moves: the old sum is rescaled
    text = describe_step(step, 3, worked_example().tokens)
    assert text.startswith("row 4 (cat), keys 3–4: ")
    assert f"m {two(m_old)} → {two(m_new)} (tile max {two(S[3, 2:4].max())})" in text
    assert f"l = {two(l_old)} × e^({two(m_old)}−{two(m_new)})" in text
    for s in S[3, 2:4]:
        assert f"e^({two(s)}−{two(m_new)})" in text
    assert f"= {two(l_new)}; O = O × {two(np.exp(m_old - m_new))} + P·V" in text
    lse = m_new + np.log(l_new)
    assert text.endswith(f"block done: out = O / {two(l_new)}, LSE = m + ln l = {two(lse)}")


def test_describe_step_names_masked_keys_skipped_tiles_and_first_tiles():
    from attnviz.core.maths.tiling import describe_step

    S = worked_scores()
    tokens = worked_example().tokens
    t = tiles(worked_example(), 0, 2, 2)
    first = describe_step(t.steps[0], 0, tokens)  # row 1 sees key 1 only
    s00 = two(S[0, 0])
    exponent = f"{s00}−{s00}" if S[0, 0] >= 0 else f"{s00}+{two(-S[0, 0])}"
    assert first == (
        f"row 1 (she), keys 1–2: m −∞ → {s00}; l = e^({exponent}) = 1.00; O = P·V (key 2 masked)"
    )
    skipped = describe_step(t.steps[1], 1, tokens)  # rows 1–2 × keys 3–4: all future
    l_row2 = np.exp(S[1, :2] - S[1, :2].max()).sum()
    assert skipped.startswith(
        f"row 2 (saw), keys 3–4: tile skipped (the mask hides all of it): m {two(S[1, :2].max())}"
        f", l {two(l_row2)} and O unchanged; block done: out = O / {two(l_row2)}"
    )
    row3 = describe_step(t.steps[3], 2, tokens)
    assert "(key 4 masked)" in row3 and "stays" in row3  # S[2, 2] is not above the old max
    assert S[2, 2] <= S[2, :2].max()
    with pytest.raises(ValueError, match="row 1: the step covers rows 3–4"):
        describe_step(t.steps[3], 0, tokens)


def test_describe_step_sums_many_keys_in_one_term():
    from attnviz.core.maths.tiling import describe_step

    s = make_preset("gpt2-small", n=12)  # causal
    t = tiles(s, 0, 12, 6)
    step = t.steps[1]  # all 12 rows × keys 7–12
    Q, K = s.X @ s.W_Q[0], s.X @ s.W_K[0]
    S = Q @ K.T / math.sqrt(64)
    S[np.triu_indices(12, 1)] = -np.inf
    m_new = S[11].max()
    assert m_new >= S[11, :6].max()
    text = describe_step(step, 11)
    total = np.exp(S[11, 6:] - m_new).sum()
    assert text.startswith("row 12, keys 7–12: ")
    assert f"Σ e^(s − {two(m_new)}) over 6 keys ({two(total)})" in text
    assert "keys 9–12 masked" in describe_step(step, 7)  # row 8 sees keys 7 and 8 only


def test_the_cost_dock_traffic_counts_skipped_causal_tiles():
    from attnviz.core.maths.cost import FAST_MEMORY, Cost

    moved, b_r, b_c = Cost(1000, 12, 64, causal=True).traffic()
    assert (b_r, b_c) == (64, math.ceil(FAST_MEMORY / 256))
    # A query block ending at row r reads the key tiles that start at or before r.
    columns = sum(min(1000, math.ceil(min(1000, r + 64) / b_c) * b_c) for r in range(0, 1000, 64))
    assert moved.tiled_reads == 1000 * 64 + 2 * columns * 64
    full, _, _ = Cost(1000, 12, 64).traffic()
    assert full.tiled_reads == 1000 * 64 + math.ceil(1000 / 64) * 2 * 1000 * 64
    assert full.dense == moved.dense == 3 * 1000 * 64 + 2 * 1000**2 + 2 * 1000**2 + 1000 * 64
