"""BLOOM and Falcon: each layer imported exactly in float64 (against the model's run and
against a forward of the whole model written out here in float64), transformers' own
run within float32 rounding, a float32 model, a saved folder, and every option that is
not modelled refused by name from config.json before any weight is read."""

from __future__ import annotations

import math

import numpy as np
import pytest

from attnviz.core.maths.forward import compute
from attnviz.core.maths.scenario import ScenarioError

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from offline_hub import offline  # noqa: E402, F401  (autouse)
from tiny_models import (  # noqa: E402
    WORDS,
    edited,
    layer_exactly,
    save_model,
    unreadable_weights,
)
from variant_reference import llama3_frequencies  # noqa: E402

from attnviz.core.models.hf_layer import import_layer  # noqa: E402
from attnviz.core.models.importer import Request, import_model_layer, peek  # noqa: E402

EXACT = 1e-12
TEXT = "the cat sat on the mat and it ran"
IDS = torch.tensor([[WORDS.index(w) + 3 for w in TEXT.split()]])  # as the folders' tokenizer
N = IDS.shape[1]
LABELS = tuple(f"t{i}" for i in range(N))
CAUSAL = torch.ones(N, N).triu(1).bool()


def nontrivial(model, seed):
    """Every bias and LayerNorm weight away from its initial 0 or 1, so each counts."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.5)
            elif "norm" in name or name.startswith("ln"):
                p.uniform_(0.5, 1.5)
    return model


def layer_norm(x, p, name, eps):
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * p[name + ".weight"] + p[name + ".bias"]


def linear(x, p, name):
    bias = p.get(name + ".bias")
    return x @ p[name + ".weight"].T + (0 if bias is None else bias)


def causal_softmax(scores):
    return scores.masked_fill(CAUSAL, -math.inf).softmax(-1)


def check_every_layer(model, reference):
    """attnviz against the model's run and against the forward written out, every layer;
    transformers' own unchanged run within float32 rounding of the latter."""
    Xs, Ws = reference
    with torch.no_grad():
        own = [a[0].numpy() for a in model(input_ids=IDS, output_attentions=True).attentions]
    worst = {"model": 0.0, "by hand": 0.0, "own": 0.0}
    for layer in range(model.config.num_hidden_layers):
        got, r = layer_exactly(model, IDS, LABELS, layer, Xs[layer], Ws[layer])
        assert np.abs(own[layer] - Ws[layer]).max() < 1e-5
        worst["model"] = max(worst["model"], float(np.abs(r.weights - got.model_weights).max()))
        worst["by hand"] = max(worst["by hand"], float(np.abs(r.weights - Ws[layer]).max()))
        worst["own"] = max(worst["own"], float(np.abs(own[layer] - Ws[layer]).max()))
    print(worst)
    return got


# BLOOM

# BLOOM's scores are Q·Kᵀ/√d + slope·j (j the key's position), attnviz's ALiBi is
# Q·Kᵀ/√d − slope·|i − j|. Under the causal mask only keys j ≤ i are seen, where
# −slope·|i − j| = −slope·(i − j) = slope·j − slope·i: the two rows of scores differ by
# slope·i, the same for every key of query i. softmax(s + c) = e^c·e^s / (e^c·Σe^s) =
# softmax(s), so the weights, and every product of them, are the same. The forward below
# is written BLOOM's way (slope·j) and checked against attnviz's (slope·|i − j|).

BLOOM_SLOPES = {
    # a power of two h: 2^(−8/h)^k, k = 1…h
    8: [2.0**-1, 2.0**-2, 2.0**-3, 2.0**-4, 2.0**-5, 2.0**-6, 2.0**-7, 2.0**-8],
    # 6 = 4 + 2: 2^(−2k) for k = 1…4, then 2^(−k) for the odd k = 1, 3 (every other of 8)
    6: [2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8, 2.0**-1, 2.0**-3],
    # 12 = 8 + 4: 2^(−k) for k = 1…8, then 2^(−k/2) for k = 1, 3, 5, 7
    12: [*(2.0**-k for k in range(1, 9)), *(2.0 ** (-k / 2) for k in (1, 3, 5, 7))],
}


