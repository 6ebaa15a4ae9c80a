"""The Gemma family (Gemma, Gemma 2, Gemma 3's text model): every layer of a tiny seeded
model imports exactly, against the model's run and against a float64 forward of the
whole model written out here; sliding windows hide exactly the keys transformers' mask
hides; what the import does not model is refused by name before any weight is read."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from attnviz.core.maths.forward import compute
from attnviz.core.maths.scenario import LIMITS, ScenarioError

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from offline_hub import offline  # noqa: E402, F401  (autouse)
from tiny_models import WORDS, edited, layer_exactly, word_tokenizer  # noqa: E402

from attnviz.core.models.hf_layer import import_layer  # noqa: E402
from attnviz.core.models.importer import Request, import_model_layer, peek  # noqa: E402

EXACT = 1e-12
TEXT = "the cat sat on the mat"
TEXT_IDS = torch.tensor([[WORDS.index(w) + 3 for w in TEXT.split()]])
IDS = torch.tensor([[3, 17, 5, 42, 8, 11, 2]])
LABELS = tuple(f"t{i}" for i in range(7))
KINDS = ("gemma", "gemma2", "gemma3_text")

# What each tiny model is, written out for the by-hand forward: head_dim 8 (not 24 / 4),
# the scale, Gemma 2's soft-cap, which layers slide and how far, each layer's RoPE base
# and linear factor.
WINDOW = 3
EXPECTED = {
    "gemma": {
        "scale": 8**-0.5, "softcap": None, "sliding": (False, False, False),
        "rope": [(10000.0, 1.0)] * 3,
    },
    "gemma2": {  # without layer_types: every other layer slides, from the first
        "scale": 10**-0.5, "softcap": 1.5, "sliding": (True, False, True),
        "rope": [(500.0, 1.0)] * 3,
    },
    "gemma3_text": {  # sliding_window_pattern 3: every third layer is global
        "scale": 12**-0.5, "softcap": None, "sliding": (True, True, False, True),
        "rope": [(100.0, 1.0), (100.0, 1.0), (5000.0, 4.0), (100.0, 1.0)],
    },
}  # fmt: skip


def gemma_config(kind: str, **changes):
    common = dict(
        vocab_size=50, hidden_size=24, num_attention_heads=4, head_dim=8,
        intermediate_size=32, attention_bias=True, initializer_range=0.2,
        max_position_embeddings=64, attn_implementation="eager",
    )  # fmt: skip
    if kind == "gemma":
        own = dict(num_hidden_layers=3, num_key_value_heads=2, rope_theta=10000.0)
        return transformers.GemmaConfig(**common, **{**own, **changes})
    if kind == "gemma2":  # one key/value head for four query heads: MQA
        own = dict(
            num_hidden_layers=3, num_key_value_heads=1, query_pre_attn_scalar=10,
            attn_logit_softcapping=1.5, sliding_window=WINDOW, rope_theta=500.0,
        )  # fmt: skip
        return transformers.Gemma2Config(**common, **{**own, **changes})
    own = dict(
        num_hidden_layers=4, num_key_value_heads=2, query_pre_attn_scalar=12,
        sliding_window=WINDOW, sliding_window_pattern=3, rope_theta=5000.0,
        rope_local_base_freq=100.0, rope_scaling={"rope_type": "linear", "factor": 4.0},
        attn_logit_softcapping=0.5,
    )  # fmt: skip  # (Gemma 3's attention never passes its attn_logit_softcapping)
    return transformers.Gemma3TextConfig(**common, **{**own, **changes})


def tiny_gemma(kind: str, dtype=torch.float64, **changes):
    """A tiny seeded model: every norm weight and bias given values, so that each counts."""
    config = gemma_config(kind, **changes)
    torch.manual_seed(2)
    model = transformers.AutoModel.from_config(config)
    with torch.no_grad():
        for name, weight in model.named_parameters():
            if "norm" in name:
                weight.uniform_(-0.5, 0.5)  # the norms multiply by 1 + weight
            elif name.endswith("bias"):
                weight.normal_(0.0, 0.5)
    return model.to(dtype).eval()


def by_hand(model, ids, kind, softcap="expected", window=WINDOW):
    """Each layer's X (after its input norm), attention weights and attention output
    (before any norm after it), in float64 from the model's weights: embeddings times
    √hidden, RMS norms times 1 + weight, Q/K/V with biases, Gemma 3's QK norms, RoPE with
    each layer's base and factor, the scale, Gemma 2's soft-cap, the causal or sliding
    mask, O, Gemma 2 and 3's norms after attention and around the MLP, the GeGLU MLP."""
    c, e = model.config, EXPECTED[kind]
    cap = e["softcap"] if softcap == "expected" else softcap
    p = {k: v.double() for k, v in model.state_dict().items()}
    n, heads, kv, d = ids.shape[1], 4, c.num_key_value_heads, 8

    def rms(x, w):
        return x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-6) * (1 + w)

    def linear(x, name):
        return x @ p[f"{name}.weight"].T + p.get(f"{name}.bias", 0)

    def rope(x, theta, factor):
        angles = torch.arange(n, dtype=torch.float64)[:, None] * torch.tensor(
            theta ** (-np.arange(0, d, 2) / d) / factor
        )
        cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()
        return x * cos + torch.cat([-x[..., d // 2 :], x[..., : d // 2]], -1) * sin

    def mlp(x, at):
        gate = torch.nn.functional.gelu(linear(x, at + "mlp.gate_proj"), approximate="tanh")
        return linear(gate * linear(x, at + "mlp.up_proj"), at + "mlp.down_proj")

    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    h, Xs, Ws, Outs = p["embed_tokens.weight"][ids[0]] * math.sqrt(24), [], [], []
    for layer, sliding in enumerate(e["sliding"]):
        at = f"layers.{layer}."
        x = rms(h, p[at + "input_layernorm.weight"])
        q = linear(x, at + "self_attn.q_proj").view(n, heads, d).transpose(0, 1)
        k = linear(x, at + "self_attn.k_proj").view(n, kv, d).transpose(0, 1)
        v = linear(x, at + "self_attn.v_proj").view(n, kv, d).transpose(0, 1)
        if kind == "gemma3_text":
            q = rms(q, p[at + "self_attn.q_norm.weight"])
            k = rms(k, p[at + "self_attn.k_norm.weight"])
        q, k = rope(q, *e["rope"][layer]), rope(k, *e["rope"][layer])
        k, v = k.repeat_interleave(heads // kv, 0), v.repeat_interleave(heads // kv, 0)
        scores = q @ k.transpose(1, 2) * e["scale"]
        if cap is not None:
            scores = cap * torch.tanh(scores / cap)
        seen = (j <= i) & (j > i - window) if sliding else j <= i  # i − window < j ≤ i
        w = scores.masked_fill(torch.tensor(~seen), -math.inf).softmax(-1)
        o = linear((w @ v).transpose(0, 1).reshape(n, heads * d), at + "self_attn.o_proj")
        Xs.append(x.numpy())
        Ws.append(w.numpy())
        Outs.append(o.numpy())
        if kind == "gemma":
            h = h + o
            h = h + mlp(rms(h, p[at + "post_attention_layernorm.weight"]), at)
        else:
            h = h + rms(o, p[at + "post_attention_layernorm.weight"])
            m = mlp(rms(h, p[at + "pre_feedforward_layernorm.weight"]), at)
            h = h + rms(m, p[at + "post_feedforward_layernorm.weight"])
    return Xs, Ws, Outs


def own_eager(model, ids=IDS):
    """transformers' own eager attention weights, unchanged (its softmax, norms and rotary
    angles in float32)."""
    with torch.no_grad():
        return [
            a[0].double().numpy() for a in model(input_ids=ids, output_attentions=True).attentions
        ]


@pytest.mark.parametrize("kind", KINDS)
def test_every_layer_is_exact_against_a_by_hand_forward(kind):
    model = tiny_gemma(kind)
    Xs, Ws, Outs = by_hand(model, IDS, kind)
    own = own_eager(model)
    for layer in range(model.config.num_hidden_layers):
        _, r = layer_exactly(model, IDS, LABELS, layer, Xs[layer], Ws[layer])
        np.testing.assert_allclose(r.final, Outs[layer], rtol=0, atol=EXACT)
        assert np.abs(own[layer] - Ws[layer]).max() < 1e-5  # transformers' own run


def test_gemma2s_soft_cap_counts_and_gemma3s_is_ignored_as_its_code_ignores_it():
    gemma2, gemma3 = tiny_gemma("gemma2"), tiny_gemma("gemma3_text")
    _, capped, _ = by_hand(gemma2, IDS, "gemma2")
    _, plain, _ = by_hand(gemma2, IDS, "gemma2", softcap=None)
    assert np.abs(capped[1] - plain[1]).max() > 1e-2  # the cap changes the weights
    assert import_layer(gemma2, IDS, 1, LABELS).scenario.settings.softcap == 1.5
    _, ignored, _ = by_hand(gemma3, IDS, "gemma3_text", softcap=0.5)
    got = import_layer(gemma3, IDS, 2, LABELS)
    assert got.scenario.settings.softcap is None
    assert np.abs(got.model_weights - ignored[2]).max() > 1e-2


@pytest.mark.parametrize("kind", ["gemma2", "gemma3_text"])
@pytest.mark.parametrize("window", [1, 2, 3, 6])
def test_a_sliding_window_hides_exactly_the_keys_transformers_mask_hides(kind, window):
    model = tiny_gemma(kind, sliding_window=window)
    got = import_layer(model, IDS, 0, LABELS)
    assert (got.scenario.settings.mask, got.scenario.settings.window) == ("sliding-window", window)
    # query i sees key j when i − window < j ≤ i: the key `window` back is already hidden
    i, j = np.indices((7, 7))
    seen = (j <= i) & (j > i - window)
    assert np.all(got.model_weights[:, ~seen] == 0) and np.all(got.model_weights[:, seen] > 0)
    assert np.all(compute(got.scenario).weights[:, ~seen] == 0)
    _, Ws, _ = by_hand(model, IDS, kind, window=window)
    np.testing.assert_allclose(compute(got.scenario).weights, Ws[0], rtol=0, atol=EXACT)


def test_a_window_longer_than_any_scenario_is_kept_at_the_longest():
    model = tiny_gemma("gemma2", sliding_window=4096)  # Gemma 2's own
    got = import_layer(model, IDS, 0, LABELS)
    assert got.scenario.settings.window == LIMITS.tokens  # hides nothing more than 4096
    r = compute(got.scenario)
    np.testing.assert_allclose(r.weights, got.model_weights, rtol=0, atol=EXACT)


@pytest.mark.parametrize("kind", KINDS)
def test_a_float32_model_imports_within_float32_rounding(kind):
    model = tiny_gemma(kind, torch.float32)
    for layer in range(model.config.num_hidden_layers):
        got = import_layer(model, IDS, layer, LABELS)
        r = compute(got.scenario)
        assert np.abs(r.weights - got.model_weights).max() <= 1e-5
        assert np.abs(r.final - got.model_output).max() <= 1e-5


def save_gemma(kind: str, folder, **changes):
    """A tiny Gemma checkpoint (float32) with a word-level tokenizer; config.json edited."""
    folder.mkdir(parents=True, exist_ok=True)
    tiny_gemma(kind, torch.float32).save_pretrained(folder)
    word_tokenizer(False).save(str(folder / "tokenizer.json"))
    return edited(folder, **changes) if changes else folder


def loaded(folder):
    return transformers.AutoModel.from_pretrained(
        folder, dtype=torch.float64, attn_implementation="eager"
    ).eval()


@pytest.mark.parametrize("kind", KINDS)
def test_a_saved_checkpoint_imports_exactly(tmp_path, kind):
    folder = save_gemma(kind, tmp_path / kind)
    _, Ws, _ = by_hand(loaded(folder), TEXT_IDS, kind)
    for layer in range(len(EXPECTED[kind]["sliding"])):
        got = import_model_layer(Request(str(folder), TEXT, layer))
        assert got.agreement_weights <= EXACT and got.agreement_output <= EXACT
        np.testing.assert_allclose(got.provenance.model_weights, Ws[layer], rtol=0, atol=EXACT)
    got = import_model_layer(Request(str(folder), TEXT, 0, dtype="float32"))
    assert got.agreement_weights <= 1e-5 and got.agreement_output <= 1e-5


def test_gemma3s_older_config_names_import_as_the_newer(tmp_path):
    """sliding_window_pattern, rope_theta and rope_local_base_freq without layer_types or
    rope_parameters: the same layers slide, with the same bases."""
    folder = save_gemma("gemma3_text", tmp_path / "g3")
    edited(
        folder,
        drop=("layer_types", "rope_parameters"),
        sliding_window_pattern=3,
        rope_theta=5000.0,
        rope_local_base_freq=100.0,
        rope_scaling={"rope_type": "linear", "factor": 4.0},
    )
    _, Ws, _ = by_hand(loaded(folder), TEXT_IDS, "gemma3_text")
    for layer, sliding in enumerate(EXPECTED["gemma3_text"]["sliding"]):
        got = import_model_layer(Request(str(folder), TEXT, layer))
        settings = got.scenario.settings
        assert settings.mask == ("sliding-window" if sliding else "causal")
        assert settings.rope_base == (100.0 if sliding else 5000.0)
        np.testing.assert_allclose(got.provenance.model_weights, Ws[layer], rtol=0, atol=EXACT)
        assert got.agreement_weights <= EXACT and got.agreement_output <= EXACT


def test_a_stray_sliding_window_in_a_gemma_config_changes_nothing(tmp_path):
    folder = save_gemma("gemma", tmp_path / "gemma", sliding_window=2)
    for layer in range(3):
        got = import_model_layer(Request(str(folder), TEXT, layer))
        assert got.scenario.settings.mask == "causal"
        assert got.agreement_weights <= EXACT and got.agreement_output <= EXACT


REFUSED = [
    ("gemma", {"use_bidirectional_attention": True}, "Gemma use_bidirectional_attention"),
    ("gemma3_text", {"use_bidirectional_attention": True}, "Gemma 3 use_bidirectional_attention"),
    ("gemma2", {"is_causal": False}, "Gemma 2 is_causal false"),
    ("gemma2", {"sliding_window": None}, "Gemma 2 sliding_window null"),
    ("gemma2", {"rope_parameters": {"rope_type": "yarn", "factor": 2.0, "rope_theta": 1e4}},
     "rope_parameters type 'yarn' is not supported"),
    ("gemma3_text", {"rope_parameters": {
        "full_attention": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4},
        "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}},
     "rope_parameters type 'dynamic' is not supported"),
    ("gemma3_text", {"rope_scaling": {"rope_type": "llama3", "factor": 8.0}},
     "rope_scaling type 'llama3' is not supported"),
    ("gemma3_text", {"layer_types": ["chunked_attention"] * 4},
     "Gemma 3 layer type 'chunked_attention' is not supported"),
    ("gemma", {"partial_rotary_factor": 0.5}, "Gemma partial_rotary_factor 0.5 is not supported"),
]  # fmt: skip


@pytest.mark.parametrize(("kind", "changes", "message"), REFUSED)
def test_what_is_not_modelled_is_refused_by_name_before_loading(tmp_path, kind, changes, message):
    folder = save_gemma(kind, tmp_path / kind, **changes)
    assert message in peek(str(folder), "the cat").problem
    (folder / "model.safetensors").write_bytes(b"never read")
    with pytest.raises(ScenarioError, match=message):
        import_model_layer(Request(str(folder), TEXT, 0))


def test_gemma3s_multimodal_model_is_refused_by_name(tmp_path):
    folder = save_gemma("gemma3_text", tmp_path / "g3")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(
        json.dumps({"model_type": "gemma3", "text_config": config, "vision_config": {}})
    )
    assert "model type 'gemma3': Gemma 3's multimodal model" in peek(str(folder), "x").problem
    with pytest.raises(ScenarioError, match="model type 'gemma3'"):
        import_model_layer(Request(str(folder), TEXT, 0))
