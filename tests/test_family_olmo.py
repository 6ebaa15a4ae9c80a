"""OLMo 2: QK-norm over the whole projection, post-norm blocks, RoPE; every layer exact
in float64 against a by-hand float64 forward written here, refusals by name before any
weight is read."""

from __future__ import annotations

import math

import numpy as np
import pytest

from attnviz.core.maths.forward import compute
from attnviz.core.maths.scenario import ScenarioError

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from offline_hub import offline  # noqa: E402, F401  (autouse)
from tiny_models import word_tokenizer  # noqa: E402

from attnviz.api.capturing import capture  # noqa: E402
from attnviz.core.models.hf_layer import import_layer  # noqa: E402
from attnviz.core.models.importer import Request, import_model_layer, peek  # noqa: E402

EXACT = 1e-12
TEXT = "the cat sat on the mat"
IDS = torch.tensor([[3, 17, 5, 42, 8, 11, 2]])
LABELS = tuple(f"t{i}" for i in range(7))
LAYERS = 3


def tiny_olmo2(dtype=torch.float64, bias=True, kv=2, **options):
    """A tiny seeded OLMo 2: every projection bias and every norm weight (QK, post-
    attention, post-feedforward, final) given values away from 0 and 1, so each counts."""
    torch.manual_seed(3)
    config = transformers.Olmo2Config(
        vocab_size=50,
        hidden_size=16,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=kv,
        intermediate_size=32,
        max_position_embeddings=64,
        attention_bias=bias,
        rms_norm_eps=1e-5,
        eos_token_id=2,  # (the default, 50279, is outside this vocabulary)
        attn_implementation="eager",
        **options,
    )
    model = transformers.Olmo2Model(config)
    with torch.no_grad():
        for name, weight in model.named_parameters():
            if "norm" in name:
                weight.uniform_(0.5, 1.5)
            elif name.endswith("bias"):
                weight.normal_()
    return model.to(dtype).eval()