def tiny_bloom(heads=6, dtype=torch.float64, **options):
    config = transformers.BloomConfig(
        vocab_size=50, hidden_size=24, n_layer=3, n_head=heads, **options
    )
    torch.manual_seed(2)
    return nontrivial(transformers.BloomModel(config), 3).to(dtype).eval()


def bloom_by_hand(model, slopes):
    """Each layer's X and weights, in float64 from the model's weights: embeddings and
    their LayerNorm; per layer a LayerNorm, query_key_value laid out [heads, 3, d],
    scores Q·Kᵀ/√d + slope·j, causal softmax, dense, the residual (the LayerNorm's
    output when apply_residual_connection_post_layernorm), a LayerNorm and BLOOM's
    tanh-GELU MLP."""
    c = model.config
    p = {k: v.double() for k, v in model.state_dict().items()}
    heads, eps = c.n_head, c.layer_norm_epsilon
    d = c.hidden_size // heads
    bias = torch.tensor(slopes, dtype=torch.float64)[:, None, None] * torch.arange(
        N, dtype=torch.float64
    )
    h = layer_norm(p["word_embeddings.weight"][IDS[0]], p, "word_embeddings_layernorm", eps)
    Xs, Ws = [], []
    post = c.apply_residual_connection_post_layernorm
    for i in range(c.n_layer):
        at = f"h.{i}."
        x = layer_norm(h, p, at + "input_layernorm", eps)
        qkv = linear(x, p, at + "self_attention.query_key_value").view(N, heads, 3, d)
        q, k, v = (qkv[:, :, t].transpose(0, 1) for t in range(3))
        w = causal_softmax(q @ k.transpose(1, 2) / math.sqrt(d) + bias)
        Xs.append(x.numpy())
        Ws.append(w.numpy())
        attn = linear((w @ v).transpose(0, 1).reshape(N, -1), p, at + "self_attention.dense")
        h = attn + (x if post else h)
        y = layer_norm(h, p, at + "post_attention_layernorm", eps)
        u = linear(y, p, at + "mlp.dense_h_to_4h")
        gelu = u * 0.5 * (1.0 + torch.tanh(0.79788456 * u * (1 + 0.044715 * u * u)))
        h = linear(gelu, p, at + "mlp.dense_4h_to_h") + (y if post else h)
    return Xs, Ws


@pytest.mark.parametrize("heads", [6, 8, 12])
def test_bloom_every_layer_is_exact_with_its_own_slopes(heads):
    model = tiny_bloom(heads)
    got = check_every_layer(model, bloom_by_hand(model, BLOOM_SLOPES[heads]))
    s = got.scenario.settings
    assert s.positional == "alibi" and s.mask == "causal"
    np.testing.assert_allclose(s.alibi_slopes, BLOOM_SLOPES[heads], rtol=1e-15)
    # the model's mask adds float64's lowest number, not −∞: every later key gets exactly 0
    assert np.all(got.model_weights[np.broadcast_to(CAUSAL.numpy(), got.model_weights.shape)] == 0)


@pytest.mark.parametrize(
    "options",
    [{"apply_residual_connection_post_layernorm": True}, {"pretraining_tp": 2}],
)
def test_bloom_block_options_are_exact(options):
    model = tiny_bloom(6, **options)
    check_every_layer(model, bloom_by_hand(model, BLOOM_SLOPES[6]))


def test_bloom_slow_but_exact_is_refused_by_name_before_loading(tmp_path):
    # transformers' sliced output projections (attention's dense, the MLP's last) leave
    # out their biases: another layer than the checkpoint's
    folder = edited(
        save_model(tiny_bloom(6), tmp_path / "bloom"), pretraining_tp=2, slow_but_exact=True
    )
    message = "BLOOM slow_but_exact with pretraining_tp 2 is not supported"
    assert message in peek(str(folder), TEXT).problem
    unreadable_weights(folder)
    with pytest.raises(ScenarioError, match=message):
        import_model_layer(Request(str(folder), TEXT, 0))


def test_bloom_float32_imports_within_float32_rounding():
    model = tiny_bloom(6, torch.float32)
    for layer in range(3):
        got = import_layer(model, IDS, layer, LABELS)
        r = compute(got.scenario)
        assert np.abs(r.weights - got.model_weights).max() <= 1e-5
        assert np.abs(r.final - got.model_output).max() <= 1e-5


