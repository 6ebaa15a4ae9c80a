"""Layers of tiny seeded transformers models against the models' own eager attention."""

from __future__ import annotations

import numpy as np
import pytest

from attnviz.core.maths.forward import compute
from attnviz.core.maths.scenario import ScenarioError

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from tiny_models import tiny, tiny_llama  # noqa: E402

from attnviz.core.models.hf_layer import import_layer  # noqa: E402

EXACT = 1e-12


@pytest.mark.parametrize("kind", ["gpt2", "bert", "roberta", "distilbert"])
@pytest.mark.parametrize("layer", [0, 1, 2])
def test_every_layer_matches_the_models_own_attention(kind, layer):
    model = tiny(kind)
    ids = torch.tensor([[3, 17, 5, 42, 8, 11]])
    got = import_layer(model, ids, layer, tuple(f"t{i}" for i in range(6)))
    s = got.scenario
    assert (s.n, s.d_model, s.n_heads, s.d_k) == (6, 16, 4, 4)
    assert s.settings.mask == ("causal" if kind == "gpt2" else "none")
    r = compute(s)
    np.testing.assert_allclose(r.weights, got.model_weights, rtol=0, atol=EXACT)
    np.testing.assert_allclose(r.final, got.model_output, rtol=0, atol=EXACT)
    # Independently: the first head's weights from X and the weights, in a few lines.
    Q = s.X @ s.W_Q[0] + s.b_Q[0]
    K = s.X @ s.W_K[0] + s.b_K[0]
    S = Q @ K.T / np.sqrt(s.d_k)
    if kind == "gpt2":
        S[np.triu_indices(6, 1)] = -np.inf
    w = np.exp(S - S.max(axis=1, keepdims=True))
    np.testing.assert_allclose(w / w.sum(axis=1, keepdims=True), got.model_weights[0], atol=EXACT)
    assert got.layers == 3 and got.every_layer[layer] is got.model_weights


@pytest.mark.parametrize("kind", ["gpt2", "bert", "distilbert", "llama", "qwen3", "mistral"])
def test_a_float32_model_matches_to_float32_rounding(kind):
    dtype = torch.float32
    model = tiny_llama(kind, dtype) if kind in ("llama", "qwen3", "mistral") else tiny(kind, dtype)
    ids = torch.tensor([[3, 17, 5, 42, 8, 11, 2]])
    last = model.config.num_hidden_layers - 1
    got = import_layer(model, ids, last, tuple(f"t{i}" for i in range(7)))
    assert got.scenario.X.dtype == np.float64
    r = compute(got.scenario)
    np.testing.assert_allclose(r.weights, got.model_weights, rtol=0, atol=1e-5)
    np.testing.assert_allclose(r.final, got.model_output, rtol=0, atol=1e-5)
    assert np.abs(r.weights - got.model_weights).max() > 0  # float32 is not float64


def test_a_layer_out_of_range_and_an_unsupported_model_are_refused():
    model = tiny("gpt2")
    ids = torch.tensor([[1, 2, 3]])
    with pytest.raises(ScenarioError, match="layers 0 to 2"):
        import_layer(model, ids, 3, ("a", "b", "c"))
    model.config.model_type = "mamba"
    with pytest.raises(ScenarioError, match="'mamba': not supported"):
        import_layer(model, ids, 0, ("a", "b", "c"))


@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3", "mistral"])
@pytest.mark.parametrize("layer", [0, 1])
def test_llama_family_layers_match_the_model_in_float64(kind, layer):
    model = tiny_llama(kind)
    ids = torch.tensor([[3, 17, 5, 42, 8, 11, 2]])
    got = import_layer(model, ids, layer, tuple(f"t{i}" for i in range(7)))
    s = got.scenario
    assert (s.n_heads, s.kv_heads, s.d_k, s.settings.positional) == (4, 2, 4, "rope")
    assert s.settings.mask == ("sliding-window" if kind == "mistral" else "causal")
    assert (kind == "qwen2") == bool(s.b_Q.any())  # Qwen2 has Q, K, V biases
    assert s.settings.qk_norm == ("rms" if kind == "qwen3" else "none")
    r = compute(s)
    np.testing.assert_allclose(r.weights, got.model_weights, rtol=0, atol=EXACT)
    np.testing.assert_allclose(r.final, got.model_output, rtol=0, atol=EXACT)
