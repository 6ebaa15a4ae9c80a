"""BLOOM and Falcon: each layer imported exactly in float64 (against the model's run and
against a forward of the whole model written out here in float64), transformers' own
run within float32 rounding, a float32 model, a saved folder, and every option that is
not modelled refused by name from config.json before any weight is read."""

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
from tiny_models import WORDS, word_tokenizer  # noqa: E402

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


def save(model, folder):
    folder.mkdir(parents=True, exist_ok=True)
    model.float().save_pretrained(folder)
    word_tokenizer(False).save(str(folder / "tokenizer.json"))
    return folder


def edited(folder, **changes):
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **changes}))
    return folder


def unreadable_weights(folder) -> None:
    (folder / "model.safetensors").write_bytes(b"never read")


def check_every_layer(model, reference):
    """attnviz against the model's run and against the forward written out, every layer;
    transformers' own unchanged run within float32 rounding of the latter."""
    Xs, Ws = reference
    with torch.no_grad():
        own = [a[0].numpy() for a in model(input_ids=IDS, output_attentions=True).attentions]
    worst = {"model": 0.0, "by hand": 0.0, "own": 0.0}
    for layer in range(model.config.num_hidden_layers):
        got = import_layer(model, IDS, layer, LABELS)
        r = compute(got.scenario)
        np.testing.assert_allclose(got.scenario.X, Xs[layer], rtol=0, atol=EXACT)
        np.testing.assert_allclose(r.weights, got.model_weights, rtol=0, atol=EXACT)
        np.testing.assert_allclose(r.final, got.model_output, rtol=0, atol=EXACT)
        np.testing.assert_allclose(r.weights, Ws[layer], rtol=0, atol=EXACT)
        np.testing.assert_allclose(got.model_weights, Ws[layer], rtol=0, atol=EXACT)
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
    folder = edited(save(tiny_bloom(6), tmp_path / "bloom"), pretraining_tp=2, slow_but_exact=True)
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
    folder = save(tiny_bloom(12), tmp_path / "bloom")
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
