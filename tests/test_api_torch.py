"""The API's torch side: a captured nn.MultiheadAttention or transformers attention module,
and a layer of a loaded transformers model, each against the module's own numbers."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import attnviz
from attnviz.core.maths.scenario import ScenarioError
from tests.tiny_models import tiny, tiny_llama, word_tokenizer


def seeded_mha(batch_first: bool, **kwargs) -> torch.nn.MultiheadAttention:
    torch.manual_seed(3)
    mha = torch.nn.MultiheadAttention(8, 2, batch_first=batch_first, **kwargs).double().eval()
    with torch.no_grad():  # biases are zero at first: make them count
        mha.in_proj_bias.normal_()
        mha.out_proj.bias.normal_()
    return mha


def own(mha, x, kv=None, **kwargs):
    kv = x if kv is None else kv
    with torch.no_grad():
        return mha(x, kv, kv, need_weights=True, average_attn_weights=False, **kwargs)


@pytest.mark.parametrize("batch_first", [True, False])
def test_capture_multihead_attention_gives_its_own_weights(batch_first):
    mha = seeded_mha(batch_first)
    torch.manual_seed(4)
    x = torch.randn(3, 5, 8, dtype=torch.float64)  # batch 3, 5 tokens
    x = x if batch_first else x.transpose(0, 1)
    causal = torch.triu(torch.ones(5, 5, dtype=torch.bool), diagonal=1)
    with attnviz.capture(mha, batch=1, tokens=["a", "b", "c", "d", "e"]) as captured:
        out, weights = own(mha, x, attn_mask=causal)
    c = captured.computation
    assert captured.scenario.settings.mask == "causal" and captured.scenario.tokens[0] == "a"
    np.testing.assert_allclose(c.weights, weights[1].numpy(), rtol=0, atol=1e-12)
    row = out[1] if batch_first else out[:, 1]
    np.testing.assert_allclose(c.output, row.numpy(), rtol=0, atol=1e-12)
    assert captured.agreement() <= 1e-12


def test_capture_float_masks_padding_and_cross_attention():
    mha = seeded_mha(True)
    torch.manual_seed(5)
    x, memory = torch.randn(2, 4, 8, dtype=torch.float64), torch.randn(2, 6, 8, dtype=torch.float64)
    additive = torch.zeros(4, 6, dtype=torch.float64)
    additive[0, 3:] = -torch.inf
    padding = torch.zeros(2, 6, dtype=torch.float64)
    padding[1, 5] = -torch.inf
    with attnviz.capture(mha, batch=1) as captured:
        out, weights = own(mha, x, memory, attn_mask=additive, key_padding_mask=padding)
    s = captured.scenario
    assert s.m == 6 and s.settings.mask == "custom"
    assert s.mask_matrix[0].tolist() == [1, 1, 1, 0, 0, 0] and s.mask_matrix[1, 5] == 0
    np.testing.assert_allclose(captured.computation.weights, weights[1].numpy(), atol=1e-12)
    np.testing.assert_allclose(captured.computation.output, out[1].numpy(), atol=1e-12)


def test_capture_refuses_what_it_cannot_represent_when_asked():
    mha = seeded_mha(True)
    x = torch.randn(1, 3, 8, dtype=torch.float64)
    bias = torch.full((3, 3), 0.5, dtype=torch.float64)
    with attnviz.capture(mha) as captured, torch.no_grad():
        mha(x, x, x, attn_mask=bias)  # the forward pass itself goes on
    with pytest.raises(ScenarioError, match="attn_mask adds values other than 0"):
        _ = captured.scenario
    with attnviz.capture(mha) as idle:
        pass
    with pytest.raises(ScenarioError, match="did not run"):
        _ = idle.scenario


@pytest.mark.parametrize("kind", ["gpt2", "bert", "llama", "mistral"])
def test_capture_a_transformers_attention_module(kind):
    model = tiny_llama(kind) if kind in ("llama", "mistral") else tiny(kind)
    modules = {
        "gpt2": lambda: model.h[1].attn,
        "bert": lambda: model.encoder.layer[1].attention,  # with its output projection
        "llama": lambda: model.layers[1].self_attn,
        "mistral": lambda: model.layers[1].self_attn,  # a sliding window of 3
    }
    ids = torch.tensor([[3, 4, 5, 6, 7, 8]] * 2)
    padded = torch.tensor([[1] * 6, [1] * 5 + [0]])  # the second text's last key is padding
    with attnviz.capture(modules[kind](), batch=1) as captured, torch.no_grad():
        out = model(input_ids=ids, attention_mask=padded, output_attentions=True)
    weights = out.attentions[1][1].numpy()
    # RoPE: transformers keeps its rotary angles in float32 (from_transformers lifts them)
    tolerance = 1e-6 if kind in ("llama", "mistral") else 1e-12
    np.testing.assert_allclose(captured.computation.weights, weights, rtol=0, atol=tolerance)
    assert captured.agreement() <= tolerance
    allowed = np.asarray(captured.scenario.mask_matrix)
    assert not allowed[:, 5].any()  # no query sees the padding
    if kind in ("gpt2", "llama"):
        np.testing.assert_array_equal(allowed[:, :5], np.tril(np.ones((6, 5))))


def test_from_transformers_on_a_loaded_model_and_tokenizer():
    model = tiny("bert")  # in memory only: there is no folder to load it again from
    tokenizer = word_tokenizer(bert_style=True)
    layer = attnviz.from_transformers(model, tokenizer, "the cat sat on the mat", layer=2)
    assert layer.tokens.labels == ("[CLS]", "the", "cat", "sat", "on", "the", "mat", "[SEP]")
    with torch.no_grad():
        out = model(input_ids=torch.tensor([list(layer.tokens.ids)]), output_attentions=True)
    np.testing.assert_allclose(
        layer.computation.weights, out.attentions[2][0].numpy(), rtol=0, atol=1e-12
    )
    assert layer.agreement_weights <= 1e-12 and layer.dtype == "float64"
    p = layer.scenario.provenance
    assert (p.model_type, p.layer, p.layers) == ("bert", 2, 3)
    assert "bert layer 2 of 3" in layer._repr_html_()


def test_from_transformers_with_token_ids_in_float32():
    model = tiny("gpt2", torch.float32)
    ids = torch.tensor([[3, 9, 4, 10]])
    layer = attnviz.from_transformers(model, ids, layer=0, labels=["the", "red", "cat", "big"])
    with torch.no_grad():
        out = model(input_ids=ids, output_attentions=True)
    np.testing.assert_allclose(
        layer.computation.weights, out.attentions[0][0].double().numpy(), rtol=0, atol=1e-5
    )
    assert layer.scenario.tokens == ("the", "red", "cat", "big") and layer.dtype == "float32"
    assert model.config._attn_implementation == "eager"  # the model is left as it was


def test_from_transformers_refuses_half_precision_and_bad_layers():
    with pytest.raises(ScenarioError, match="the model is in bfloat16"):
        attnviz.from_transformers(tiny("gpt2", torch.bfloat16), [3, 4], layer=0)
    with pytest.raises(ScenarioError, match="layer 7: the model has layers 0 to 2"):
        attnviz.from_transformers(tiny("gpt2"), [3, 4], layer=7)


def test_from_transformers_with_sdpa_and_a_transformers_tokenizer():
    import transformers

    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=50, n_positions=32, n_embd=16, n_layer=2, n_head=4)
    model = transformers.GPT2Model(config).double().eval()  # sdpa, as from_pretrained gives
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=word_tokenizer(False))
    layer = attnviz.from_transformers(model, tokenizer, "the cat sat on the mat", layer=1)
    assert model.config._attn_implementation == "sdpa"  # left as it was
    with torch.no_grad():
        ids = torch.tensor([list(layer.tokens.ids)])
        hidden = model(input_ids=ids, output_hidden_states=True).hidden_states[1]
        block = model.h[1]
        x = block.ln_1(hidden)[0]
        # the layer's own attention, written out from its weights in float64
        q, k, _ = (x @ block.attn.c_attn.weight + block.attn.c_attn.bias).split(16, dim=-1)
    heads = lambda t: t.reshape(6, 4, 4).transpose(0, 1)  # noqa: E731
    scores = heads(q) @ heads(k).transpose(1, 2) / 2 + torch.triu(
        torch.full((6, 6), -torch.inf, dtype=torch.float64), 1
    )
    np.testing.assert_allclose(
        layer.computation.weights, torch.softmax(scores, -1).numpy(), rtol=0, atol=1e-12
    )
    assert layer.scenario.tokens == ("the", "cat", "sat", "on", "the", "mat")


def test_from_transformers_refuses_a_model_whose_own_attention_differs(monkeypatch):
    """The model's own eager attention (the code transformers runs unchanged) computing
    something else than the import's run is refused, as `attnviz import` refuses it: here
    its scores are doubled, a change the import's run never sees."""
    from transformers.models.llama import modeling_llama

    model = tiny_llama("llama")
    ids = [3, 17, 5, 42, 8]
    assert attnviz.from_transformers(model, ids).agreement_weights <= 1e-12
    original = modeling_llama.eager_attention_forward

    def doubled(module, query, key, value, attention_mask, scaling, **kwargs):
        return original(module, query, key, value, attention_mask, 2 * scaling, **kwargs)

    monkeypatch.setattr(modeling_llama, "eager_attention_forward", doubled)
    with pytest.raises(ScenarioError, match="transformers' own attention differs"):
        attnviz.from_transformers(model, ids)
