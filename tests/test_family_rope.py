"""Scaled RoPE in the Llama family (YaRN, dynamic NTK, LongRoPE) and the Phi-3 family
(fused Q/K/V, partial rotary, LongRoPE, a sliding window in every layer): each imports
exactly, checked against a by-hand float64 forward of the whole model written here, with
each type's frequencies and factor on cos and sin written out here too."""

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
from tiny_models import save_model as saved  # noqa: E402

from attnviz.core.models.hf_layer import import_layer  # noqa: E402
from attnviz.core.models.importer import Request, import_model_layer, peek  # noqa: E402

EXACT = 1e-12
OWN = 1e-5  # transformers' own run keeps the angles (and here the frequencies) in float32
TEXT = "the cat sat on the mat"  # six words: ids 3, 4, 5, 6, 3, 7
IDS = torch.tensor([[3, 17, 5, 42, 8, 11, 2]])
LABELS = tuple(f"t{i}" for i in range(7))
THETA = 10000.0
D = 16  # d_k of the tiny models: eight pairs, wavelengths 6 to 3,500 positions


# Each type's frequencies and factor, written out


def base_frequencies(d: int, theta: float = THETA) -> np.ndarray:
    return np.array([theta ** (-i / d) for i in range(0, d, 2)])


def yarn(d, factor, context, beta_fast=32.0, beta_slow=1.0, truncate=True, **attention):
    """YaRN: pair i turns position·f_i; over the original context it turns
    context·f_i/2π times. Pairs turning more than beta_fast times keep f_i, those turning
    fewer than beta_slow times get f_i/factor, a straight line over the pairs between
    (the pair numbers bounding it rounded outwards unless truncate is off). Factor on cos
    and sin: attention_factor, else (0.1·mscale·ln s + 1)/(0.1·mscale_all_dim·ln s + 1),
    else 0.1·ln s + 1."""

    def pair_turning(turns: float) -> float:  # solves context·θ^(−2i/d)/2π = turns for i
        return d * math.log(context / (2 * math.pi * turns)) / (2 * math.log(THETA))

    first, last = pair_turning(beta_fast), pair_turning(beta_slow)
    if truncate:
        first, last = math.floor(first), math.ceil(last)
    first, last = max(first, 0), min(last, d - 1)
    freq = []
    for i, f in enumerate(base_frequencies(d)):
        share = min(max((i - first) / (last - first), 0.0), 1.0)  # 0: kept, 1: divided
        freq.append(share * f / factor + (1 - share) * f)
    if "attention_factor" in attention:
        scale = attention["attention_factor"]
    elif "mscale" in attention:
        scale = (0.1 * attention["mscale"] * math.log(factor) + 1) / (
            0.1 * attention["mscale_all_dim"] * math.log(factor) + 1
        )
    else:
        scale = 0.1 * math.log(factor) + 1
    return np.array(freq), scale


def dynamic(d, factor, most, n):
    """Dynamic NTK: up to ``most`` tokens the base's; n > most: the base raised to
    θ·(factor·n/most − factor + 1)^(d/(d − 2))."""
    if n <= most:
        return base_frequencies(d), 1.0
    theta = THETA * (factor * n / most - factor + 1) ** (d / (d - 2))
    return base_frequencies(d, theta), 1.0


def longrope(d, short, long, context, most, n, attention_factor=None):
    """LongRoPE: f_i / short[i], or f_i / long[i] for a text longer than the original
    context; cos and sin times attention_factor, else √(1 + ln(most/context)/ln context)."""
    ext = long if n > context else short
    freq = np.array([f / e for f, e in zip(base_frequencies(d), ext, strict=True)])
    if attention_factor is None:
        attention_factor = math.sqrt(1 + math.log(most / context) / math.log(context))
    return freq, attention_factor


SHORT = [1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0]
LONG = [1.0, 2.0, 4.0, 6.0, 8.0, 12.0, 16.0, 24.0]

