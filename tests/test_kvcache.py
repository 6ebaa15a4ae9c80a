"""The KV-cache stepper against full causal attention written out here from the brief."""

import dataclasses
import math

import numpy as np
import pytest
import reference as ref

from attnviz.core.maths.kvcache import EndOfSequence, KVCache
from attnviz.core.maths.scenario import Scenario, ScenarioError
from attnviz.core.presets import make_preset, random_scenario, worked_example

TOL = 1e-12


def full_causal(s: Scenario) -> dict[str, np.ndarray]:
    """Every head's Q, K, V, weights and output (head on axis 0), and final, causal mask."""
    X = np.array(s.X)
    if s.settings.positional == "sinusoidal":
        X = X + ref.sinusoidal(s.n, s.d_model)
    heads = range(s.n_heads) if s.settings.projections else [None]
    parts: dict[str, list[np.ndarray]] = {name: [] for name in ("Q", "K", "V", "weights", "output")}
    for h in heads:
        Q, K, V = (X, X, X) if h is None else (X @ s.W_Q[h], X @ s.W_K[h], X @ s.W_V[h])
        S = Q @ K.T
        if s.settings.scale:
            S = S / math.sqrt(Q.shape[1])
        S[np.triu_indices(s.n, k=1)] = -np.inf
        E = np.exp(S - S.max(axis=1, keepdims=True))
        W = E / E.sum(axis=1, keepdims=True)
        for name, value in zip(parts, (Q, K, V, W, W @ V), strict=True):
            parts[name].append(value)
    full = {name: np.stack(values) for name, values in parts.items()}
    concat = np.concatenate(list(full["output"]), axis=1)
    if s.settings.projections:
        # Ablated heads stay out of the mix: their block of concat meets zero rows of W_O.
        W_O = np.array(s.W_O)
        for h in s.settings.ablated:
            W_O[h * s.d_k : (h + 1) * s.d_k] = 0.0
        full["final"] = concat @ W_O
    else:
        full["final"] = concat
    return full


def small_random(**settings: object) -> Scenario:
    s = random_scenario(n=16, d_model=32, heads=4, d_k=8, seed=2)
    return s.with_settings(**settings) if settings else s


SCENARIOS = {
    "worked": lambda: worked_example(),
    "worked-positional": lambda: worked_example().with_settings(positional="sinusoidal"),
    "worked-unscaled": lambda: worked_example().with_settings(scale=False),
    "random": lambda: small_random(),
    "random-positional": lambda: small_random(positional="sinusoidal"),
    "random-unscaled": lambda: small_random(scale=False),
    "random-positional-unscaled": lambda: small_random(positional="sinusoidal", scale=False),
    "random-no-projections": lambda: small_random(projections=False, positional="sinusoidal"),
    "random-ablated": lambda: small_random(ablated=(0, 2)),
    "worked-ablated": lambda: worked_example().with_settings(ablated=(1,)),
}


@pytest.mark.parametrize("name", SCENARIOS)
def test_every_step_matches_full_causal_attention(name):
    s = SCENARIOS[name]()
    full = full_causal(s)
    cache = KVCache.start(s)
    for t in range(s.n):
        step = cache.step()
        assert step.t == t and step.token == s.tokens[t]
        for field in ("q", "k", "v"):
            np.testing.assert_allclose(getattr(step, field), full[field.upper()][:, t], atol=TOL)
        assert step.weights.shape == (full["Q"].shape[0], t + 1)
        np.testing.assert_allclose(step.weights, full["weights"][:, t, : t + 1], atol=TOL)
        np.testing.assert_allclose(step.weights.sum(axis=1), 1.0, atol=TOL)
        np.testing.assert_allclose(step.output, full["output"][:, t], atol=TOL)
        np.testing.assert_allclose(step.final, full["final"][t], atol=TOL)
        # The stepper's own check against engine.compute: agreement to rounding.
        assert 0.0 <= step.max_diff < TOL
    assert cache.done


def test_worked_example_by_hand():
    steps = list(KVCache.start(worked_example()))
    she, saw = steps[0], steps[1]
    # Head 1, "she": q = [-0.11, 0.53], k = [1.18, -1.13], v = [0.69, -0.22]; it sees
    # only itself, so its weight is 1 and its output is its value row.
    assert she.q[0] == pytest.approx([-0.11, 0.53])
    assert she.k[0] == pytest.approx([1.18, -1.13])
    assert she.weights.tolist() == [[1.0], [1.0]]
    assert she.output[0] == pytest.approx([0.69, -0.22])
    # Head 1, "saw": q = [0.02+0.56+0.12+0.45, 0.06-0.72-0.28-0.35] = [1.15, -1.29],
    # k = [0.18+0.48-0.36-0.10, -0.18-0.24+0.28+0.20] = [0.20, 0.06].
    # Scores: 1.15·1.18 + 1.29·1.13 = 2.8147; 1.15·0.20 - 1.29·0.06 = 0.1526.
    assert saw.scores[0] == pytest.approx([2.8147, 0.1526], rel=1e-12)
    assert saw.scaled[0] == pytest.approx([2.8147 / math.sqrt(2), 0.1526 / math.sqrt(2)])
    w_she = 1 / (1 + math.exp(-(2.8147 - 0.1526) / math.sqrt(2)))  # about 0.868
    assert saw.weights[0] == pytest.approx([w_she, 1 - w_she], rel=1e-12)