def by_hand(model, ids, freq=None):
    """Each layer's X (the raw residual entering attention), attention weights and
    attention output (o_proj's, before the post-attention norm), in float64 from the
    model's weights: embeddings; Q, K, V with biases; RMS norms of the whole Q and K
    projections (all heads' features together) before the heads are split; RoPE as
    base^(−2i/d) (or ``freq``) on half-split pairs; causal softmax; O; the residual
    plus the post-attention norm of the attention output; the SwiGLU MLP, its output
    normalised before the residual adds it."""
    c = model.config
    p = {k: v.double() for k, v in model.state_dict().items()}
    n, heads, kv = ids.shape[1], c.num_attention_heads, c.num_key_value_heads
    d = c.hidden_size // heads
    if freq is None:
        freq = c.rope_parameters["rope_theta"] ** (-np.arange(0, d, 2) / d)

    def rms(x, w):  # over the last axis: for Q and K, all heads' features of a token
        return w * x / torch.sqrt((x * x).mean(-1, keepdim=True) + c.rms_norm_eps)

    def linear(x, name):
        bias = p.get(f"{name}.bias")
        return x @ p[f"{name}.weight"].T + (0 if bias is None else bias)

    angles = torch.arange(n, dtype=torch.float64)[:, None] * torch.tensor(freq)
    cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()

    def rope(x):
        return x * cos + torch.cat([-x[..., d // 2 :], x[..., : d // 2]], -1) * sin

    h, Xs, Ws, Os = p["embed_tokens.weight"][ids[0]], [], [], []
    for i in range(c.num_hidden_layers):
        at = f"layers.{i}.self_attn."
        q = rms(linear(h, at + "q_proj"), p[at + "q_norm.weight"])  # (n, heads·d): whole
        k = rms(linear(h, at + "k_proj"), p[at + "k_norm.weight"])
        v = linear(h, at + "v_proj")
        q = rope(q.view(n, heads, d).transpose(0, 1))
        k = rope(k.view(n, kv, d).transpose(0, 1))
        v = v.view(n, kv, d).transpose(0, 1)
        k, v = k.repeat_interleave(heads // kv, 0), v.repeat_interleave(heads // kv, 0)
        scores = q @ k.transpose(1, 2) / math.sqrt(d)
        scores = scores.masked_fill(torch.ones(n, n).triu(1).bool(), -math.inf)
        w = scores.softmax(-1)
        o = linear((w @ v).transpose(0, 1).reshape(n, heads * d), at + "o_proj")
        Xs.append(h.numpy())
        Ws.append(w.numpy())
        Os.append(o.numpy())
        at = f"layers.{i}."
        h = h + rms(o, p[at + "post_attention_layernorm.weight"])
        gate = torch.nn.functional.silu(linear(h, at + "mlp.gate_proj"))
        up = linear(gate * linear(h, at + "mlp.up_proj"), at + "mlp.down_proj")
        h = h + rms(up, p[at + "post_feedforward_layernorm.weight"])
    return Xs, Ws, Os


@pytest.mark.parametrize(("bias", "kv"), [(True, 2), (False, 4), (True, 1)])
def test_every_layer_is_exact_and_float64_throughout(bias, kv):
    model = tiny_olmo2(bias=bias, kv=kv)
    Xs, Ws, Os = by_hand(model, IDS)
    for layer in range(LAYERS):
        got = import_layer(model, IDS, layer, LABELS)
        s = got.scenario
        assert s.settings.qk_norm == "rms-whole" and s.settings.positional == "rope"
        assert (s.n_heads, s.kv_heads) == (4, kv)
        r = compute(s)
        # attnviz against the model's own run
        np.testing.assert_allclose(r.weights, got.model_weights, rtol=0, atol=EXACT)
        np.testing.assert_allclose(r.final, got.model_output, rtol=0, atol=EXACT)
        # ... and against the by-hand forward
        np.testing.assert_allclose(s.X, Xs[layer], rtol=0, atol=EXACT)
        np.testing.assert_allclose(r.weights, Ws[layer], rtol=0, atol=EXACT)
        np.testing.assert_allclose(r.final, Os[layer], rtol=0, atol=EXACT)
        np.testing.assert_allclose(got.model_weights, Ws[layer], rtol=0, atol=EXACT)
        # (the per-head QK-norm is another layer: the whole-projection one is what counts)
        per_head = compute(s.with_settings(qk_norm="rms"))
        assert np.abs(per_head.weights - Ws[layer]).max() > 1e-6


def test_the_norm_weights_and_biases_are_the_models_own():
    model = tiny_olmo2()
    attn = model.layers[1].self_attn
    s = import_layer(model, IDS, 1, LABELS).scenario
    np.testing.assert_array_equal(
        np.asarray(s.q_norm).reshape(-1), attn.q_norm.weight.detach().numpy()
    )
    np.testing.assert_array_equal(
        np.asarray(s.k_norm).reshape(-1), attn.k_norm.weight.detach().numpy()
    )
    np.testing.assert_array_equal(np.asarray(s.b_K).reshape(-1), attn.k_proj.bias.detach().numpy())
    np.testing.assert_array_equal(s.b_O[0], attn.o_proj.bias.detach().numpy())
    assert s.settings.qk_norm_eps == 1e-5


def test_transformers_own_eager_attention_is_the_by_hand_one():
    model = tiny_olmo2()
    _, Ws, _ = by_hand(model, IDS)
    with torch.no_grad():
        own = model(input_ids=IDS, output_attentions=True).attentions
    for layer in range(LAYERS):
        np.testing.assert_allclose(own[layer][0].numpy(), Ws[layer], rtol=0, atol=1e-5)


def test_a_float32_model_imports_within_float32():
    model = tiny_olmo2(torch.float32)
    for layer in range(LAYERS):
        got = import_layer(model, IDS, layer, LABELS)
        r = compute(got.scenario)
        np.testing.assert_allclose(r.weights, got.model_weights, rtol=0, atol=1e-5)
        np.testing.assert_allclose(r.final, got.model_output, rtol=0, atol=1e-5)


def saved(folder, **options):
    folder.mkdir(parents=True, exist_ok=True)
    tiny_olmo2(torch.float32, **options).save_pretrained(folder)
    word_tokenizer(False).save(str(folder / "tokenizer.json"))
    return folder


def test_a_saved_folder_imports_exactly(tmp_path):
    folder = saved(tmp_path / "olmo2")
    assert peek(str(folder), TEXT).problem == ""
    for layer in range(LAYERS):
        got = import_model_layer(Request(str(folder), TEXT, layer))
        assert got.scenario.settings.qk_norm == "rms-whole"
        assert got.agreement_weights <= EXACT and got.agreement_output <= EXACT


def test_linear_rope_scaling_imports_with_the_models_own_frequencies():
    rope = {"rope_type": "linear", "factor": 4.0, "rope_theta": 500.0}
    model = tiny_olmo2(rope_parameters=rope)
    freq = 500.0 ** (-np.arange(0, 4, 2) / 4) / 4.0
    _, Ws, Os = by_hand(model, IDS, freq)
    for layer in range(LAYERS):
        got = import_layer(model, IDS, layer, LABELS)
        np.testing.assert_allclose(got.scenario.settings.rope_frequencies, freq, rtol=1e-15)
        r = compute(got.scenario)
        np.testing.assert_allclose(r.weights, Ws[layer], rtol=0, atol=EXACT)
        np.testing.assert_allclose(r.final, Os[layer], rtol=0, atol=EXACT)


@pytest.mark.parametrize(
    ("key", "rope"),
    [
        ("rope_parameters", {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}),
        ("rope_parameters", {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}),
        ("rope_scaling", {"type": "longrope", "short_factor": [1.0], "long_factor": [1.0]}),
    ],
)
def test_other_rope_types_are_refused_by_name_before_loading(tmp_path, key, rope):
    import json

    folder = saved(tmp_path / "olmo2")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, key: rope}))
    kind = rope.get("rope_type", rope.get("type"))
    message = f"{key} type '{kind}' is not supported"
    assert message in peek(str(folder), "the cat").problem
    (folder / "model.safetensors").write_bytes(b"never read")  # no loader could read it
    with pytest.raises(ScenarioError, match=message):
        import_model_layer(Request(str(folder), TEXT, 0))


def test_a_captured_olmo2_attention_module_is_the_whole_norm():
    model = tiny_olmo2()
    attn = model.layers[1].self_attn
    with capture(attn) as captured, torch.no_grad():
        model(input_ids=IDS)
    s = captured.scenario
    assert s.settings.qk_norm == "rms-whole"
    np.testing.assert_array_equal(
        np.asarray(s.q_norm).reshape(-1), attn.q_norm.weight.detach().numpy()
    )
    _, Ws, Os = by_hand(model, IDS)
    r = compute(s)
    np.testing.assert_allclose(r.weights, Ws[1], rtol=0, atol=1e-5)
    np.testing.assert_allclose(r.final, Os[1], rtol=0, atol=1e-5)