# name: (rope parameters, max_position_embeddings, (frequencies, factor) for IDS's 7 tokens)
SCALED = {
    "yarn": (
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
        256,
        yarn(D, 4.0, 64),
    ),
    "yarn untruncated, betas": (
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
         "beta_fast": 16.0, "beta_slow": 2.0, "truncate": False},
        256,
        yarn(D, 4.0, 64, 16.0, 2.0, truncate=False),
    ),
    "yarn mscale": (
        {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 32,
         "mscale": 1.0, "mscale_all_dim": 0.5},
        256,
        yarn(D, 8.0, 32, mscale=1.0, mscale_all_dim=0.5),
    ),
    "yarn attention_factor": (
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
         "attention_factor": 1.25},
        256,
        yarn(D, 4.0, 64, attention_factor=1.25),
    ),
    "yarn, its context max_position_embeddings": (
        {"rope_type": "yarn", "factor": 4.0}, 64, yarn(D, 4.0, 64)
    ),
    "dynamic, a text within max_position_embeddings": (
        {"rope_type": "dynamic", "factor": 3.0}, 64, dynamic(D, 3.0, 64, 7)
    ),
    "dynamic, a longer text": ({"rope_type": "dynamic", "factor": 3.0}, 4, dynamic(D, 3.0, 4, 7)),
    "longrope short": (
        {"rope_type": "longrope", "short_factor": SHORT, "long_factor": LONG,
         "original_max_position_embeddings": 16},
        64,
        longrope(D, SHORT, LONG, 16, 64, 7),
    ),
    "longrope long": (
        {"rope_type": "longrope", "short_factor": SHORT, "long_factor": LONG,
         "original_max_position_embeddings": 4},
        64,
        longrope(D, SHORT, LONG, 4, 64, 7),
    ),
    "longrope attention_factor": (
        {"rope_type": "longrope", "short_factor": SHORT, "long_factor": LONG,
         "original_max_position_embeddings": 4, "attention_factor": 0.875},
        64,
        longrope(D, SHORT, LONG, 4, 64, 7, attention_factor=0.875),
    ),
}  # fmt: skip


def test_the_written_out_frequencies_are_the_kinds_they_claim():
    plain = base_frequencies(D)
    freq, scale = SCALED["yarn"][2]
    assert freq[0] == plain[0] and np.allclose(freq[3:], plain[3:] / 4, rtol=1e-15)
    assert np.all((plain[1:3] / 4 < freq[1:3]) & (freq[1:3] < plain[1:3]))  # the ramp
    assert scale == pytest.approx(1 + 0.1 * math.log(4))
    assert np.array_equal(SCALED["dynamic, a text within max_position_embeddings"][2][0], plain)
    longer = SCALED["dynamic, a longer text"][2][0]
    assert longer[0] == 1 and np.all(longer[1:] < plain[1:])  # a larger base: slower pairs
    assert SCALED["longrope long"][2][1] == pytest.approx(math.sqrt(3))  # ln 16 / ln 4 = 2


# The by-hand forward


