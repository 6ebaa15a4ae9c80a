"""A model's own RoPE frequencies and attention factor (scaled RoPE: Llama 3, YaRN, …):
what the engine computes against RoPE written out here, what a file holds, and what a
wrong setting is told."""

from __future__ import annotations

import json

import numpy as np
import pytest

from attnviz.core.io.files import FileFormatError, load_scenario, save_scenario
from attnviz.core.maths.forward import compute
from attnviz.core.maths.scenario import ScenarioError
from attnviz.core.presets import worked_example

FREQS, FACTOR = (0.7, 0.02), 1.3  # d_k 2 of the worked example's heads is one pair: use d_k 4


def scaled():
    from attnviz.core.presets import small_model

    s = small_model(("a", "b", "c", "d", "e"), 8, 2, 4, seed=3)
    return s.with_settings(positional="rope", rope_frequencies=FREQS, rope_factor=FACTOR)


def by_hand(s, h: int) -> np.ndarray:
    """Head h's weights with each pair (i, i + 2) turned by p · FREQS[i], times FACTOR."""
    Q, K = s.X @ s.W_Q[h], s.X @ s.W_K[h // (s.n_heads // s.kv_heads)]

    def turn(A):
        out = A.copy()
        for p in range(len(A)):
            for i, f in enumerate(FREQS):
                a, b, t = A[p, i], A[p, i + 2], p * f
                out[p, i] = FACTOR * (a * np.cos(t) - b * np.sin(t))
                out[p, i + 2] = FACTOR * (a * np.sin(t) + b * np.cos(t))
        return out

    S = turn(Q) @ turn(K).T / 2.0  # √d_k = 2
    S[np.triu_indices(len(S), 1)] = -np.inf
    w = np.exp(S - S.max(axis=1, keepdims=True))
    return w / w.sum(axis=1, keepdims=True)


def test_the_weights_turn_by_the_models_frequencies_times_the_factor():
    s = scaled()
    r = compute(s)
    for h in range(s.n_heads):
        np.testing.assert_allclose(r.heads[h].weights, by_hand(s, h), rtol=0, atol=1e-12)
    plain = compute(s.with_settings(rope_frequencies=None, rope_factor=1.0))
    assert np.abs(plain.heads[0].weights - r.heads[0].weights).max() > 1e-3


def test_a_file_holds_them_exactly_as_version_5(tmp_path):
    s = scaled()
    for name in ("s.attn.json", "s.attn.npz"):
        path = tmp_path / name
        save_scenario(path, s)
        back = load_scenario(path)
        assert back.settings.rope_frequencies == FREQS and back.settings.rope_factor == FACTOR
        np.testing.assert_array_equal(compute(back).final, compute(s).final)
    doc = json.loads((tmp_path / "s.attn.json").read_text("utf-8"))
    assert doc["version"] == 5 and doc["settings"]["rope_frequencies"] == list(FREQS)
    doc["version"] = 4
    (tmp_path / "old.attn.json").write_text(json.dumps(doc), "utf-8")
    with pytest.raises(
        FileFormatError, match=r"settings.rope_\w+: needs version 5 \(the file says 4\)"
    ):
        load_scenario(tmp_path / "old.attn.json")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"rope_frequencies": (0.5,)}, "1 numbers for the 2 pairs RoPE turns"),
        ({"rope_frequencies": (0.5, -1.0)}, r"rope_frequencies\[2\]: expected a number greater"),
        ({"rope_factor": 0.0}, "rope_factor: expected a number greater than 0"),
    ],
)
def test_a_wrong_setting_is_named(change, message):
    with pytest.raises(ScenarioError, match=message):
        scaled().with_settings(**change)


def test_a_new_width_goes_back_to_the_bases_frequencies():
    from attnviz.core.maths.scenario import resized

    s = resized(scaled(), d_k=6)
    assert s.settings.rope_frequencies is None
    assert worked_example().settings.rope_frequencies is None
