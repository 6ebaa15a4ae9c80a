"""Each family's config options: modelled exactly, or refused by name before any weight
is read; weights inside the layers that the model has no place for refuse the import;
every float32 step transformers keeps in a float64 model is lifted in every layer."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from attnviz.core.maths.forward import compute
from attnviz.core.maths.scenario import ScenarioError

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from offline_hub import offline  # noqa: E402, F401  (autouse)
from safetensors.torch import load_file, save_file  # noqa: E402
from tiny_models import (  # noqa: E402
    WORDS,
    edited,
    save_tiny,
    tiny,
    tiny_llama,
    tiny_model,
    unreadable_weights,
)
from variant_reference import llama3_frequencies  # noqa: E402

from attnviz.core.models.hf_layer import import_layer  # noqa: E402
from attnviz.core.models.importer import Request, import_model_layer, peek  # noqa: E402

EXACT = 1e-12
TEXT = "the cat sat on the mat"
IDS = torch.tensor([[3, 17, 5, 42, 8, 11, 2]])
LABELS = tuple(f"t{i}" for i in range(7))


def own_eager(model, ids=IDS):
    """transformers' own eager attention weights, every layer (float64: exact for the
    GPT-2 and BERT families, whose softmax stays in the model's dtype)."""
    with torch.no_grad():
        return [a[0].numpy() for a in model(input_ids=ids, output_attentions=True).attentions]


def imports_exactly(model, layer, reference=None):
    got = import_layer(model, IDS, layer, LABELS)
    r = compute(got.scenario)
    np.testing.assert_allclose(r.weights, got.model_weights, rtol=0, atol=EXACT)
    np.testing.assert_allclose(r.final, got.model_output, rtol=0, atol=EXACT)
    if reference is not None:
        np.testing.assert_allclose(r.weights, reference[layer], rtol=0, atol=EXACT)
    return got


def add_weights(folder, extra: dict) -> None:
    weights = load_file(folder / "model.safetensors")
    save_file({**weights, **extra}, folder / "model.safetensors", metadata={"format": "pt"})


# GPT-2


@pytest.mark.parametrize(
    ("options", "scale"),
    [
        ({"scale_attn_by_inverse_layer_idx": True}, lambda layer: 1 / (2 * (layer + 1))),
        ({"scale_attn_weights": False}, lambda layer: 1.0),
        (
            {"scale_attn_weights": False, "scale_attn_by_inverse_layer_idx": True},
            lambda layer: 1 / (layer + 1),
        ),
    ],
)
def test_gpt2_score_scales_import_exactly(options, scale):
    config = tiny("gpt2").config
    for key, value in options.items():
        setattr(config, key, value)
    torch.manual_seed(0)
    model = transformers.GPT2Model(config).double().eval()
    reference = own_eager(model)
    for layer in range(3):
        got = imports_exactly(model, layer, reference)
        # independently: head 0's weights with that scale, in a few lines
        s = got.scenario
        S = (s.X @ s.W_Q[0] + s.b_Q[0]) @ (s.X @ s.W_K[0] + s.b_K[0]).T * scale(layer)
        S[np.triu_indices(7, 1)] = -np.inf
        w = np.exp(S - S.max(axis=1, keepdims=True))
        np.testing.assert_allclose(w / w.sum(1, keepdims=True), got.model_weights[0], atol=EXACT)


def test_gpt2_reorder_and_upcast_imports_in_float64_and_float32(tmp_path):
    folder = edited(save_tiny("gpt2", tmp_path / "gpt2"), reorder_and_upcast_attn=True)
    plain = transformers.AutoModel.from_pretrained(
        tmp_path / "gpt2", dtype=torch.float64, attn_implementation="eager"
    )
    plain.config.reorder_and_upcast_attn = False
    for block in plain.h:
        block.attn.reorder_and_upcast_attn = False  # the same maths, without the float32 steps
    ids = [WORDS.index(w) + 3 for w in TEXT.split()]
    reference = own_eager(plain.eval(), torch.tensor([ids]))
    for layer in range(3):
        got = import_model_layer(Request(str(folder), TEXT, layer))
        assert got.agreement_weights <= EXACT and got.agreement_output <= EXACT
        np.testing.assert_allclose(got.provenance.model_weights, reference[layer], atol=EXACT)
    got = import_model_layer(Request(str(folder), TEXT, 2, dtype="float32"))
    assert got.agreement_weights <= 1e-5