def test_a_saved_bloom_folder_imports_exactly(tmp_path):
    folder = save_model(tiny_bloom(12), tmp_path / "bloom")
    # older checkpoints' switches, which no code in transformers reads
    edited(folder, attention_softmax_in_fp32=False, masked_softmax_fusion=True, offset_alibi=100)
    assert peek(str(folder), TEXT).problem == ""
    model = transformers.AutoModel.from_pretrained(folder, dtype=torch.float64)
    _, Ws = bloom_by_hand(model.eval(), BLOOM_SLOPES[12])
    for layer in range(3):
        got = import_model_layer(Request(str(folder), TEXT, layer))
        assert got.agreement_weights <= EXACT and got.agreement_output <= EXACT
        np.testing.assert_allclose(got.provenance.model_weights, Ws[layer], rtol=0, atol=EXACT)
    got = import_model_layer(Request(str(folder), TEXT, 1, dtype="float32"))
    assert got.agreement_weights <= 1e-5


# Falcon


def tiny_falcon(dtype=torch.float64, **options):
    settings = dict(
        vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, bias=True,
        attn_implementation="eager",
    )  # fmt: skip
    torch.manual_seed(4)
    model = transformers.FalconModel(transformers.FalconConfig(**{**settings, **options}))
    return nontrivial(model, 5).to(dtype).eval()


def falcon_qkv(fused, c, heads, d):
    """Q (heads, n, d), K and V (key/value heads, n, d) from the fused projection, in
    the three layouts Falcon's attention reads."""
    if c.new_decoder_architecture:  # per key/value head: its group's queries, K, V
        kv = c.num_kv_heads
        grouped = fused.view(N, kv, heads // kv + 2, d)
        q = grouped[:, :, :-2].reshape(N, heads, d)
        k, v = grouped[:, :, -2], grouped[:, :, -1]
    elif c.multi_query:  # every query head, then the one key, then the one value
        q = fused[:, : heads * d].view(N, heads, d)
        k = fused[:, heads * d : (heads + 1) * d].view(N, 1, d)
        v = fused[:, (heads + 1) * d :].view(N, 1, d)
    else:  # per head: Q, K, V
        per_head = fused.view(N, heads, 3, d)
        q, k, v = per_head[:, :, 0], per_head[:, :, 1], per_head[:, :, 2]
    return q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)


