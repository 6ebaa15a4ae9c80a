"""The experiments: sampled q·k statistics, softmax saturation, permuting the tokens."""

import dataclasses
import math

import numpy as np
import pytest
import reference as ref

from attnviz.core.maths import experiments
from attnviz.core.maths.experiments import (
    Permutation,
    RowSummary,
    ScalingStats,
    permutation,
    row_summary,
    saturation,
    scaling_variance,
)
from attnviz.core.maths.scenario import Scenario, ScenarioError, Settings

SIGMAS = 6


def tolerances(d_k: int, pairs: int) -> tuple[float, float]:
    """Safe bounds (mean, variance) on the sampling error of q·k over `pairs` pairs.

    With q, k i.i.d. N(0, 1) in d dimensions, Z = q·k = Σ q_i k_i has mean 0 and
    variance d. Its fourth moment: E[Z⁴] = Σ_i E[q_i⁴]E[k_i⁴] + 3 Σ_{i≠j} E[q_i²k_i²]E[q_j²k_j²]
    = 9d + 3d(d − 1) = 3d² + 6d. So over N pairs the sample mean has sd √(d/N) and the
    sample variance has sd √((E[Z⁴] − d²)/N) = √((2d² + 6d)/N) (large-N formula; the
    N − 1 correction is below 1e-4 of it at N = 20000). The variance estimator divides by
    N, which biases it by −d/N; that is added to the bound. Both sample statistics are
    close to normal at this N (CLT), so six sd leaves about 2e-9 chance of a false failure
    per check for any seed, while a missing or doubled scale is off by hundreds of sd.
    """
    mean_tol = SIGMAS * math.sqrt(d_k / pairs)
    var_tol = SIGMAS * math.sqrt((2 * d_k**2 + 6 * d_k) / pairs) + d_k / pairs
    return mean_tol, var_tol


def check(record: ScalingStats) -> None:
    d, n = record.d_k, record.pairs
    mean_tol, var_tol = tolerances(d, n)
    assert abs(record.mean_raw) <= mean_tol
    assert abs(record.var_raw - d) <= var_tol
    # The scaled statistics are the raw ones divided by √d and d.
    assert abs(record.mean_scaled) <= mean_tol / math.sqrt(d)
    assert abs(record.var_scaled - 1.0) <= var_tol / d


def test_defaults_show_variance_d_k_and_one_after_scaling():
    records = scaling_variance()
    assert [r.d_k for r in records] == [2, 64, 512]
    assert all(r.pairs == 20000 for r in records)
    for r in records:
        check(r)
    # The point of stage 4: unscaled variance grows with d_k, scaled stays near 1.
    big = records[-1]
    assert big.var_raw > 400
    assert 0.9 < big.var_scaled < 1.1


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_other_seeds_within_bounds(seed):
    for r in scaling_variance((1, 2, 64), pairs=20000, seed=seed):
        check(r)


def test_scaled_is_raw_divided():
    for r in scaling_variance((2, 7, 64), pairs=1000, seed=5):
        assert r.mean_scaled == pytest.approx(r.mean_raw / math.sqrt(r.d_k), rel=1e-12, abs=1e-15)
        assert r.var_scaled == pytest.approx(r.var_raw / r.d_k, rel=1e-12)


def test_matches_a_plain_sample_for_one_width():
    # An independent draw of the same numbers: one (pairs, 2, d_k) block from the same
    # seeding, statistics with numpy's own mean and var.
    qk = np.random.default_rng([7, 16]).standard_normal((300, 2, 16))
    dots = (qk[:, 0] * qk[:, 1]).sum(axis=1)
    (r,) = scaling_variance((16,), pairs=300, seed=7)
    assert r.mean_raw == pytest.approx(dots.mean(), rel=1e-12, abs=1e-14)
    assert r.var_raw == pytest.approx(dots.var(), rel=1e-12)


def test_seeded_and_reproducible():
    a = scaling_variance((2, 64), pairs=2000, seed=11)
    b = scaling_variance((2, 64), pairs=2000, seed=11)
    c = scaling_variance((2, 64), pairs=2000, seed=12)
    assert a == b
    assert a != c
    # Each width has its own stream: its record does not depend on the other widths.
    assert scaling_variance((64,), pairs=2000, seed=11)[0] == a[1]


def test_records_are_frozen():
    r = scaling_variance((2,), pairs=10)[0]
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.var_raw = 0.0  # type: ignore[misc]


def test_blocks_do_not_change_the_result(monkeypatch):
    whole = scaling_variance((3, 64), pairs=500, seed=4)
    monkeypatch.setattr(experiments, "_BLOCK_NUMBERS", 100)  # 16 and 1 pairs per block
    assert scaling_variance((3, 64), pairs=500, seed=4) == whole