def test_gpt2_buffers_older_checkpoints_saved_are_not_refused(tmp_path):
    folder = save_tiny("gpt2", tmp_path / "gpt2")
    add_weights(
        folder,
        {
            **{f"h.{i}.attn.bias": torch.ones(1, 1, 32, 32).tril() for i in range(3)},
            **{f"h.{i}.attn.masked_bias": torch.tensor(-1e4) for i in range(3)},
        },
    )
    assert import_model_layer(Request(str(folder), TEXT, 1)).agreement_weights <= EXACT


def test_gpt2_cross_attention_is_refused_by_name(tmp_path):
    folder = edited(save_tiny("gpt2", tmp_path / "gpt2"), add_cross_attention=True)
    assert "GPT-2 add_cross_attention" in peek(str(folder), "the cat").problem
    unreadable_weights(folder)
    with pytest.raises(ScenarioError, match=r"GPT-2 add_cross_attention .* not supported"):
        import_model_layer(Request(str(folder), TEXT, 0))


# The BERT family


def test_a_bert_decoder_is_causal_and_exact():
    config = tiny("bert").config
    config.is_decoder = True
    torch.manual_seed(0)
    model = transformers.BertModel(config, add_pooling_layer=False).double().eval()
    reference = own_eager(model)
    for layer in range(3):
        got = imports_exactly(model, layer, reference)
        assert got.scenario.settings.mask == "causal"
        assert np.all(np.triu(got.model_weights[0], 1) == 0)


def relative_bert(folder, positions: str | None):
    """A tiny BERT checkpoint trained with relative positions: each layer carries its
    distance_embedding, which transformers 5 drops as unexpected."""
    save_tiny("bert", folder)
    config = json.loads((folder / "config.json").read_text())
    torch.manual_seed(5)
    size = 2 * config["max_position_embeddings"] - 1
    add_weights(
        folder,
        {
            f"encoder.layer.{i}.attention.self.distance_embedding.weight": torch.randn(size, 4)
            for i in range(3)
        },
    )
    if positions is not None:
        edited(folder, position_embedding_type=positions)
    return folder


@pytest.mark.parametrize("positions", ["relative_key_query", "relative_key"])
def test_bert_relative_positions_are_refused_by_name_before_loading(tmp_path, positions):
    folder = relative_bert(tmp_path / "bert", positions)
    message = f"BERT {positions} position embeddings are not supported"
    assert message in peek(str(folder), "the cat").problem
    unreadable_weights(folder)
    with pytest.raises(ScenarioError, match=message):
        import_model_layer(Request(str(folder), TEXT, 0))


def test_relative_position_weights_without_the_option_are_refused_as_unexpected(tmp_path):
    folder = relative_bert(tmp_path / "bert", None)
    with pytest.raises(
        ScenarioError,
        match=r"layers hold weights the model has no place for \(encoder\.layer\.0\.attention"
        r"\.self\.distance_embedding\.weight, encoder\.layer\.1\.",
    ):
        import_model_layer(Request(str(folder), TEXT, 2))


def test_extra_weights_in_a_layer_refuse_and_task_heads_do_not(tmp_path):
    folder = save_tiny("bert", tmp_path / "bert")
    torch.manual_seed(6)
    add_weights(folder, {"cls.predictions.bias": torch.randn(50)})  # a task head: fine
    got = import_model_layer(Request(str(folder), TEXT, 1))
    assert got.agreement_weights <= EXACT
    add_weights(folder, {"encoder.layer.1.attention.self.gate.weight": torch.randn(16, 16)})
    with pytest.raises(ScenarioError, match=r"no place for \(encoder\.layer\.1\.attention\.self"):
        import_model_layer(Request(str(folder), TEXT, 0))


@pytest.mark.parametrize("kind", ["bert", "roberta"])
def test_cross_attention_in_the_bert_family_is_refused_by_name(tmp_path, kind):
    folder = edited(save_tiny(kind, tmp_path / kind), is_decoder=True, add_cross_attention=True)
    name = {"bert": "BERT", "roberta": "RoBERTa"}[kind]
    assert f"{name} add_cross_attention" in peek(str(folder), "the cat").problem


# The Llama family


def test_a_stray_sliding_window_in_a_llama_config_changes_nothing(tmp_path):
    folder = edited(save_tiny("llama", tmp_path / "llama"), sliding_window=2)
    for layer in range(2):
        got = import_model_layer(Request(str(folder), TEXT, layer))
        assert got.scenario.settings.mask == "causal"
        assert got.agreement_weights <= EXACT and got.agreement_output <= EXACT