def falcon_by_hand(model, freq=None, slopes=None):
    """Each layer's X and weights, in float64 from the model's weights: embeddings; per
    layer the attention's LayerNorm (ln_attn for the new architecture's two), the fused
    projection split as its layout is, RoPE as base^(−2i/d) (or ``freq``) or, with
    ``slopes``, (slope·j)/√d added to the scores; keys shared by each group of query
    heads, causal softmax, dense; the block's MLP (GELU) in parallel or after the
    attention, as the config says."""
    c = model.config
    p = {k: v.double() for k, v in model.state_dict().items()}
    heads, eps = c.num_attention_heads, c.layer_norm_epsilon
    d = c.hidden_size // heads
    if freq is None:
        freq = c.rope_parameters["rope_theta"] ** (-np.arange(0, d, 2) / d)
    angles = torch.arange(N, dtype=torch.float64)[:, None] * torch.tensor(freq)
    cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()

    def rope(x):
        return x * cos + torch.cat([-x[..., d // 2 :], x[..., : d // 2]], -1) * sin

    h, Xs, Ws = p["word_embeddings.weight"][IDS[0]], [], []
    two_norms = c.new_decoder_architecture and (c.num_ln_in_parallel_attn or 2) == 2
    for i in range(c.num_hidden_layers):
        at = f"h.{i}."
        x = layer_norm(h, p, at + ("ln_attn" if two_norms else "input_layernorm"), eps)
        fused = linear(x, p, at + "self_attention.query_key_value")
        q, k, v = falcon_qkv(fused, c, heads, d)
        group = heads // k.shape[0]
        k, v = k.repeat_interleave(group, 0), v.repeat_interleave(group, 0)
        scores = q @ k.transpose(1, 2) / math.sqrt(d)
        if slopes is None:
            scores = rope(q) @ rope(k).transpose(1, 2) / math.sqrt(d)
        else:
            position = torch.arange(N, dtype=torch.float64)
            scores = scores + torch.tensor(slopes, dtype=torch.float64)[:, None, None] * (
                position / math.sqrt(d)
            )
        w = causal_softmax(scores)
        Xs.append(x.numpy())
        Ws.append(w.numpy())
        attn = linear((w @ v).transpose(0, 1).reshape(N, -1), p, at + "self_attention.dense")
        if c.new_decoder_architecture or c.parallel_attn:
            y = layer_norm(h, p, at + "ln_mlp", eps) if two_norms else x
            residual = h
        else:
            residual = h + attn
            y = layer_norm(residual, p, at + "post_attention_layernorm", eps)
        u = torch.nn.functional.gelu(linear(y, p, at + "mlp.dense_h_to_4h"))
        mlp = linear(u, p, at + "mlp.dense_4h_to_h")
        h = residual + mlp + (attn if c.new_decoder_architecture or c.parallel_attn else 0)
    return Xs, Ws


FALCON_LAYOUTS = {
    "multi-query, parallel": {},
    "per head, sequential": {"multi_query": False, "parallel_attn": False},
    "per head, parallel, no biases": {"multi_query": False, "bias": False},
    "new architecture, GQA": {"new_decoder_architecture": True, "num_kv_heads": 2},
    "new architecture, one LayerNorm": {
        "new_decoder_architecture": True, "num_kv_heads": 1, "num_ln_in_parallel_attn": 1,
    },
}  # fmt: skip


@pytest.mark.parametrize("layout", FALCON_LAYOUTS)
def test_falcon_every_layout_is_exact_in_every_layer(layout):
    model = tiny_falcon(**FALCON_LAYOUTS[layout])
    got = check_every_layer(model, falcon_by_hand(model))
    assert got.scenario.settings.positional == "rope"


PLAIN = 10000.0 ** (-np.arange(0, 16, 2) / 16)  # d = 16: eight pairs, wavelengths 6 to 3,500
FALCON_ROPES = {
    "linear": ({"rope_type": "linear", "factor": 4.0}, PLAIN / 4.0),
    "llama3": (
        {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
         "original_max_position_embeddings": 64},
        llama3_frequencies(10000.0 ** (-np.arange(0, 16, 2) / 16), 8.0, 1.0, 4.0, 64),
    ),
}  # fmt: skip


@pytest.mark.parametrize("kind", FALCON_ROPES)
def test_falcon_scaled_rope_uses_the_llama_familys_frequencies(kind):
    rope, freq = FALCON_ROPES[kind]
    model = tiny_falcon(num_attention_heads=2, rope_parameters={**rope, "rope_theta": 10000.0})
    assert len(set(freq / PLAIN)) > 1 or kind == "linear"  # llama3: some kept, some divided
    got = check_every_layer(model, falcon_by_hand(model, freq=freq))
    np.testing.assert_allclose(got.scenario.settings.rope_frequencies, freq, rtol=1e-15)


# Falcon's ALiBi is added to the mask as (slope·j)/√d and the scores are Q·Kᵀ/√d: as
# for BLOOM (above), under the causal mask that is −(slope/√d)·|i − j| + (slope/√d)·i,
# a constant per query row that softmax cancels; the slopes attnviz gets are slope/√d.


@pytest.mark.parametrize(
    ("heads", "options"),
    [
        (6, {"multi_query": False, "parallel_attn": False}),
        (8, {}),
        (4, {"new_decoder_architecture": True, "num_kv_heads": 2}),
    ],
)
def test_falcon_alibi_is_exact_in_every_layer(heads, options):
    model = tiny_falcon(alibi=True, num_attention_heads=heads, hidden_size=8 * heads, **options)
    slopes = BLOOM_SLOPES[heads] if heads in BLOOM_SLOPES else [2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8]
    got = check_every_layer(model, falcon_by_hand(model, slopes=slopes))
    s = got.scenario.settings
    assert s.positional == "alibi"
    np.testing.assert_allclose(s.alibi_slopes, np.array(slopes) / math.sqrt(8), rtol=1e-15)


def test_falcon_alibi_beyond_position_256_is_refused():
    # 2^-3 · 257 needs 9 significant bits: transformers' bfloat16 product rounds it
    model = tiny_falcon(alibi=True)
    ids = torch.randint(3, 19, (1, 258))
    with pytest.raises(ScenarioError, match="Falcon alibi over 258 tokens is not supported"):
        import_layer(model, ids, 0, tuple(f"t{i}" for i in range(258)))
    got = import_layer(model, ids[:, :257], 1, tuple(f"t{i}" for i in range(257)))
    assert np.abs(compute(got.scenario).weights - got.model_weights).max() <= EXACT


def test_falcon_float32_imports_within_float32_rounding():
    model = tiny_falcon(torch.float32, new_decoder_architecture=True, num_kv_heads=2)
    for layer in range(2):
        got = import_layer(model, IDS, layer, LABELS)
        r = compute(got.scenario)
        assert np.abs(r.weights - got.model_weights).max() <= 1e-5
        assert np.abs(r.final - got.model_output).max() <= 1e-5


@pytest.mark.parametrize(
    "options", [{"new_decoder_architecture": True, "num_kv_heads": 2}, {"alibi": True}]
)
def test_a_saved_falcon_folder_imports_exactly(tmp_path, options):
    folder = save_model(tiny_falcon(**options), tmp_path / "falcon")
    assert peek(str(folder), TEXT).problem == ""
    model = transformers.AutoModel.from_pretrained(folder, dtype=torch.float64)
    slopes = [2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8] if options.get("alibi") else None
    _, Ws = falcon_by_hand(model.eval(), slopes=slopes)
    for layer in range(2):
        got = import_model_layer(Request(str(folder), TEXT, layer))
        assert got.agreement_weights <= EXACT and got.agreement_output <= EXACT
        np.testing.assert_allclose(got.provenance.model_weights, Ws[layer], rtol=0, atol=EXACT)
    got = import_model_layer(Request(str(folder), TEXT, 1, dtype="float32"))
    assert got.agreement_weights <= 1e-5


FALCON_REFUSED = [
    ({"alibi": True, "num_attention_heads": 16}, "Falcon alibi with 16 heads is not supported"),
    ({"rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}},
     "rope_parameters type 'dynamic' is not supported"),
    ({"rope_scaling": {"type": "yarn", "factor": 2.0}},
     "rope_scaling type 'yarn' is not supported"),
    ({"multi_query": False, "num_kv_heads": 2},
     "Falcon num_kv_heads 2 without new_decoder_architecture or multi_query is not supported"),
]  # fmt: skip


@pytest.mark.parametrize(("changes", "message"), FALCON_REFUSED)
def test_falcon_options_not_modelled_are_refused_by_name_before_loading(tmp_path, changes, message):
    folder = edited(save_model(tiny_falcon(), tmp_path / "falcon"), **changes)
    assert message in peek(str(folder), TEXT).problem
    unreadable_weights(folder)
    with pytest.raises(ScenarioError, match=message):
        import_model_layer(Request(str(folder), TEXT, 0))


def test_falcon_alibi_ignores_rope_settings(tmp_path):
    folder = edited(
        save_model(tiny_falcon(alibi=True), tmp_path / "falcon"),
        rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4},
    )
    assert peek(str(folder), TEXT).problem == ""


def test_imports_on_several_threads_leave_transformers_as_it_was():
    """The BLOOM import swaps two of transformers' module functions while it runs: imports
    on several threads at once (the Python API has no lock of its own) each stay exact, and
    afterwards transformers has its own functions back."""
    from concurrent.futures import ThreadPoolExecutor

    from transformers.models.bloom import modeling_bloom

    own = (modeling_bloom.F, modeling_bloom._get_alibi_slopes)
    models = [tiny_bloom(heads) for heads in (6, 8, 12, 6)]

    def imported(model):
        got = import_layer(model, IDS, 1, LABELS)
        return float(np.abs(compute(got.scenario).weights - got.model_weights).max())

    with ThreadPoolExecutor(4) as pool:
        gaps = list(pool.map(imported, models))
    assert max(gaps) <= 1e-12
    assert (modeling_bloom.F, modeling_bloom._get_alibi_slopes) == own