def test_one_pair():
    (r,) = scaling_variance((8,), pairs=1)
    assert r.var_raw == 0.0 and r.var_scaled == 0.0
    assert math.isfinite(r.mean_raw)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"pairs": 0}, "pairs"),
        ({"pairs": 1_000_001}, "pairs"),
        ({"pairs": 2.5}, "pairs"),
        ({"pairs": True}, "pairs"),
        ({"pairs": "100"}, "pairs"),
        ({"d_ks": ()}, "d_ks"),
        ({"d_ks": 64}, "d_ks"),
        ({"d_ks": "64"}, "d_ks"),
        ({"d_ks": (2, 0)}, r"d_ks\[1\]"),
        ({"d_ks": (4097,)}, r"d_ks\[0\]"),
        ({"d_ks": (2.0,)}, r"d_ks\[0\]"),
        ({"seed": -1}, "seed"),
        ({"seed": None}, "seed"),
    ],
)
def test_bad_arguments(kwargs, name):
    with pytest.raises(ValueError, match=f"^{name}: "):
        scaling_variance(**kwargs)


def test_limits_accepted():
    (r,) = scaling_variance((4096,), pairs=3)
    assert r.d_k == 4096 and r.pairs == 3
    assert scaling_variance((np.int64(1),), pairs=np.int64(2))[0].d_k == 1


# Saturation ----------------------------------------------------------------------------


def test_brief_scores_and_times_eight():
    weights, scaled = saturation([2, 1, 0, -1], 8)
    # By hand: e² = 7.389, e¹ = 2.718, e⁰ = 1, e⁻¹ = 0.368; sum 11.475.
    assert weights == pytest.approx([0.64, 0.24, 0.09, 0.03], abs=0.005)
    e = [math.exp(s) for s in (2, 1, 0, -1)]
    assert weights == pytest.approx([v / sum(e) for v in e], rel=1e-14)
    # Times 8: scores [16, 8, 0, -8]; relative to the max, e⁰, e⁻⁸, e⁻¹⁶, e⁻²⁴.
    assert scaled == pytest.approx([1, 0, 0, 0], abs=5e-4)
    e8 = [math.exp(-d) for d in (0, 8, 16, 24)]
    assert scaled == pytest.approx([v / sum(e8) for v in e8], rel=1e-14)
    assert weights.dtype == np.float64 and not weights.flags.writeable


def test_saturation_entropy_and_peak():
    weights, scaled = saturation([2, 1, 0, -1], 8)
    before, after = row_summary(weights), row_summary(scaled)
    assert before.max_weight == pytest.approx(0.644, abs=1e-3)
    assert after.max_weight > 0.999
    assert after.entropy < 0.01 < 0.9 < before.entropy < math.log(4)


def test_large_scores_do_not_overflow():
    weights, scaled = saturation([1000.0, 0.0, -1000.0], 1)
    assert np.isfinite(weights).all() and weights[0] == 1.0
    assert scaled.tolist() == weights.tolist()


def test_factor_zero_is_uniform_and_negative_flips():
    _, uniform = saturation([3, -1, 2], 0)
    assert uniform == pytest.approx([1 / 3] * 3, rel=1e-15)
    weights, flipped = saturation([1, 0], -1)
    assert flipped == pytest.approx(weights[::-1], rel=1e-15)


@pytest.mark.parametrize(
    "scores, factor, name",
    [
        ([], 2, "scores"),
        ([[1, 2]], 2, "scores"),
        ([1, float("nan")], 2, "scores"),
        ([1, float("inf")], 2, "scores"),
        (["a", "b"], 2, "scores"),
        ([1, 2], float("nan"), "factor"),
        ([1, 2], "8", "factor"),
        ([1, 2], 1j, "factor"),
        ([1e308, 0], 8, "factor"),
    ],
)
def test_saturation_bad_arguments(scores, factor, name):
    with pytest.raises(ValueError, match=f"^{name}: "):
        saturation(scores, factor)


def test_row_summary():
    assert row_summary([0.25] * 4) == RowSummary(
        entropy=pytest.approx(math.log(4)), max_weight=0.25
    )
    one_hot = row_summary([0.0, 1.0, 0.0])
    assert one_hot.entropy == 0.0 and math.copysign(1, one_hot.entropy) == 1
    assert one_hot.max_weight == 1.0
    # −(0.5 ln 0.5 + 0.25 ln 0.25 · 2) = 1.5 ln 2
    assert row_summary([0.5, 0.25, 0.25]).entropy == pytest.approx(1.5 * math.log(2), rel=1e-15)
    for bad in ([], [[0.5, 0.5]], [1.5, -0.5], [float("nan")]):
        with pytest.raises(ValueError, match=r"^weights: "):
            row_summary(bad)


# Permuting the tokens: expected values from the plain reference in tests/reference.py.


def scenario(mask: str = "none", positional: str = "none", X: np.ndarray = ref.X) -> Scenario:
    return Scenario(
        ("a", "b", "c", "d"),
        X,
        ref.W_Q,
        ref.W_K,
        ref.W_V,
        ref.W_O,
        settings=Settings(mask=mask, positional=positional),
    )


def reference_final(X: np.ndarray, mask: str, positional: str) -> np.ndarray:
    """The final output by the reference; position encoding added by position, not token."""
    if positional == "sinusoidal":
        X = X + ref.sinusoidal(*X.shape)
    return ref.multi_head(X, ref.W_Q, ref.W_K, ref.W_V, ref.W_O, mask=mask)[2]


