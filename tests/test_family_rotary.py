"""GPT-NeoX (Pythia), OPT, GPT-J and StableLM: every layer imports exactly in float64,
against the model's own run and against a whole forward written here by hand; the
options these families' configs carry are modelled or refused by name before any weight
is read."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest

from attnviz.core.maths.forward import compute
from attnviz.core.maths.scenario import ScenarioError

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from offline_hub import offline  # noqa: E402, F401  (autouse)
from safetensors.torch import load_file, save_file  # noqa: E402
from tiny_models import WORDS, edited  # noqa: E402
from tiny_models import save_model as save  # noqa: E402
from variant_reference import llama3_frequencies  # noqa: E402

from attnviz.core.models.hf_layer import import_layer  # noqa: E402
from attnviz.core.models.importer import Request, import_model_layer, peek  # noqa: E402

EXACT = 1e-12
TEXT = "the cat sat on the mat"
IDS = torch.tensor([[3, 17, 5, 42, 8, 11, 2]])
LABELS = tuple(f"t{i}" for i in range(7))
F = torch.nn.functional


# Tiny seeded models: every weight, bias and norm given values of its own


def seeded(model, seed: int):
    torch.manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.LayerNorm):
                if module.weight is not None:
                    module.weight.uniform_(0.5, 1.5)
                    module.bias.normal_(0, 0.2)
            elif isinstance(module, (torch.nn.Linear, torch.nn.Embedding)):
                module.weight.normal_(0, 0.25)
                if getattr(module, "bias", None) is not None:
                    module.bias.normal_(0, 0.5)
    return model.double().eval()


def neox(**options):
    config = transformers.GPTNeoXConfig(
        vocab_size=50, hidden_size=32, num_hidden_layers=3, num_attention_heads=2,
        intermediate_size=48, max_position_embeddings=64, rotary_emb_base=500.0,
        attn_implementation="eager", **{"rotary_pct": 0.5, **options},
    )  # fmt: skip  # d_k 16, RoPE on the first 8 features of each head
    return seeded(transformers.GPTNeoXModel(config), 1)


def opt(**options):
    config = transformers.OPTConfig(
        vocab_size=50, hidden_size=16, num_hidden_layers=3, num_attention_heads=4, ffn_dim=32,
        max_position_embeddings=64, attn_implementation="eager", **options,
    )  # fmt: skip
    return seeded(transformers.OPTModel(config), 2)


def gptj(**options):
    config = transformers.GPTJConfig(
        vocab_size=50, n_embd=32, n_layer=3, n_head=2, n_positions=64, bos_token_id=0,
        eos_token_id=0, attn_implementation="eager", **{"rotary_dim": 6, **options},
    )  # fmt: skip  # d_k 16, RoPE on the first 6 features of each head
    return seeded(transformers.GPTJModel(config), 3)


def stablelm(**options):
    config = transformers.StableLmConfig(
        vocab_size=50, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=48, max_position_embeddings=64,
        partial_rotary_factor=0.5, rope_theta=500.0, bos_token_id=0, eos_token_id=0,
        attn_implementation="eager", **{"use_qkv_bias": True, **options},
    )  # fmt: skip  # d_k 8, RoPE on the first 4 features of each head
    return seeded(transformers.StableLmModel(config), 4)


# Whole forwards by hand, in float64: each layer's X, attention weights and attention
# output (before the residual)


def params(model):
    return {k: v.double() for k, v in model.state_dict().items()}


def linear(p, x, name):
    bias = p.get(f"{name}.bias")
    return x @ p[f"{name}.weight"].T + (0 if bias is None else bias)


def layer_norm(p, x, name, eps=1e-5):
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    out = (x - mean) / torch.sqrt(var + eps)
    if f"{name}.weight" in p:
        out = out * p[f"{name}.weight"] + p[f"{name}.bias"]
    return out


def rope_half(x, dims, freq):
    """Pairs (i, i + dims/2) of the first ``dims`` features turned by position · freq."""
    n = x.shape[-2]
    angles = torch.arange(n, dtype=torch.float64)[:, None] * torch.tensor(freq)
    cos, sin = angles.cos(), angles.sin()
    a, b, rest = x[..., : dims // 2], x[..., dims // 2 : dims], x[..., dims:]
    return torch.cat([a * cos - b * sin, a * sin + b * cos, rest], -1)


def rope_interleaved(x, dims, base):
    """Pairs (2i, 2i + 1) of the first ``dims`` features turned by position · base^(−2i/dims)."""
    n = x.shape[-2]
    freq = base ** (-np.arange(0, dims, 2) / dims)
    angles = torch.arange(n, dtype=torch.float64)[:, None] * torch.tensor(freq)
    cos, sin = angles.cos(), angles.sin()
    a, b = x[..., 0:dims:2], x[..., 1:dims:2]
    out = x.clone()
    out[..., 0:dims:2] = a * cos - b * sin
    out[..., 1:dims:2] = a * sin + b * cos
    return out


def attention(q, k, v):
    """Causal softmax(q·kᵀ/√d) with key/value heads repeated for their query heads; the
    weights and the heads' outputs side by side (n, heads·d)."""
    heads, n, d = q.shape
    k, v = k.repeat_interleave(heads // k.shape[0], 0), v.repeat_interleave(heads // v.shape[0], 0)
    scores = q @ k.transpose(1, 2) / math.sqrt(d)
    scores = scores.masked_fill(torch.ones(n, n).triu(1).bool(), -math.inf)
    w = scores.softmax(-1)
    return w, (w @ v).transpose(0, 1).reshape(n, heads * d)


def split(x, heads):
    n = x.shape[0]
    return x.view(n, heads, -1).transpose(0, 1)


def by_hand_neox(model, ids, freq=None):
    c, p = model.config, params(model)
    heads, d = c.num_attention_heads, c.hidden_size // c.num_attention_heads
    r = int(d * c.rope_parameters["partial_rotary_factor"])
    if freq is None:
        freq = c.rope_parameters["rope_theta"] ** (-np.arange(0, r, 2) / r)
    h, out = p["embed_in.weight"][ids[0]], ([], [], [])
    for i in range(c.num_hidden_layers):
        at = f"layers.{i}."
        x = layer_norm(p, h, at + "input_layernorm")
        qkv = split(linear(p, x, at + "attention.query_key_value"), heads)  # (heads, n, 3d)
        q, k, v = qkv[..., :d], qkv[..., d : 2 * d], qkv[..., 2 * d :]
        w, a = attention(rope_half(q, r, freq), rope_half(k, r, freq), v)
        a = linear(p, a, at + "attention.dense")
        for kept, value in zip(out, (x, w, a), strict=True):
            kept.append(value.numpy())

        def mlp(y, at=at):
            y = layer_norm(p, y, at + "post_attention_layernorm")
            return linear(
                p, F.gelu(linear(p, y, at + "mlp.dense_h_to_4h")), at + "mlp.dense_4h_to_h"
            )

        h = h + a + mlp(h) if c.use_parallel_residual else (h + a) + mlp(h + a)
    return out


def by_hand_opt(model, ids):
    c, p = model.config, params(model)
    heads, d, n = c.num_attention_heads, c.hidden_size // c.num_attention_heads, ids.shape[1]
    h = p["decoder.embed_tokens.weight"][ids[0]]
    if c.word_embed_proj_dim != c.hidden_size:
        h = h @ p["decoder.project_in.weight"].T
    h = h + p["decoder.embed_positions.weight"][torch.arange(n) + 2]  # OPT's offset of 2
    before, out = c.do_layer_norm_before, ([], [], [])
    for i in range(c.num_hidden_layers):
        at = f"decoder.layers.{i}."
        x = layer_norm(p, h, at + "self_attn_layer_norm") if before else h
        q, k, v = (split(linear(p, x, at + f"self_attn.{s}_proj"), heads) for s in "qkv")
        w, a = attention(q, k, v)
        a = linear(p, a, at + "self_attn.out_proj")
        for kept, value in zip(out, (x, w, a), strict=True):
            kept.append(value.numpy())
        h = h + a
        if not before:
            h = layer_norm(p, h, at + "self_attn_layer_norm")
        y = layer_norm(p, h, at + "final_layer_norm") if before else h
        h = h + linear(p, F.relu(linear(p, y, at + "fc1")), at + "fc2")
        if not before:
            h = layer_norm(p, h, at + "final_layer_norm")
    assert d * heads == c.hidden_size
    return out


def gelu_new(x):
    return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def by_hand_gptj(model, ids):
    c, p = model.config, params(model)
    heads, r = c.n_head, c.rotary_dim or c.n_embd
    h, out = p["wte.weight"][ids[0]], ([], [], [])
    for i in range(c.n_layer):
        at = f"h.{i}."
        x = layer_norm(p, h, at + "ln_1")
        q, k, v = (split(linear(p, x, at + f"attn.{s}_proj"), heads) for s in "qkv")
        w, a = attention(rope_interleaved(q, r, 10000.0), rope_interleaved(k, r, 10000.0), v)
        a = linear(p, a, at + "attn.out_proj")
        for kept, value in zip(out, (x, w, a), strict=True):
            kept.append(value.numpy())
        h = h + a + linear(p, gelu_new(linear(p, x, at + "mlp.fc_in")), at + "mlp.fc_out")
    return out


def by_hand_stablelm(model, ids, freq=None):
    c, p = model.config, params(model)
    heads, kv = c.num_attention_heads, c.num_key_value_heads
    d = c.hidden_size // heads
    r = int(d * c.rope_parameters["partial_rotary_factor"])
    if freq is None:
        freq = c.rope_parameters["rope_theta"] ** (-np.arange(0, r, 2) / r)
    h, out = p["embed_tokens.weight"][ids[0]], ([], [], [])
    for i in range(c.num_hidden_layers):
        at = f"layers.{i}."
        x = layer_norm(p, h, at + "input_layernorm")
        q = split(linear(p, x, at + "self_attn.q_proj"), heads)
        k, v = (split(linear(p, x, at + f"self_attn.{s}_proj"), kv) for s in "kv")
        w, a = attention(rope_half(q, r, freq), rope_half(k, r, freq), v)
        a = linear(p, a, at + "self_attn.o_proj")
        for kept, value in zip(out, (x, w, a), strict=True):
            kept.append(value.numpy())

        def mlp(y, at=at):
            gate = F.silu(linear(p, y, at + "mlp.gate_proj"))
            return linear(p, gate * linear(p, y, at + "mlp.up_proj"), at + "mlp.down_proj")

        if c.use_parallel_residual:
            h = h + a + mlp(x)
        else:
            h = h + a
            h = h + mlp(layer_norm(p, h, at + "post_attention_layernorm"))
    return out


CASES = {
    "gpt_neox": (neox, by_hand_neox, {}),
    "gpt_neox sequential, no biases": (
        neox, by_hand_neox, {"use_parallel_residual": False, "attention_bias": False},
    ),
    "gpt_neox without rotary": (neox, by_hand_neox, {"rotary_pct": 0.0}),
    "opt": (opt, by_hand_opt, {}),
    "opt norm after, no biases": (
        opt, by_hand_opt, {"do_layer_norm_before": False, "enable_bias": False},
    ),
    "opt project_in": (opt, by_hand_opt, {"word_embed_proj_dim": 8}),
    "opt norms without weights": (opt, by_hand_opt, {"layer_norm_elementwise_affine": False}),
    "gptj": (gptj, by_hand_gptj, {}),
    "gptj full rotary": (gptj, by_hand_gptj, {"rotary_dim": 16}),
    "stablelm": (stablelm, by_hand_stablelm, {}),
    "stablelm parallel, no biases": (
        stablelm, by_hand_stablelm, {"use_parallel_residual": True, "use_qkv_bias": False},
    ),
}  # fmt: skip


def own_eager(model):
    """transformers' own eager attention weights, every layer, its float32 steps kept."""
    with torch.no_grad():
        return [a[0].numpy() for a in model(input_ids=IDS, output_attentions=True).attentions]


@pytest.mark.parametrize("case", CASES)
def test_every_layer_is_exact_against_the_model_and_a_forward_by_hand(case):
    build, by_hand, options = CASES[case]
    model = build(**options)
    Xs, Ws, outs = by_hand(model, IDS)
    own = own_eager(model)
    for layer in range(3):
        got = import_layer(model, IDS, layer, LABELS)
        r = compute(got.scenario)
        np.testing.assert_allclose(r.weights, got.model_weights, rtol=0, atol=EXACT)
        np.testing.assert_allclose(r.final, got.model_output, rtol=0, atol=EXACT)
        np.testing.assert_allclose(got.scenario.X, Xs[layer], rtol=0, atol=EXACT)
        np.testing.assert_allclose(r.weights, Ws[layer], rtol=0, atol=EXACT)
        np.testing.assert_allclose(r.final, outs[layer], rtol=0, atol=EXACT)
        np.testing.assert_allclose(got.model_weights, Ws[layer], rtol=0, atol=EXACT)
        # transformers' own run, unchanged (float32 angles and softmax): close, not exact
        assert np.abs(own[layer] - Ws[layer]).max() < 1e-5


@pytest.mark.parametrize("case", ["gpt_neox", "opt", "gptj", "stablelm"])
def test_a_float32_model_imports_to_float32_rounding(case):
    build, _, options = CASES[case]
    model = build(**options).float()
    for layer in range(3):
        got = import_layer(model, IDS, layer, LABELS)
        r = compute(got.scenario)
        assert np.abs(r.weights - got.model_weights).max() <= 1e-5
        assert np.abs(r.final - got.model_output).max() <= 1e-5


LLAMA3 = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64}  # fmt: skip
SCALED = {
    "gpt_neox linear": (neox, by_hand_neox, 8, {"rope_type": "linear", "factor": 4.0}),
    "gpt_neox llama3": (neox, by_hand_neox, 8, {"rope_type": "llama3", **LLAMA3}),
    "stablelm linear": (stablelm, by_hand_stablelm, 4, {"rope_type": "linear", "factor": 4.0}),
    "stablelm llama3": (stablelm, by_hand_stablelm, 4, {"rope_type": "llama3", **LLAMA3}),
}


