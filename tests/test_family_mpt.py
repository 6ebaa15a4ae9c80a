"""MPT: each layer imported exactly in float64 (against the model's run and against a
forward of the whole model written out here in float64), transformers' own run within
float32 rounding, a float32 model, a saved folder, and every option that is not
modelled refused by name from config.json before any weight is read."""

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
from tiny_models import WORDS, layer_exactly, save_model, unreadable_weights  # noqa: E402

from attnviz.core.models.hf_layer import import_layer  # noqa: E402
from attnviz.core.models.importer import Request, import_model_layer, peek  # noqa: E402

EXACT = 1e-12
TEXT = "the cat sat on the mat and it ran"
IDS = torch.tensor([[WORDS.index(w) + 3 for w in TEXT.split()]])  # as the folders' tokenizer
N = IDS.shape[1]
LABELS = tuple(f"t{i}" for i in range(N))
CAUSAL = torch.ones(N, N).triu(1).bool()
LAYERS = 3

# MPT's slopes, written out: P is the next power of two at or above the head count; the
# P candidates are 2^(−k·8/P) for k = 1…P; when P is more than the heads, the even k come
# first, then the odd k, and the first (heads) of them are the slopes.
MPT_SLOPES = {
    # P = 8: 2^(−k)
    8: [2.0**-k for k in range(1, 9)],
    # P = 8, even k then odd k: 2, 4, 6, 8, 1, 3
    6: [2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8, 2.0**-1, 2.0**-3],
    # P = 8: 2, 4, 6, 8, 1
    5: [2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8, 2.0**-1],
    # P = 16: 2^(−k/2); even k = 2…16 give 2^(−1)…2^(−8), then k = 1, 3, 5, 7
    12: [*(2.0**-k for k in range(1, 9)), *(2.0 ** (-k / 2) for k in (1, 3, 5, 7))],
}


def tiny_mpt(heads=6, dtype=torch.float64, max_seq_len=16, **attn):
    config = transformers.MptConfig(
        vocab_size=50, d_model=4 * heads, n_heads=heads, n_layers=LAYERS,
        max_seq_len=max_seq_len, attn_config=attn,
    )  # fmt: skip
    torch.manual_seed(6)
    model = transformers.MptModel(config)
    with torch.no_grad():  # MPT has no biases; every LayerNorm weight away from 1
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    return model.to(dtype).eval()


def layer_norm(x, weight, eps):
    """torch's LayerNorm without a bias (MPT's)."""
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * weight


def mpt_by_hand(model, slopes, scale=None):
    """Each layer's X and weights, in float64 from the model's weights: the token
    embeddings; per layer a LayerNorm, Wqkv's rows as Q (every head), K, V, scores
    Q·Kᵀ·scale (1/√d unless given) + slope·(j − n + 1) for key j (MPT's ALiBi: its
    tensor's last n of max_seq_len positions, 1 − L … 0), causal softmax, out_proj, the
    residual, a LayerNorm and the MLP (exact GELU), the residual."""
    c = model.config
    p = {k: v.double() for k, v in model.state_dict().items()}
    heads, eps = c.n_heads, c.layer_norm_epsilon
    d = c.d_model // heads
    scale = 1 / math.sqrt(d) if scale is None else scale
    alibi = torch.tensor(slopes, dtype=torch.float64)[:, None, None] * (
        torch.arange(N, dtype=torch.float64) - N + 1
    )
    h = p["wte.weight"][IDS[0]]
    Xs, Ws = [], []
    for i in range(c.n_layers):
        at = f"blocks.{i}."
        x = layer_norm(h, p[at + "norm_1.weight"], eps)
        qkv = (x @ p[at + "attn.Wqkv.weight"].T).view(N, 3, heads, d)
        q, k, v = (qkv[:, t].transpose(0, 1) for t in range(3))
        scores = q @ k.transpose(1, 2) * scale + alibi
        w = scores.masked_fill(CAUSAL, -math.inf).softmax(-1)
        Xs.append(x.numpy())
        Ws.append(w.numpy())
        h = h + (w @ v).transpose(0, 1).reshape(N, -1) @ p[at + "attn.out_proj.weight"].T
        y = layer_norm(h, p[at + "norm_2.weight"], eps)
        u = torch.nn.functional.gelu(y @ p[at + "ffn.up_proj.weight"].T)
        h = h + u @ p[at + "ffn.down_proj.weight"].T
    return Xs, Ws