@pytest.mark.parametrize("name", ["worked", "random"])
def test_cache_grows_one_row_per_head_per_step(name):
    s = SCENARIOS[name]()
    full = full_causal(s)
    cache = KVCache.start(s)
    h, d_k = s.n_heads, s.d_k
    assert cache.keys.shape == (h, 0, d_k) and cache.t == 0
    for t in range(s.n):
        step = cache.step()
        assert cache.t == t + 1
        assert cache.keys.shape == cache.values.shape == (h, t + 1, d_k)
        np.testing.assert_allclose(cache.keys, full["K"][:, : t + 1], atol=TOL)
        np.testing.assert_allclose(cache.values, full["V"][:, : t + 1], atol=TOL)
        numbers = 2 * (t + 1) * h * d_k
        assert step.cache_numbers == numbers
        assert dict(step.cache_bytes) == {
            "float64": 8 * numbers,
            "float32": 4 * numbers,
            "float16": 2 * numbers,
        }
    # Four tokens, two heads of d_k 2: 2·4·2·2 = 32 numbers, 256 bytes in float64.
    if name == "worked":
        assert step.cache_numbers == 32 and step.cache_bytes["float64"] == 256


@pytest.mark.parametrize("mask", ["none", "causal-zero", "drop-after-softmax"])
def test_mask_setting_and_dropout_are_ignored(mask):
    s = small_random(mask=mask, dropout=0.5, dropout_seed=3)
    full = full_causal(s)  # always causal, no dropout
    for step in KVCache.start(s):
        np.testing.assert_allclose(step.weights, full["weights"][:, step.t, : step.t + 1], atol=TOL)
        np.testing.assert_allclose(step.final, full["final"][step.t], atol=TOL)
        assert step.max_diff < TOL


def test_error_past_the_end():
    cache = KVCache.start(worked_example())
    assert len(list(cache)) == 4
    assert cache.done and cache.t == 4
    with pytest.raises(EndOfSequence, match="all 4 tokens are already cached"):
        cache.step()
    with pytest.raises(IndexError):  # EndOfSequence is an IndexError
        cache.step()
    assert list(cache) == []


def test_single_token():
    s = random_scenario(n=1, d_model=8, heads=2, d_k=4, seed=1)
    (step,) = list(KVCache.start(s))
    assert step.weights.tolist() == [[1.0], [1.0]]
    np.testing.assert_allclose(step.output, step.v, atol=0)


def test_records_and_cache_are_read_only():
    cache = KVCache.start(worked_example())
    step = cache.step()
    with pytest.raises(dataclasses.FrozenInstanceError):
        step.t = 3  # type: ignore[misc]
    for name in ("q", "k", "v", "scores", "scaled", "weights", "output", "final"):
        array = getattr(step, name)
        assert array.dtype == np.float64 and not array.flags.writeable, name
    with pytest.raises(TypeError):
        step.cache_bytes["float64"] = 0  # type: ignore[index]
    with pytest.raises(ValueError):
        cache.keys[0, 0, 0] = 1.0
    # Later steps do not disturb what an earlier step returned.
    q0 = step.q.copy()
    cache.step()
    np.testing.assert_array_equal(step.q, q0)


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"qk_norm": "rms", "softcap": 1.5},
        {"positional": "rope", "rope_style": "interleaved", "scale_value": 0.2},
        {"positional": "alibi", "sinks": (0.5, -1.0, 2.0, 0.0)},
    ],
    ids=["rope-gqa", "qk-norm-softcap", "interleaved-scale", "alibi-sinks"],
)
def test_a_cache_of_shared_kv_heads_with_biases_matches_full_attention(changes):
    s = make_preset("llama-style").with_settings(**changes)  # 4 query heads over 2 KV heads
    rng = np.random.default_rng(5)
    s = dataclasses.replace(
        s,
        b_Q=rng.normal(size=s.b_Q.shape),
        b_V=rng.normal(size=s.b_V.shape),
        b_O=rng.normal(size=s.b_O.shape),
    )
    steps = list(KVCache.start(s))
    assert max(step.max_diff for step in steps) < 1e-12
    # Only the 2 key/value heads are cached: half of what 4 heads would keep.
    assert [step.cache_numbers for step in steps] == [2 * (t + 1) * 2 * s.d_k for t in range(s.n)]
    assert steps[-1].k.shape == (2, s.d_k) and steps[-1].q.shape == (4, s.d_k)


def test_cross_attention_has_no_cache_to_step():
    with pytest.raises(ScenarioError, match="cross-attention"):
        KVCache.start(make_preset("cross-attention"))