@pytest.mark.parametrize("case", SCALED)
def test_scaled_partial_rope_uses_the_scaled_frequencies(case):
    build, by_hand, r, rope = SCALED[case]
    model = build(rope_scaling=rope)
    plain = 500.0 ** (-np.arange(0, r, 2) / r)
    if rope["rope_type"] == "linear":
        freq = plain / 4.0
    else:
        freq = llama3_frequencies(plain, 8.0, 1.0, 4.0, 64)
        assert freq[0] == plain[0] and freq[-1] == plain[-1] / 8  # kept; divided
    _, Ws, _ = by_hand(model, IDS, freq)
    for layer in range(3):
        got = import_layer(model, IDS, layer, LABELS)
        assert got.scenario.settings.rope_dims == r
        np.testing.assert_allclose(got.scenario.settings.rope_frequencies, freq, rtol=1e-15)
        np.testing.assert_allclose(compute(got.scenario).weights, Ws[layer], rtol=0, atol=EXACT)
        np.testing.assert_allclose(got.model_weights, Ws[layer], rtol=0, atol=EXACT)


def test_the_fused_neox_projection_is_read_head_by_head():
    """Head 1's query is the output features 3·16 … 3·16 + 15 of query_key_value, not
    features 16 … 31 (which are head 0's key)."""
    model = neox()
    got = import_layer(model, IDS, 0, LABELS)
    weight = model.layers[0].attention.query_key_value.weight.detach().numpy()
    np.testing.assert_array_equal(got.scenario.W_Q[1], weight[48:64].T)
    np.testing.assert_array_equal(got.scenario.W_K[0], weight[16:32].T)