def own_weights(model):
    with torch.no_grad():
        return [a[0].numpy() for a in model(input_ids=IDS, output_attentions=True).attentions]


def check_every_layer(model, reference):
    """attnviz against the model's run and against the forward written out, every layer;
    transformers' own unchanged run within float32 rounding of the latter."""
    Xs, Ws = reference
    own = own_weights(model)
    worst = {"model": 0.0, "by hand": 0.0, "own": 0.0}
    for layer in range(LAYERS):
        got, r = layer_exactly(model, IDS, LABELS, layer, Xs[layer], Ws[layer])
        assert np.abs(own[layer] - Ws[layer]).max() < 1e-5
        worst["model"] = max(worst["model"], float(np.abs(r.weights - got.model_weights).max()))
        worst["by hand"] = max(worst["by hand"], float(np.abs(r.weights - Ws[layer]).max()))
        worst["own"] = max(worst["own"], float(np.abs(own[layer] - Ws[layer]).max()))
    print(worst)
    return got


# MPT's scores are Q·Kᵀ·scale + slope·(j − n + 1) (j the key's position, n the text's
# length), attnviz's ALiBi is Q·Kᵀ·scale − slope·|i − j|. Under the causal mask only keys
# j ≤ i are seen, where −slope·|i − j| = slope·j − slope·i = slope·(j − n + 1) −
# slope·(i − n + 1): the two rows of scores differ by slope·(i − n + 1), the same for
# every key of query i. softmax(s + c) = softmax(s), so the weights, and every product of
# them, are the same. The forward above is written MPT's way and checked against
# attnviz's.


@pytest.mark.parametrize("heads", [5, 6, 8, 12])
def test_mpt_every_layer_is_exact_with_its_own_slopes(heads):
    model = tiny_mpt(heads)
    got = check_every_layer(model, mpt_by_hand(model, MPT_SLOPES[heads]))
    s = got.scenario.settings
    assert s.positional == "alibi" and s.mask == "causal" and s.scale_value is None
    np.testing.assert_allclose(s.alibi_slopes, MPT_SLOPES[heads], rtol=1e-15)
    # the model's mask fills float64's lowest number, not −∞: every later key gets exactly 0
    assert np.all(got.model_weights[np.broadcast_to(CAUSAL.numpy(), got.model_weights.shape)] == 0)


def test_mpt_softmax_scale_is_the_scale():
    model = tiny_mpt(6, softmax_scale=0.3)
    got = check_every_layer(model, mpt_by_hand(model, MPT_SLOPES[6], scale=0.3))
    assert got.scenario.settings.scale_value == 0.3


def test_the_import_leaves_the_model_as_it_was():
    model = tiny_mpt(12)
    before = own_weights(model)
    import_layer(model, IDS, 1, LABELS)
    for a, b in zip(before, own_weights(model), strict=True):
        assert np.array_equal(a, b)


def test_a_text_as_long_as_max_seq_len_is_exact_and_a_longer_one_refused():
    model = tiny_mpt(6, max_seq_len=N)
    check_every_layer(model, mpt_by_hand(model, MPT_SLOPES[6]))
    short = tiny_mpt(6, max_seq_len=N - 1)
    with pytest.raises(ScenarioError, match=f"MPT over {N} tokens is not supported"):
        import_layer(short, IDS, 0, LABELS)


def test_mpt_float32_imports_within_float32_rounding():
    model = tiny_mpt(12, torch.float32)
    for layer in range(LAYERS):
        got = import_layer(model, IDS, layer, LABELS)
        r = compute(got.scenario)
        assert np.abs(r.weights - got.model_weights).max() <= 1e-5
        assert np.abs(r.final - got.model_output).max() <= 1e-5


