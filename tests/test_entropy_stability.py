"""Row entropy at every score size, and the numbers check that compares the engines.

Expected entropies come from mpmath at 50 digits, from scores computed here exactly
(integer and dyadic inputs whose products float64 holds without rounding), never from
the engine. The check must flag a 0.08 disagreement in any row statistic at any size.
"""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction

import mpmath
import numpy as np
import pytest

from attnviz.core.maths.forward import compute
from attnviz.core.maths.results import Result, RowStats
from attnviz.core.maths.scenario import Scenario, Settings
from attnviz.core.presets import random_scenario, worked_example

ENGINES = ["numpy", "torch"]


def engine(name: str, s: Scenario) -> Result:
    if name == "numpy":
        return compute(s)
    pytest.importorskip("torch")
    from attnviz.core.maths.torch_engine import compute_torch

    return compute_torch(s, "cpu", "float64")


def scenario(X: np.ndarray, mask: str = "none", **settings: object) -> Scenario:
    """X itself as Q = K = V (projections off, no scaling): scores are X Xᵀ."""
    n, d = X.shape
    st = Settings(projections=False, scale=False, mask=mask, **settings)  # type: ignore[arg-type]
    return Scenario(
        tokens=tuple(f"t{i}" for i in range(n)),
        X=X,
        W_Q=np.ones((1, d, 1)),
        W_K=np.ones((1, d, 1)),
        W_V=np.ones((1, d, 1)),
        W_O=np.ones((1, d)),
        settings=st,
    )


def exact_scores(X: np.ndarray) -> list[list[Fraction]]:
    rows = [[Fraction(float(v)) for v in row] for row in X]
    return [
        [sum((a * b for a, b in zip(q, k, strict=True)), Fraction(0)) for k in rows] for q in rows
    ]


def mp_entropy(scores: list[Fraction]) -> float:
    """−Σ p log p of softmax(scores), in 50-digit arithmetic."""
    with mpmath.workdps(50):
        s = [mpmath.mpf(x.numerator) / x.denominator for x in scores]
        top = max(s)
        e = [mpmath.exp(x - top) for x in s]
        Z = mpmath.fsum(e)
        return float(-mpmath.fsum(w / Z * mpmath.log(w / Z) for w in e if w / Z > 0))


def expected_entropy(X: np.ndarray, causal: bool) -> np.ndarray:
    S = exact_scores(X)
    return np.array([mp_entropy(row[: i + 1] if causal else row) for i, row in enumerate(S)])


# Entropy against 50-digit arithmetic -------------------------------------------------------