def reference_change(order: list[int], mask: str, positional: str) -> tuple[float, float]:
    """Largest |final(X[order])[i] − final(X)[order[i]]|, and the largest |final(X)|."""
    before = reference_final(ref.X, mask, positional)
    after = reference_final(ref.X[order], mask, positional)
    return float(np.abs(after - before[order]).max()), float(np.abs(before).max())


REVERSE, SHUFFLE = [3, 2, 1, 0], [2, 0, 3, 1]


@pytest.mark.parametrize("order", [REVERSE, SHUFFLE])
def test_without_mask_or_position_the_outputs_are_only_permuted(order):
    result = permutation(scenario(), order)
    expected, largest = reference_change(order, "none", "none")
    assert expected < 1e-14  # the reference agrees that nothing moved but the rows
    assert result.max_change <= 1e-14
    assert result.order == tuple(order)
    assert result.tolerance == pytest.approx(1e-12 * max(1.0, largest), rel=1e-12)
    assert result.permuted_only
    assert result.conditions == "no mask and no position encoding"
    assert result.verdict == "the outputs were only permuted"
    assert result.text == (
        "With no mask and no position encoding: the outputs were only permuted "
        f"(largest change {result.max_change:.3g})."
    )


@pytest.mark.parametrize(
    "mask, positional",
    [("causal", "none"), ("none", "sinusoidal"), ("causal-zero", "sinusoidal")],
)
@pytest.mark.parametrize("order", [REVERSE, SHUFFLE])
def test_a_mask_or_positions_change_the_outputs(order, mask, positional):
    result = permutation(scenario(mask, positional), order)
    expected, _ = reference_change(order, mask, positional)
    assert expected > 1e-3  # a real change, by the reference
    assert result.max_change == pytest.approx(expected, rel=1e-9)
    assert not result.permuted_only
    assert result.conditions == f"mask {mask}, position {positional}"
    assert result.text == (
        f"With mask {mask}, position {positional}: the outputs changed "
        f"(largest change {expected:.3g})."
    )


@pytest.mark.parametrize("mask", ["none", "causal", "drop-after-softmax"])
def test_the_same_order_changes_nothing(mask):
    result = permutation(scenario(mask, "sinusoidal"), [0, 1, 2, 3])
    assert result.max_change == 0.0
    assert result.permuted_only


def test_the_tolerance_follows_the_size_of_the_outputs():
    big = scenario(X=ref.X * 1e6)
    result = permutation(big, REVERSE)
    largest = float(np.abs(reference_final(ref.X * 1e6, "none", "none")).max())
    assert largest > 1e5
    assert result.tolerance == pytest.approx(1e-12 * largest, rel=1e-9)
    assert result.permuted_only  # rounding at 1e6 is still within the tolerance


def test_permutation_is_frozen_and_rejects_a_bad_order():
    result = permutation(scenario(), REVERSE)
    assert isinstance(result, Permutation)
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.max_change = 1.0  # type: ignore[misc]
    for bad in ([0, 1, 2], [0, 0, 1, 2], [1, 2, 3, 4]):
        with pytest.raises(ScenarioError, match=r"^tokens: "):
            permutation(scenario(), bad)


def test_gradient_gain_is_the_median_share_of_a_gradient_that_gets_back_through_softmax():
    from attnviz.core.maths.experiments import gradient_gain

    (got,) = gradient_gain((8,), keys=5, rows=40, seed=3)
    rng = np.random.default_rng([3, 8])  # the same draws, in the same order, one block
    q, K, dP = (
        rng.standard_normal((40, 8)),
        rng.standard_normal((40, 5, 8)),
        rng.standard_normal((40, 5)),
    )
    gains = {True: [], False: []}
    for r in range(40):
        for scaled in (True, False):
            s = K[r] @ q[r] / (np.sqrt(8) if scaled else 1.0)
            P = np.exp(s - s.max()) / np.exp(s - s.max()).sum()
            J = np.diag(P) - np.outer(P, P)  # the softmax's Jacobian, by hand
            gains[scaled].append(np.linalg.norm(J @ dP[r]) / np.linalg.norm(dP[r]))
    assert got.scaled == pytest.approx(np.median(gains[True]), rel=1e-12)
    assert got.unscaled == pytest.approx(np.median(gains[False]), rel=1e-12)


def test_without_scaling_the_gradient_through_softmax_vanishes_as_d_k_grows():
    from attnviz.core.maths.experiments import gradient_gain

    gains = {g.d_k: g for g in gradient_gain((1, 64, 1024), rows=500, seed=0)}
    assert gains[1].scaled == pytest.approx(gains[1].unscaled)  # √1 = 1
    for g in gains.values():
        assert 0.04 < g.scaled < 0.1  # scaled: the same share at every width
    assert 2 < gains[64].scaled / gains[64].unscaled < 10
    assert gains[1024].scaled / gains[1024].unscaled > 1000  # orders of magnitude
