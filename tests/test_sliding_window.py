"""The sliding-window mask: query i sees keys i − W < j ≤ i, −∞ elsewhere; in every
engine, the exports, the explanation, the generated scripts and the file format."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from attnviz.core.figures.figure import mask_marks, spec_for
from attnviz.core.io import files
from attnviz.core.io.codegen import to_script
from attnviz.core.maths.explain import explain
from attnviz.core.maths.forward import compute, one_head
from attnviz.core.maths.scenario import ScenarioError, Settings
from attnviz.core.maths.streaming import layer
from attnviz.core.presets import make_preset, random_scenario, worked_example
from tests.test_codegen import run_script

W = 3


def by_hand(X, W_Q, W_K, W_V, window, scale=True):
    """One head, written out: scores, −∞ outside the window, softmax, weights · V."""
    Q, K, V = X @ W_Q, X @ W_K, X @ W_V
    S = Q @ K.T / (math.sqrt(Q.shape[1]) if scale else 1.0)
    n = len(X)
    for i in range(n):
        for j in range(n):
            if not (i - window < j <= i):
                S[i, j] = -np.inf
    E = np.exp(S - S.max(axis=1, keepdims=True))
    P = E / E.sum(axis=1, keepdims=True)
    return S, P, P @ V


@pytest.fixture(scope="module")
def scenario():
    return make_preset("gpt2-small", 24, 5).with_settings(mask="sliding-window", window=W)


def test_every_head_matches_the_hand_computation(scenario):
    r = compute(scenario)
    s = scenario
    for h in (0, 5, 11):
        S, P, out = by_hand(s.X, s.W_Q[h], s.W_K[h], s.W_V[h], W)
        np.testing.assert_array_equal(np.isneginf(r.masked[h]), np.isneginf(S))
        np.testing.assert_allclose(r.weights[h], P, atol=1e-14)
        np.testing.assert_allclose(r.output[h], out, atol=1e-13)
    # Each row sums to 1 over at most W keys; no weight on a hidden key (no leak).
    assert ((r.weights[0] > 0).sum(axis=1) <= W).all()
    np.testing.assert_allclose(r.weights.sum(axis=-1), 1.0, atol=1e-14)
    np.testing.assert_array_equal(r.heads[0].leak, 0.0)


def test_one_head_and_the_layer_agree_with_the_full_compute(scenario):
    full = compute(scenario)
    np.testing.assert_array_equal(one_head(scenario, 4).one.weights, full.weights[4])
    for block in (256, 5):
        lean = layer(scenario, block)
        np.testing.assert_allclose(lean.final, full.final, rtol=0, atol=1e-12)


def test_a_window_as_long_as_the_sequence_is_the_causal_mask():
    s = worked_example()
    causal = compute(s)
    wide = compute(s.with_settings(mask="sliding-window", window=s.n))
    np.testing.assert_array_equal(wide.weights, causal.weights)


def test_the_torch_engine_and_sdpa_agree(scenario):
    torch_engine = pytest.importorskip("attnviz.core.maths.torch_engine")
    check = torch_engine.cross_check(scenario, "cpu", "float64")
    assert check.ok and check.sdpa_diff is not None and check.sdpa_diff < 1e-12


def test_hidden_cells_are_marked_in_the_figures(scenario):
    r = compute(scenario)
    spec = spec_for(r, "masked", 0)
    i, j = np.indices((24, 24))
    hidden = (j > i) | (j <= i - W)
    np.testing.assert_array_equal(spec.masked, hidden)
    weights = spec_for(r, "weights", 0)
    np.testing.assert_array_equal(weights.masked, hidden)
    assert weights.leaked is None  # −∞ leaves no weight on a hidden key
    # Given the hidden keys, the marks follow them; without, the future keys only.
    masked, _ = mask_marks("sliding-window", "masked", spec.values, hidden=r.future)
    np.testing.assert_array_equal(masked, hidden)


def test_the_explanation_says_why_an_old_key_is_hidden():
    s = worked_example().with_settings(mask="sliding-window", window=2)
    r = compute(s)
    e = explain(s, r, "masked", 0, 3, 0)  # "cat" against "she": three places back
    assert e.value == -math.inf and "outside the window" in e.note
    assert "more than 1 before" in e.note
    e = explain(s, r, "masked", 0, 3, 2)  # one place back: inside the window
    assert e.note == "not masked"


@pytest.mark.parametrize("flavor", ["numpy", "torch"])
def test_the_generated_script_reproduces_it(flavor, tmp_path):
    if flavor == "torch":
        pytest.importorskip("torch")
    s = random_scenario(n=9, d_model=8, heads=2, d_k=4, seed=2)  # small: a quick script
    s = s.with_settings(mask="sliding-window", window=W)
    printed = run_script(to_script(s, flavor), tmp_path)
    r = compute(s)
    np.testing.assert_allclose(printed["head 1 weights"], r.weights[0], atol=1e-12)
    np.testing.assert_allclose(printed["output"], r.final, atol=1e-12)


def test_files_keep_version_1_unless_the_window_is_used(tmp_path):
    plain, path = worked_example(), tmp_path / "s.attn.json"
    files.save_scenario(path, plain)
    doc = json.loads(path.read_text())
    assert doc["version"] == 1 and "window" not in doc["settings"]
    sliding = plain.with_settings(mask="sliding-window", window=2)
    files.save_scenario(path, sliding)
    doc = json.loads(path.read_text())
    assert doc["version"] == 2 and doc["settings"]["window"] == 2
    assert files.load_scenario(path).settings == sliding.settings
    doc["version"] = 1  # a version-1 file cannot hold a window
    with pytest.raises(files.FileFormatError, match=r"settings\.window: needs version 2"):
        files.scenario_from_json(json.dumps(doc))


@pytest.mark.parametrize("bad", [0, -1, 2049, 2.5, True, "3"])
def test_a_bad_window_is_refused(bad):
    with pytest.raises(ScenarioError, match=r"settings\.window"):
        Settings(window=bad)


def test_the_preset_and_the_kv_cache_it_keeps():
    from attnviz.core.maths.cost import Cost

    s = make_preset("sliding-window")
    assert (s.n, s.settings.mask, s.settings.window) == (16, "sliding-window", 4)
    r = compute(s)
    assert ((r.weights > 0).sum(axis=-1) == np.minimum(np.arange(16) + 1, 4)).all()
    # K and V of the last 4 tokens only: 2 · 4 · 12 · 64 numbers, however long n grows.
    assert Cost(16, 12, 64, window=4).kv_cache_numbers == 2 * 4 * 12 * 64
    assert Cost(131072, 12, 64, window=4).kv_cache_numbers == 2 * 4 * 12 * 64
    assert Cost(3, 12, 64, window=4).kv_cache_numbers == 2 * 3 * 12 * 64