def by_hand(model, ids, freq, factor=1.0, rope_dims=None, window=None):
    """Each layer's X (after its input norm), attention weights and attention output
    (before the residual), computed here in float64 from the model's weights:
    embeddings, RMS norms (StarCoder2: LayerNorms), Q/K/V (separate with biases, or
    Phi-3's fused rows), RoPE on the leading ``rope_dims`` features with these
    frequencies and cos, sin times ``factor``, a causal (or sliding-window) softmax, O
    with its bias, the SwiGLU MLP (StarCoder2: GELU, tanh approximation)."""
    c = model.config
    p = {k: v.double() for k, v in model.state_dict().items()}
    n, heads, kv = ids.shape[1], c.num_attention_heads, c.num_key_value_heads
    d = c.hidden_size // heads
    r = rope_dims or d

    def norm(x, name):
        if f"{name}.bias" in p:  # StarCoder2: LayerNorm
            centred = x - x.mean(-1, keepdim=True)
            spread = torch.sqrt((centred * centred).mean(-1, keepdim=True) + c.norm_epsilon)
            return p[f"{name}.weight"] * centred / spread + p[f"{name}.bias"]
        return p[f"{name}.weight"] * x / torch.sqrt((x * x).mean(-1, keepdim=True) + c.rms_norm_eps)

    def linear(x, name):
        bias = p.get(f"{name}.bias")
        return x @ p[f"{name}.weight"].T + (0 if bias is None else bias)

    angles = torch.arange(n, dtype=torch.float64)[:, None] * torch.tensor(freq)
    cos = torch.cat([angles, angles], -1).cos() * factor
    sin = torch.cat([angles, angles], -1).sin() * factor

    def rope(x):
        turned, kept = x[..., :r], x[..., r:]
        half = torch.cat([-turned[..., r // 2 :], turned[..., : r // 2]], -1)
        return torch.cat([turned * cos + half * sin, kept], -1)

    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    hidden = (j > i) if window is None else (j > i) | (j <= i - window)
    h, Xs, Ws, Os = p["embed_tokens.weight"][ids[0]], [], [], []
    for layer in range(c.num_hidden_layers):
        at = f"layers.{layer}."
        x = norm(h, at + "input_layernorm")
        if at + "self_attn.qkv_proj.weight" in p:
            qkv = linear(x, at + "self_attn.qkv_proj")
            q, k, v = qkv.split([heads * d, kv * d, kv * d], -1)
        else:
            q, k, v = (linear(x, at + f"self_attn.{s}_proj") for s in "qkv")
        q = q.reshape(n, heads, d).transpose(0, 1)
        k, v = (t.reshape(n, kv, d).transpose(0, 1) for t in (k, v))
        q, k = rope(q), rope(k)
        k, v = k.repeat_interleave(heads // kv, 0), v.repeat_interleave(heads // kv, 0)
        scores = (q @ k.transpose(1, 2) / math.sqrt(d)).masked_fill(hidden, -math.inf)
        w = scores.softmax(-1)
        o = linear((w @ v).transpose(0, 1).reshape(n, heads * d), at + "self_attn.o_proj")
        Xs.append(x.numpy())
        Ws.append(w.numpy())
        Os.append(o.numpy())
        h = h + o
        x = norm(h, at + "post_attention_layernorm")
        if at + "mlp.c_fc.weight" in p:  # StarCoder2: c_proj(gelu_tanh(c_fc(x)))
            u = linear(x, at + "mlp.c_fc")
            gelu = 0.5 * u * (1 + torch.tanh(math.sqrt(2 / math.pi) * (u + 0.044715 * u**3)))
            h = h + linear(gelu, at + "mlp.c_proj")
            continue
        if at + "mlp.gate_up_proj.weight" in p:
            gate, up = linear(x, at + "mlp.gate_up_proj").chunk(2, -1)
        else:
            gate, up = linear(x, at + "mlp.gate_proj"), linear(x, at + "mlp.up_proj")
        h = h + linear(torch.nn.functional.silu(gate) * up, at + "mlp.down_proj")
    return Xs, Ws, Os


def own_eager(model, ids=IDS):
    with torch.no_grad():
        return [
            a[0].double().numpy() for a in model(input_ids=ids, output_attentions=True).attentions
        ]


def seeded(model, seed):
    """Every projection bias and norm weight given values, so that each counts."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, weight in model.named_parameters():
            if "norm" in name:
                weight.uniform_(0.5, 1.5)
            elif name.endswith("bias"):
                weight.normal_()
    return model


def exact_every_layer(model, freq, factor, **shape):
    """Every layer: attnviz vs the model's run and both vs the by-hand forward (≤1e-12),
    transformers' own unchanged run vs the by-hand one (≤1e-5); the largest gaps."""
    Xs, Ws, Os = by_hand(model, IDS, freq, factor, **shape)
    gaps = {"model": 0.0, "by hand": 0.0, "own": 0.0}
    for layer in range(model.config.num_hidden_layers):
        got = import_layer(model, IDS, layer, LABELS)
        s = got.scenario.settings
        pairs = len(freq)  # the default RoPE keeps only its base
        own = s.rope_frequencies or s.rope_base ** (-np.arange(0, 2 * pairs, 2) / (2 * pairs))
        np.testing.assert_allclose(own, freq, rtol=1e-14, atol=0)
        assert s.rope_factor == pytest.approx(factor, rel=1e-15)
        r = compute(got.scenario)
        model_gap = max(
            np.abs(r.weights - got.model_weights).max(), np.abs(r.final - got.model_output).max()
        )
        hand_gap = max(
            np.abs(got.scenario.X - Xs[layer]).max(),
            np.abs(r.weights - Ws[layer]).max(),
            np.abs(r.final - Os[layer]).max(),
            np.abs(got.model_weights - Ws[layer]).max(),
        )
        own_gap = np.abs(own_eager(model)[layer] - Ws[layer]).max()
        assert model_gap <= EXACT and hand_gap <= EXACT and own_gap <= OWN
        gaps = {
            "model": max(gaps["model"], model_gap),
            "by hand": max(gaps["by hand"], hand_gap),
            "own": max(gaps["own"], own_gap),
        }
    return gaps


def float32_gap(model):
    worst = 0.0
    for layer in range(model.config.num_hidden_layers):
        got = import_layer(model.float(), IDS, layer, LABELS)
        r = compute(got.scenario)
        worst = max(
            worst,
            np.abs(r.weights - got.model_weights).max(),
            np.abs(r.final - got.model_output).max(),
        )
    assert worst <= 1e-5
    return worst


def refused_before_loading(folder, message):
    assert message in peek(str(folder), "the cat").problem
    (folder / "model.safetensors").write_bytes(b"never read")
    with pytest.raises(ScenarioError, match=message):
        import_model_layer(Request(str(folder), TEXT, 0))


def folder_imports_exactly(folder, layers):
    for layer in range(layers):
        got = import_model_layer(Request(str(folder), TEXT, layer))
        assert got.agreement_weights <= EXACT and got.agreement_output <= EXACT


# The Llama family


def scaled_llama(rope, most):
    config = transformers.LlamaConfig(
        vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, intermediate_size=32, max_position_embeddings=most,
        attention_bias=True, rope_parameters={**rope, "rope_theta": THETA},
        attn_implementation="eager",
    )  # fmt: skip
    torch.manual_seed(4)
    return seeded(transformers.LlamaModel(config), 5).double().eval()


@pytest.mark.parametrize("kind", SCALED)
def test_scaled_rope_imports_exactly_in_every_layer(kind):
    rope, most, (freq, factor) = SCALED[kind]
    model = scaled_llama(rope, most)
    exact_every_layer(model, freq, factor)
    float32_gap(model)


@pytest.mark.parametrize("kind", ["yarn mscale", "longrope long", "dynamic, a longer text"])
def test_scaled_rope_settings_carry_the_models_rope(kind):
    rope, most, (freq, _) = SCALED[kind]
    got = import_layer(scaled_llama(rope, most), IDS, 1, LABELS)
    s = got.scenario.settings
    assert s.positional == "rope" and s.rope_style == "half" and s.rope_dims is None
    if kind.startswith("dynamic"):  # the base the text's length rescaled it to
        np.testing.assert_allclose(s.rope_base ** (-np.arange(0, D, 2) / D), freq, rtol=1e-14)


def test_dynamic_rope_follows_the_length_of_the_text():
    rope, most, _ = SCALED["dynamic, a longer text"]
    model = scaled_llama(rope, most)
    for n in (3, 4, 5, 7):
        ids = IDS[:, :n]
        freq, _ = dynamic(D, 3.0, most, n)
        _, Ws, _ = by_hand(model, ids, freq)
        got = import_layer(model, ids, 0, LABELS[:n])
        np.testing.assert_allclose(compute(got.scenario).weights, Ws[0], rtol=0, atol=EXACT)
        np.testing.assert_allclose(got.model_weights, Ws[0], rtol=0, atol=EXACT)


@pytest.mark.parametrize("kind", ["yarn", "longrope long", "dynamic, a longer text"])
def test_a_saved_scaled_llama_imports_exactly(tmp_path, kind):
    rope, most, _ = SCALED[kind]
    folder = saved(scaled_llama(rope, max(most, 8)), tmp_path / "llama")
    folder_imports_exactly(folder, 2)


@pytest.mark.parametrize(
    ("key", "rope", "kind"),
    [
        ("rope_parameters", {"rope_type": "proportional", "rope_theta": THETA}, "proportional"),
        ("rope_scaling", {"type": "su", "short_factor": SHORT, "long_factor": LONG}, "su"),
    ],
)
def test_other_rope_types_are_refused_by_name_before_loading(tmp_path, key, rope, kind):
    folder = saved(scaled_llama({"rope_type": "default"}, 64), tmp_path / "llama")
    config = json.loads((folder / "config.json").read_text())
    config.pop("rope_parameters", None)
    (folder / "config.json").write_text(json.dumps({**config, key: rope}))
    refused_before_loading(folder, f"{key} type '{kind}' is not supported")


# Phi-3


PHI3_SHORT = [1.0, 1.5, 2.0, 3.0, 4.0, 6.0]  # six pairs: 0.75 of d_k 16
PHI3_LONG = [1.0, 2.0, 5.0, 10.0, 20.0, 40.0]


def tiny_phi3(**options):
    config = transformers.Phi3Config(
        vocab_size=50, hidden_size=32, num_hidden_layers=3, num_attention_heads=2,
        num_key_value_heads=1, intermediate_size=32, max_position_embeddings=64,
        pad_token_id=0, bos_token_id=1, eos_token_id=2, attn_implementation="eager",
        **options,
    )  # fmt: skip
    torch.manual_seed(6)
    return seeded(transformers.Phi3Model(config), 7).double().eval()


def phi3_longrope(context, **more):
    return {
        "partial_rotary_factor": 0.75,
        "original_max_position_embeddings": context,
        "rope_scaling": {
            "type": "longrope", "short_factor": PHI3_SHORT, "long_factor": PHI3_LONG, **more
        },
    }  # fmt: skip


PHI3 = {
    # name: (config options, frequencies, factor, rope_dims, window)
    "default": ({}, base_frequencies(D), 1.0, None, None),
    "partial rotary, sliding window": (
        {"partial_rotary_factor": 0.75, "sliding_window": 3},
        base_frequencies(12),
        1.0,
        12,
        3,
    ),
    "Phi-4-mini's window, longer than any text: causal": (
        {"partial_rotary_factor": 0.75, "sliding_window": 262144},
        base_frequencies(12),
        1.0,
        12,
        None,
    ),
    "longrope short": (
        {**phi3_longrope(16), "sliding_window": 4},
        longrope(12, PHI3_SHORT, PHI3_LONG, 16, 64, 7)[0],
        math.sqrt(1 + math.log(4) / math.log(16)),
        12,
        4,
    ),
    "longrope long": (
        phi3_longrope(4),
        longrope(12, PHI3_SHORT, PHI3_LONG, 4, 64, 7)[0],
        math.sqrt(1 + math.log(16) / math.log(4)),
        12,
        None,
    ),
    "longrope attention_factor": (
        phi3_longrope(4, attention_factor=1.125),
        longrope(12, PHI3_SHORT, PHI3_LONG, 4, 64, 7)[0],
        1.125,
        12,
        None,
    ),
}


@pytest.mark.parametrize("kind", PHI3)
def test_phi3_imports_exactly_in_every_layer(kind):
    options, freq, factor, rope_dims, window = PHI3[kind]
    model = tiny_phi3(**options)
    exact_every_layer(model, freq, factor, rope_dims=rope_dims, window=window)
    got = import_layer(model, IDS, 2, LABELS)
    s = got.scenario.settings
    assert (s.rope_dims, s.mask) == (rope_dims, "causal" if window is None else "sliding-window")
    assert window is None or s.window == window
    assert got.scenario.W_Q.shape == (2, 32, 16) and got.scenario.W_K.shape == (1, 32, 16)
    float32_gap(model)


@pytest.mark.parametrize("name", ["su", "yarn"])
def test_phi3_old_names_are_longrope(name):
    options = phi3_longrope(4)
    options["rope_scaling"] = {**options["rope_scaling"], "type": name}
    _, freq, factor, rope_dims, _ = PHI3["longrope long"]
    exact_every_layer(tiny_phi3(**options), freq, factor, rope_dims=rope_dims)


@pytest.mark.parametrize("kind", ["longrope long", "partial rotary, sliding window"])
def test_a_saved_phi3_imports_exactly(tmp_path, kind):
    folder = saved(tiny_phi3(**PHI3[kind][0]), tmp_path / "phi3")
    folder_imports_exactly(folder, 3)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"rope_scaling": {"type": "linear", "factor": 2.0}},
            "rope_scaling type 'linear' is not supported",
        ),
        (
            {"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}},
            "rope_scaling type 'dynamic' is not supported",
        ),
        ({"sliding_window": 0}, "Phi-3 sliding_window 0 is not supported"),
    ],
)
def test_phi3_options_it_does_not_model_are_refused_by_name_before_loading(
    tmp_path, changes, message
):
    folder = saved(tiny_phi3(), tmp_path / "phi3")
    config = json.loads((folder / "config.json").read_text())
    config.pop("rope_parameters", None)
    (folder / "config.json").write_text(json.dumps({**config, **changes}))
    refused_before_loading(folder, message)


# StarCoder2 (in the Llama family)


def tiny_starcoder2(**options):
    config = transformers.Starcoder2Config(
        vocab_size=50, hidden_size=32, num_hidden_layers=3, num_attention_heads=2,
        num_key_value_heads=1, intermediate_size=32, max_position_embeddings=64,
        norm_epsilon=1e-5, attn_implementation="eager", **options,
    )  # fmt: skip
    torch.manual_seed(8)
    return seeded(transformers.Starcoder2Model(config), 9).double().eval()


STARCODER2 = {
    # name: (config options, frequencies, factor, window)
    "plain": ({}, base_frequencies(D), 1.0, None),
    "sliding window": ({"sliding_window": 3}, base_frequencies(D), 1.0, 3),
    "a window as long as the text: causal": (
        {"sliding_window": 7}, base_frequencies(D), 1.0, None
    ),
    "no biases, yarn": (
        {"use_bias": False, "sliding_window": 5,
         "rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": THETA,
                             "original_max_position_embeddings": 64}},
        *SCALED["yarn"][2],
        5,
    ),
}  # fmt: skip


@pytest.mark.parametrize("kind", STARCODER2)
def test_starcoder2_imports_exactly_in_every_layer(kind):
    options, freq, factor, window = STARCODER2[kind]
    model = tiny_starcoder2(**options)
    exact_every_layer(model, freq, factor, window=window)
    got = import_layer(model, IDS, 1, LABELS)
    s = got.scenario.settings
    assert s.mask == ("causal" if window is None else "sliding-window")
    assert window is None or s.window == window
    assert np.any(got.scenario.b_O != 0) == options.get("use_bias", True)
    float32_gap(model)


def test_a_saved_starcoder2_imports_exactly(tmp_path):
    folder = saved(tiny_starcoder2(sliding_window=3), tmp_path / "starcoder2")
    folder_imports_exactly(folder, 3)


def test_starcoder2_rope_types_it_does_not_model_are_refused_by_name(tmp_path):
    folder = saved(tiny_starcoder2(), tmp_path / "starcoder2")
    config = json.loads((folder / "config.json").read_text())
    config.pop("rope_parameters", None)
    (folder / "config.json").write_text(
        json.dumps({**config, "rope_scaling": {"rope_type": "proportional"}})
    )
    refused_before_loading(folder, "rope_scaling type 'proportional' is not supported")