@pytest.mark.parametrize("name", ENGINES)
@pytest.mark.parametrize("value", [1.0, 1e2, 1e4, 3e5, 1e6])
@pytest.mark.parametrize("mask", ["none", "causal"])
def test_equal_scores_have_entropy_ln_n_at_any_size(name: str, value: float, mask: str) -> None:
    # 8 equal tokens: every score is value², so each row is uniform over the keys it sees.
    r = engine(name, scenario(np.full((8, 1), value), mask))
    seen = np.arange(1, 9) if mask == "causal" else np.full(8, 8)
    np.testing.assert_allclose(r.entropy[0], [math.log(k) for k in seen], rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", ENGINES)
def test_a_long_uniform_row_at_the_value_limit(name: str) -> None:
    r = engine(name, scenario(np.full((2048, 1), 1e6)))
    np.testing.assert_allclose(r.entropy[0], math.log(2048), rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", ENGINES)
@pytest.mark.parametrize("big", [1.0, 1e3, 1e5, 1e6])
@pytest.mark.parametrize("mask", ["none", "causal", "causal-zero"])
def test_entropy_matches_50_digits_over_a_large_offset(name: str, big: float, mask: str) -> None:
    # Tokens (big, c): scores big² + c_i·c_j, up to 1e12 with differences of order 1.
    rng = np.random.default_rng(3)
    c = rng.integers(-12, 13, size=10) / 4
    X = np.stack([np.full(10, big), c], axis=1)
    r = engine(name, scenario(X, mask))
    if mask == "causal-zero":  # future keys score 0: far below big² and thus weight 0
        X_rows = exact_scores(X)
        want = [mp_entropy(row[: i + 1] + [Fraction(0)] * (9 - i)) for i, row in enumerate(X_rows)]
    else:
        want = list(expected_entropy(X, mask == "causal"))
    np.testing.assert_allclose(r.entropy[0], want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", ENGINES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_entropy_of_the_engines_own_scores_at_the_value_limit(name: str, seed: int) -> None:
    # Any scores at all: the entropy is that of the masked scores the engine produced.
    s = random_scenario(n=12, d_model=6, heads=2, d_k=3, seed=seed)
    scale = 10.0 ** np.random.default_rng(seed).uniform(0, 6, size=s.X.shape)
    s = dataclasses.replace(s, X=np.clip(s.X * scale, -1e6, 1e6))
    r = engine(name, s)
    for h in range(r.n_heads):
        for i in range(s.n):
            row = [Fraction(float(v)) for v in r.masked[h, i] if np.isfinite(v)]
            assert r.entropy[h, i] == pytest.approx(mp_entropy(row), rel=1e-12, abs=1e-12)


def test_a_fully_masked_row_has_entropy_zero() -> None:
    from attnviz.core.maths.scoring import row_entropy, softmax_rows

    S = np.array([[1e6, -np.inf], [-np.inf, -np.inf]])
    p, m, Z, empty = softmax_rows(S)
    assert row_entropy(S, p, m, Z, empty).tolist() == [0.0, 0.0]


# The numbers check --------------------------------------------------------------------------


def shifted(r: Result, name: str, head: int, row: int, by: float) -> Result:
    """r with one row statistic (or one weight) of one head moved by `by`."""
    a = np.array(getattr(r.heads[head], name))
    if a.ndim == 1:
        a[row] += by
    else:
        a[row, 0] += by
    heads = list(r.heads)
    h = heads[head]
    if name in ("leak", "row_sum", "entropy"):
        stats = {field: getattr(h, field) for field in ("leak", "row_sum", "entropy")}
        heads[head] = dataclasses.replace(h, rows=RowStats(**{**stats, name: a}))
    else:
        heads[head] = dataclasses.replace(h, **{name: a})
    return dataclasses.replace(r, heads=tuple(heads))


def equal_tokens(value: float) -> Scenario:
    """The review's example: 8 identical tokens of size value, projections on."""
    return Scenario(
        tokens=tuple(f"t{i}" for i in range(8)),
        X=np.full((8, 4), value),
        W_Q=np.full((1, 4, 2), 0.5),
        W_K=np.full((1, 4, 2), 0.5),
        W_V=np.full((1, 4, 2), 0.5),
        W_O=np.full((2, 4), 0.5),
        settings=Settings(mask="none"),
    )


def torch_off_by(monkeypatch: pytest.MonkeyPatch, name: str, by: float):  # type: ignore[no-untyped-def]
    """The torch engine module, its compute_torch made to report head 1's name[1] off by by."""
    torch_engine = pytest.importorskip("attnviz.core.maths.torch_engine")
    honest = torch_engine.compute_torch
    monkeypatch.setattr(
        torch_engine,
        "compute_torch",
        lambda s, device="cpu", dtype="float64": shifted(honest(s, device, dtype), name, 0, 1, by),
    )
    return torch_engine


CHECKED = {
    "worked": worked_example(),
    "random": random_scenario(n=16, d_model=32, heads=4, d_k=8, seed=4),
    "equal 1e4": equal_tokens(1e4),
    "equal 1e6, no projections": scenario(np.full((8, 1), 1e6)),
}


def test_an_entropy_off_by_0_08_on_flat_rows_at_the_value_limit_is_reported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Scores near 5.7e12: rounding may move them by ~1e-2, but a flat row's entropy
    # only moves to second order, so 0.08 is still far past its tolerance.
    torch_engine = torch_off_by(monkeypatch, "entropy", 0.08)
    c = torch_engine.cross_check(equal_tokens(1e6), "cpu", "float64")
    assert c.culprit is not None and c.culprit.name == "entropy"


def random_wide(rng: np.random.Generator) -> Scenario:
    """A small scenario whose values span 1e-3 to the limit, some rows repeated or opposed."""
    n, d, h, d_k = (int(v) for v in rng.integers(1, [16, 24, 4, 8], endpoint=True))

    def mat(*shape: int) -> np.ndarray:
        a = rng.standard_normal(shape) * 10 ** rng.uniform(-3, 6, size=shape)
        return np.clip(a, -1e6, 1e6)

    X = mat(n, d)
    if n > 1 and rng.random() < 0.3:
        X[1] = -X[0] * (1 - 1e-12)  # near cancellation
    if rng.random() < 0.2:
        X[:] = X[0]  # flat rows
    st = Settings(
        projections=bool(rng.random() < 0.8),
        scale=bool(rng.random() < 0.7),
        mask=str(rng.choice(["none", "causal", "causal-zero", "drop-after-softmax"])),
        positional=str(rng.choice(["none", "sinusoidal"])),
        dropout=float(rng.choice([0.0, 0.0, 0.3])),
    )
    tokens = tuple(f"t{i}" for i in range(n))
    W = [mat(h, d, d_k) for _ in range(3)]
    return Scenario(tokens, X, *W, W_O=mat(h * d_k, d), settings=st)


def test_real_engines_agree_over_wide_random_scenarios() -> None:
    torch_engine = pytest.importorskip("attnviz.core.maths.torch_engine")
    rng = np.random.default_rng(11)
    for _ in range(150):
        s = random_wide(rng)
        c = torch_engine.cross_check(s, "cpu", "float64")
        assert c.ok, (s.settings, c.culprit)


@pytest.mark.parametrize("which", list(CHECKED))
def test_real_engines_agree(which: str) -> None:
    torch_engine = pytest.importorskip("attnviz.core.maths.torch_engine")
    c = torch_engine.cross_check(CHECKED[which], "cpu", "float64")
    assert c.ok, c.quantities
    assert {q.name for q in c.quantities} >= {"entropy", "leak", "row_sum", "weights", "final"}


@pytest.mark.parametrize("which", list(CHECKED))
@pytest.mark.parametrize("name", ["entropy", "leak", "row_sum", "weights"])
def test_a_disagreement_of_0_08_is_reported(
    monkeypatch: pytest.MonkeyPatch, which: str, name: str
) -> None:
    torch_engine = torch_off_by(monkeypatch, name, 0.08)
    c = torch_engine.cross_check(CHECKED[which], "cpu", "float64")
    assert not c.ok
    assert c.culprit is not None and c.culprit.name == name
    assert c.culprit.diff == pytest.approx(0.08, rel=1e-6)


def test_an_sdpa_disagreement_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    torch_engine = pytest.importorskip("attnviz.core.maths.torch_engine")
    honest = torch_engine.library_output

    def off(s, device="cpu", dtype="float64"):
        out, name = honest(s)
        return out + 1e-6, name

    monkeypatch.setattr(torch_engine, "library_output", off)
    c = torch_engine.cross_check(worked_example(), "cpu", "float64")
    assert not c.ok and c.culprit is not None and c.culprit.name == "SDPA output"


def test_a_different_mask_pattern_is_reported() -> None:
    torch_engine = pytest.importorskip("attnviz.core.maths.torch_engine")
    ref = compute(worked_example())
    masked = np.array(ref.masked)
    other = masked.copy()
    other[0, 0, 1] = 0.0  # a −∞ that became finite
    tol = torch_engine.tolerances(worked_example(), ref)["masked"]
    d = torch_engine.difference("masked", masked, other, tol)
    assert d.excess == math.inf