def edited(folder, attn=None, **changes):
    """config.json with top-level ``changes`` and ``attn`` merged into attn_config."""
    config = json.loads((folder / "config.json").read_text())
    config = {**config, **changes}
    config["attn_config"] = {**(config.get("attn_config") or {}), **(attn or {})}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_a_saved_mpt_folder_imports_exactly(tmp_path):
    folder = save_model(tiny_mpt(12, softmax_scale=0.25), tmp_path / "mpt")
    # switches that change nothing here: the same maths, one sequence, no positions, a
    # cache of keys and values filled on the way
    edited(
        folder,
        {"attn_impl": "triton", "attn_uses_sequence_id": True},
        learned_pos_emb=True,
        use_cache=True,
    )
    looked = peek(str(folder), TEXT)
    assert looked.problem == "" and looked.max_tokens == 16  # its max_seq_len
    model = transformers.AutoModel.from_pretrained(folder, dtype=torch.float64)
    _, Ws = mpt_by_hand(model.eval(), MPT_SLOPES[12], scale=0.25)
    for layer in range(LAYERS):
        got = import_model_layer(Request(str(folder), TEXT, layer))
        assert got.agreement_weights <= EXACT and got.agreement_output <= EXACT
        np.testing.assert_allclose(got.provenance.model_weights, Ws[layer], rtol=0, atol=EXACT)
    got = import_model_layer(Request(str(folder), TEXT, 1, dtype="float32"))
    assert got.agreement_weights <= 1e-5


MPT_REFUSED = [
    ({"clip_qkv": 6.0}, {}, "MPT attn_config clip_qkv 6.0 is not supported"),
    ({"qk_ln": True}, {}, "MPT attn_config qk_ln True is not supported"),
    ({"prefix_lm": True}, {}, "MPT attn_config prefix_lm True is not supported"),
    ({"attn_type": "multiquery_attention"}, {},
     "MPT attn_type 'multiquery_attention' is not supported"),
    ({"alibi": False}, {}, "MPT alibi false is not supported"),
    ({"alibi_bias_max": 16}, {}, "MPT alibi_bias_max 16 is not supported"),
    ({"softmax_scale": -1.0}, {}, "MPT softmax_scale -1.0 is not supported"),
    # llm-foundry's switches, which transformers' MPT does not read
    ({"rope": True}, {}, "MPT attn_config rope True is not supported"),
    ({"sliding_window_size": 4}, {}, "MPT attn_config sliding_window_size 4 is not supported"),
    ({"attn_logit_softcapping": 30.0}, {},
     "MPT attn_config attn_logit_softcapping 30.0 is not supported"),
    ({"qk_gn": True}, {}, "MPT attn_config qk_gn True is not supported"),
    ({"fused_qkv": False}, {}, "MPT attn_config fused_qkv False is not supported"),
    ({}, {"no_bias": False}, "MPT no_bias false is not supported"),
    ({}, {"block_overrides": {"order": [{"name": "default"}]}},
     "MPT block_overrides is not supported"),
]  # fmt: skip


@pytest.mark.parametrize(("attn", "changes", "message"), MPT_REFUSED)
def test_mpt_options_not_modelled_are_refused_by_name_before_loading(
    tmp_path, attn, changes, message
):
    folder = edited(save_model(tiny_mpt(6), tmp_path / "mpt"), attn, **changes)
    assert message in peek(str(folder), TEXT).problem
    unreadable_weights(folder)
    with pytest.raises(ScenarioError, match=message):
        import_model_layer(Request(str(folder), TEXT, 0))


def test_neutral_values_of_the_refused_switches_are_accepted(tmp_path):
    off = {
        "clip_qkv": None, "qk_ln": False, "prefix_lm": False, "rope": False,
        "sliding_window_size": -1, "fused_qkv": True, "alibi_bias_max": 8,
    }  # fmt: skip
    folder = edited(save_model(tiny_mpt(6), tmp_path / "mpt"), off, no_bias=True)
    assert peek(str(folder), TEXT).problem == ""
