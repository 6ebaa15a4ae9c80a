"""Layers of tiny seeded transformers models against the models' own eager attention."""

from __future__ import annotations

import numpy as np
import pytest

from attnviz.core.maths.engine import compute
from attnviz.core.maths.scenario import ScenarioError

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from attnviz.core.models.hf_layer import import_layer  # noqa: E402

EXACT = 1e-12


def tiny(kind: str):
    torch.manual_seed(0)
    if kind == "gpt2":
        config = transformers.GPT2Config(
            vocab_size=50,
            n_positions=32,
            n_embd=16,
            n_layer=3,
            n_head=4,
            attn_implementation="eager",
        )
        model = transformers.GPT2Model(config)
    else:
        config = transformers.BertConfig(
            vocab_size=50,
            hidden_size=16,
            num_hidden_layers=3,
            num_attention_heads=4,
            intermediate_size=32,
            max_position_embeddings=32,
            attn_implementation="eager",
        )
        model = transformers.BertModel(config, add_pooling_layer=False)
    return model.double().eval()


@pytest.mark.parametrize("kind", ["gpt2", "bert"])
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


def test_a_layer_out_of_range_and_an_unsupported_model_are_refused():
    model = tiny("gpt2")
    ids = torch.tensor([[1, 2, 3]])
    with pytest.raises(ScenarioError, match="layers 0 to 2"):
        import_layer(model, ids, 3, ("a", "b", "c"))
    model.config.model_type = "mamba"
    with pytest.raises(ScenarioError, match="'mamba': not supported"):
        import_layer(model, ids, 0, ("a", "b", "c"))