@pytest.mark.parametrize(
    ("key", "rope"),
    [
        ("rope_scaling", {"rope_type": "proportional", "factor": 2.0}),
        ("rope_scaling", {"type": "su", "short_factor": [1.0], "long_factor": [1.0]}),
        ("rope_parameters", {"rope_type": "proportional", "factor": 4.0, "rope_theta": 1e4}),
    ],
)
def test_rope_scaling_is_refused_by_name_before_loading(tmp_path, key, rope):
    folder = edited(save_tiny("qwen2", tmp_path / "qwen2"), **{key: rope})
    kind = rope.get("rope_type", rope.get("type"))
    message = f"{key} type '{kind}' is not supported"
    assert message in peek(str(folder), "the cat").problem
    unreadable_weights(folder)
    with pytest.raises(ScenarioError, match=message):
        import_model_layer(Request(str(folder), TEXT, 0))


def test_default_rope_parameters_import(tmp_path):
    folder = edited(
        save_tiny("llama", tmp_path / "llama"),
        rope_parameters={"rope_type": "default", "rope_theta": 500.0},
    )
    got = import_model_layer(Request(str(folder), TEXT, 1))
    assert got.scenario.settings.rope_base == 500.0 and got.agreement_weights <= EXACT


def by_hand(model, ids, freq=None):
    """Each layer's X (after its input norm) and attention weights, computed here in
    float64 from the model's weights: embeddings, RMS norms, Q/K/V with biases, Qwen3's
    QK norms, RoPE as base^(−2i/d) (or ``freq``), causal softmax, O, the SwiGLU MLP."""
    c = model.config
    p = {k: v.double() for k, v in model.state_dict().items()}
    n, heads, kv = ids.shape[1], c.num_attention_heads, c.num_key_value_heads
    d = getattr(c, "head_dim", None) or c.hidden_size // heads
    if freq is None:
        freq = c.rope_parameters["rope_theta"] ** (-np.arange(0, d, 2) / d)

    def rms(x, w):
        return w * x / torch.sqrt((x * x).mean(-1, keepdim=True) + c.rms_norm_eps)

    def linear(x, name):
        bias = p.get(f"{name}.bias")
        return x @ p[f"{name}.weight"].T + (0 if bias is None else bias)

    angles = torch.arange(n, dtype=torch.float64)[:, None] * torch.tensor(freq)
    cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()

    def rope(x):
        return x * cos + torch.cat([-x[..., d // 2 :], x[..., : d // 2]], -1) * sin

    h, Xs, Ws = p["embed_tokens.weight"][ids[0]], [], []
    for i in range(c.num_hidden_layers):
        at = f"layers.{i}."
        x = rms(h, p[at + "input_layernorm.weight"])
        q = linear(x, at + "self_attn.q_proj").view(n, heads, d).transpose(0, 1)
        k = linear(x, at + "self_attn.k_proj").view(n, kv, d).transpose(0, 1)
        v = linear(x, at + "self_attn.v_proj").view(n, kv, d).transpose(0, 1)
        if at + "self_attn.q_norm.weight" in p:
            q, k = (
                rms(q, p[at + "self_attn.q_norm.weight"]),
                rms(k, p[at + "self_attn.k_norm.weight"]),
            )
        q, k = rope(q), rope(k)
        k, v = k.repeat_interleave(heads // kv, 0), v.repeat_interleave(heads // kv, 0)
        scores = q @ k.transpose(1, 2) / math.sqrt(d)
        scores = scores.masked_fill(torch.ones(n, n).triu(1).bool(), -math.inf)
        w = scores.softmax(-1)
        Xs.append(x.numpy())
        Ws.append(w.numpy())
        h = h + linear((w @ v).transpose(0, 1).reshape(n, heads * d), at + "self_attn.o_proj")
        x = rms(h, p[at + "post_attention_layernorm.weight"])
        gate = torch.nn.functional.silu(linear(x, at + "mlp.gate_proj"))
        h = h + linear(gate * linear(x, at + "mlp.up_proj"), at + "mlp.down_proj")
    return Xs, Ws


@pytest.mark.parametrize("kind", ["qwen3", "llama", "qwen2"])
def test_every_layer_is_float64_throughout(kind):
    model = tiny_llama(kind)
    torch.manual_seed(7)
    with torch.no_grad():  # every norm's weights away from one, so each norm counts
        for name, weight in model.named_parameters():
            if "norm" in name:
                weight.uniform_(0.5, 1.5)
    Xs, Ws = by_hand(model, IDS)
    for layer in range(model.config.num_hidden_layers):
        got = import_layer(model, IDS, layer, LABELS)
        np.testing.assert_allclose(got.scenario.X, Xs[layer], rtol=0, atol=EXACT)
        np.testing.assert_allclose(got.model_weights, Ws[layer], rtol=0, atol=EXACT)
        np.testing.assert_allclose(compute(got.scenario).weights, Ws[layer], rtol=0, atol=EXACT)


def test_a_config_fed_through_a_loaded_model_is_checked_too():
    model = tiny_llama("llama")
    model.config.rope_parameters = {"rope_type": "proportional", "factor": 2.0, "rope_theta": 1e4}
    with pytest.raises(ScenarioError, match="rope_parameters type 'proportional' is not supported"):
        import_layer(model, IDS, 0, LABELS)


@pytest.mark.parametrize("model_type", ["gpt_neox", "stablelm", "falcon"])
@pytest.mark.parametrize("kind", ["yarn", "dynamic", "longrope"])
def test_families_that_take_llamas_fixed_rope_types_refuse_the_others(model_type, kind):
    """YaRN, dynamic and LongRoPE scale cos and sin or depend on the text's length: the
    families that reuse the Llama family's frequencies without those refuse them."""
    from attnviz.core.models.families import unsupported

    rope = {"rope_type": kind, "factor": 2.0, "rope_theta": 1e4}
    problem = unsupported({"model_type": model_type, "rope_scaling": rope})
    assert f"rope_scaling type '{kind}' is not supported" in problem


def test_distilbert_is_decoder_is_refused(tmp_path):
    folder = edited(save_tiny("distilbert", tmp_path / "d"), is_decoder=True)
    assert "DistilBERT is_decoder" in peek(str(folder), "the cat").problem


SCALED = {
    "linear": ({"rope_type": "linear", "factor": 4.0}, lambda f: f / 4.0),
    "llama3": (
        {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
         "original_max_position_embeddings": 64},
        None,
    ),
}  # fmt: skip


@pytest.mark.parametrize("kind", SCALED)
def test_scaled_rope_imports_with_the_models_own_frequencies(kind):
    rope, by_factor = SCALED[kind]
    config = transformers.LlamaConfig(
        vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, intermediate_size=32, max_position_embeddings=256,
        rope_parameters={**rope, "rope_theta": 10000.0}, attn_implementation="eager",
    )  # fmt: skip  # d_k 16: eight pairs, wavelengths 6 to 3,500 positions
    torch.manual_seed(4)
    model = transformers.LlamaModel(config).double().eval()
    plain = 10000.0 ** (-np.arange(0, 16, 2) / 16)
    if by_factor is not None:
        freq = by_factor(plain)
    else:
        freq = llama3_frequencies(plain, 8.0, 1.0, 4.0, 64)
        assert freq[0] == plain[0] and freq[-1] == plain[-1] / 8  # kept; divided
        assert plain[1] / 8 < freq[1] < plain[1]  # (and one between)
    _, Ws = by_hand(model, IDS, freq)
    for layer in range(2):
        got = import_layer(model, IDS, layer, LABELS)
        np.testing.assert_allclose(got.scenario.settings.rope_frequencies, freq, rtol=1e-15)
        np.testing.assert_allclose(compute(got.scenario).weights, Ws[layer], rtol=0, atol=EXACT)
        np.testing.assert_allclose(got.model_weights, Ws[layer], rtol=0, atol=EXACT)
        own = own_eager(model)[layer]  # transformers' own run: its frequencies in float32
        assert np.abs(own - Ws[layer]).max() < 1e-5


@pytest.mark.parametrize("kind", ["llama", "gpt2", "qwen3"])
def test_a_decoder_config_with_is_causal_false_is_refused_by_name(tmp_path, kind):
    """transformers' causal mask turns bidirectional under is_causal false: the first
    token then sees the later ones (shown here on the model itself), which a causal
    scenario would not; the import refuses it from the config, before any weight."""
    model = tiny_model(kind)
    model.config.is_causal = False
    with torch.no_grad():
        first = model(input_ids=IDS, output_attentions=True).attentions[0][0, 0, 0]
    assert first[1:].sum() > 0.1  # bidirectional
    folder = edited(save_tiny(kind, tmp_path / kind), is_causal=False)
    assert "is_causal false" in peek(str(folder), "the cat").problem
    unreadable_weights(folder)
    with pytest.raises(ScenarioError, match="is_causal false"):
        import_model_layer(Request(str(folder), TEXT, 0))


def test_an_encoder_config_with_is_causal_false_imports(tmp_path):
    folder = edited(save_tiny("bert", tmp_path / "bert"), is_causal=False)
    got = import_model_layer(Request(str(folder), TEXT, 1))
    assert got.scenario.settings.mask == "none" and got.agreement_weights <= EXACT


def test_a_sliding_window_of_nothing_is_refused_by_name(tmp_path):
    folder = edited(save_tiny("mistral", tmp_path / "m"), sliding_window=0)
    assert "mistral sliding_window 0 hides every key" in peek(str(folder), "the cat").problem