# Saved folders, imported as a user would


@pytest.mark.parametrize("case", ["gpt_neox", "opt project_in", "gptj", "stablelm"])
def test_a_saved_folder_imports_exactly(tmp_path, case):
    build, by_hand, options = CASES[case]
    folder = save(build(**options), tmp_path / "model")
    loaded = transformers.AutoModel.from_pretrained(folder, dtype=torch.float64)
    ids = torch.tensor([[WORDS.index(w) + 3 for w in TEXT.split()]])
    _, Ws, _ = by_hand(loaded, ids)
    for layer in range(3):
        got = import_model_layer(Request(str(folder), TEXT, layer))
        assert got.agreement_weights <= EXACT and got.agreement_output <= EXACT
        np.testing.assert_allclose(got.provenance.model_weights, Ws[layer], rtol=0, atol=EXACT)


REFUSED = {
    "gpt_neox": (
        neox, {"rope_scaling": {"type": "dynamic", "factor": 2.0}},
        "rope_scaling type 'dynamic' is not supported",
    ),
    "gpt_neox odd rotary": (
        neox, {"rope_parameters": {"rope_type": "default", "rope_theta": 500.0,
                                   "partial_rotary_factor": 0.3125}},
        "GPT-NeoX partial rotary factor 0.3125 is not supported",
    ),
    "gpt_neox rotary_pct over 1": (
        neox, {"rope_parameters": None, "rotary_pct": 1.5},
        r"GPT-NeoX partial rotary factor 1.5 is not supported \(it turns 24 of the head's 16",
    ),
    "stablelm odd rotary": (
        stablelm, {"rope_parameters": {"rope_type": "default", "rope_theta": 500.0,
                                       "partial_rotary_factor": 0.375}},
        "StableLM partial rotary factor 0.375 is not supported",
    ),
    "gptj odd": (gptj, {"rotary_dim": 5}, "GPT-J rotary_dim 5 is not supported"),
    "gptj wide": (gptj, {"rotary_dim": 18}, "GPT-J rotary_dim 18 is not supported"),
    "gptj null": (
        gptj, {"rotary_dim": None}, "GPT-J rotary_dim null with 2 heads is not supported",
    ),
    "stablelm qk_layernorm": (
        stablelm, {"qk_layernorm": True}, r"StableLM qk_layernorm \(a LayerNorm per head",
    ),
    "stablelm yarn": (
        stablelm, {"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}},
        "rope_parameters type 'yarn' is not supported",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", REFUSED)
def test_what_is_not_modelled_is_refused_by_name_before_loading(tmp_path, case):
    build, changes, message = REFUSED[case]
    folder = edited(save(build(), tmp_path / "model"), **changes)
    assert re.search(message, peek(str(folder), "the cat").problem)
    (folder / "model.safetensors").write_bytes(b"never read")
    with pytest.raises(ScenarioError, match=message):
        import_model_layer(Request(str(folder), TEXT, 0))


def test_a_gptj_config_naming_its_width_hidden_size_is_checked_too(tmp_path):
    folder = save(gptj(), tmp_path / "model")
    config = json.loads((folder / "config.json").read_text())
    config["hidden_size"], config["num_attention_heads"] = (
        config.pop("n_embd"),
        config.pop("n_head"),
    )
    (folder / "config.json").write_text(json.dumps({**config, "rotary_dim": 18}))
    assert "GPT-J rotary_dim 18 is not supported" in peek(str(folder), "the cat").problem
    (folder / "config.json").write_text(json.dumps({**config, "rotary_dim": 16}))
    got = import_model_layer(Request(str(folder), TEXT, 2))
    assert got.scenario.settings.rope_dims == 16 and got.agreement_weights <= EXACT


@pytest.mark.parametrize("case", ["gpt_neox", "gptj"])
def test_buffers_older_checkpoints_saved_are_not_refused(tmp_path, case):
    """Pythia's and GPT-J's older checkpoints hold a causal mask, its fill value and (in
    Pythia) the rotary frequencies inside each layer: no weights, which transformers drops."""
    folder = save(CASES[case][0](), tmp_path / "model")
    at = {"gpt_neox": "layers.{}.attention.", "gptj": "h.{}.attn."}[case]
    weights = load_file(folder / "model.safetensors")
    for i in range(3):
        weights[at.format(i) + "bias"] = torch.ones(1, 1, 64, 64).tril().bool()
        weights[at.format(i) + "masked_bias"] = torch.tensor(-1e9)
        if case == "gpt_neox":
            weights[at.format(i) + "rotary_emb.inv_freq"] = torch.ones(4)
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    got = import_model_layer(Request(str(folder), TEXT, 1))
    assert got.agreement_weights <= EXACT and got.agreement_output <= EXACT
