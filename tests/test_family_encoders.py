"""The encoders of issue 39: XLM-RoBERTa, CamemBERT, XLM-RoBERTa-XL and ELECTRA in the
BERT family, ModernBERT as its own family, and a T5 option refused by name. Each layer of
a tiny seeded float64 model must import exactly: attnviz's numbers against the model's run and
against a whole forward written out here in float64 from the weights."""

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
from tiny_models import (  # noqa: E402
    WORDS,
    edited,
    layer_exactly,
    unreadable_weights,
    word_tokenizer,
)

from attnviz.core.models.hf_layer import import_layer  # noqa: E402
from attnviz.core.models.importer import Request, import_model_layer, peek  # noqa: E402

EXACT = 1e-12
TEXT = "the cat sat on the mat"
IDS = torch.tensor([[3, 17, 5, 42, 8, 11, 2]])
LABELS = tuple(f"t{i}" for i in range(7))
GELU = torch.nn.functional.gelu  # transformers' "gelu": the exact (erf) one


def randomized(model, seed: int):
    """Every weight drawn afresh: norm weights in 0.5…1.5, biases in −0.5…0.5, the rest
    normal (σ 0.4), so that each one counts and the attention is far from uniform."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, weight in model.named_parameters():
            if "norm" in name.lower() and name.endswith("weight"):
                weight.uniform_(0.5, 1.5)
            elif name.endswith("bias"):
                weight.uniform_(-0.5, 0.5)
            else:
                weight.normal_(0.0, 0.4)
    return model.eval()


def layer_norm(x, weight, bias, eps):
    mean = x.mean(-1, keepdim=True)
    variance = ((x - mean) ** 2).mean(-1, keepdim=True)
    out = (x - mean) / torch.sqrt(variance + eps) * weight
    return out if bias is None else out + bias


def softmax(scores):
    e = torch.exp(scores - scores.max(-1, keepdim=True).values)
    return e / e.sum(-1, keepdim=True)


def own_eager(model, ids=IDS):
    """transformers' own eager attention weights, every layer, unchanged."""
    with torch.no_grad():
        out = model(input_ids=ids, output_attentions=True)
    return [a[0].double().numpy() for a in out.attentions]


def text_ids(bert_style: bool = True):
    ids = [WORDS.index(w) + 3 for w in TEXT.split()]
    return torch.tensor([[1, *ids, 2] if bert_style else ids])


def agrees(model, reference, layers, ids=IDS, labels=LABELS):
    """Every layer: X, attnviz's weights and output, and the model's, against the
    reference (X, weights, attention output per layer) and each other."""
    Xs, Ws, Os = reference
    worst = {"model": 0.0, "by hand": 0.0}
    for layer in range(layers):
        got, r = layer_exactly(model, ids, labels, layer, Xs[layer], Ws[layer])
        np.testing.assert_allclose(r.final, Os[layer], rtol=0, atol=EXACT)
        worst["model"] = max(
            worst["model"],
            np.abs(r.weights - got.model_weights).max(),
            np.abs(r.final - got.model_output).max(),
        )
        worst["by hand"] = max(
            worst["by hand"], np.abs(r.weights - Ws[layer]).max(), np.abs(r.final - Os[layer]).max()
        )
    return worst


# The BERT family's new members

BERTLIKE = {
    "xlm-roberta": ("XLMRobertaConfig", "XLMRobertaModel"),
    "camembert": ("CamembertConfig", "CamembertModel"),
    "xlm-roberta-xl": ("XLMRobertaXLConfig", "XLMRobertaXLModel"),
    "electra": ("ElectraConfig", "ElectraModel"),
}
ROBERTA_POSITIONS = ("xlm-roberta", "camembert", "xlm-roberta-xl")


def bertlike(kind: str, seed: int = 0, **options):
    config_class, model_class = (getattr(transformers, name) for name in BERTLIKE[kind])
    extra = {"embedding_size": 12} if kind == "electra" else {}  # ≠ hidden_size: projected
    config = config_class(
        vocab_size=50, hidden_size=16, num_hidden_layers=3, num_attention_heads=4,
        intermediate_size=32, max_position_embeddings=40, attn_implementation="eager",
        **extra, **options,
    )  # fmt: skip
    torch.manual_seed(seed)
    if kind == "electra":
        model = model_class(config)
    else:
        model = model_class(config, add_pooling_layer=False)
    return randomized(model.double(), seed)


def bertlike_by_hand(model, ids):
    """Each layer's X, attention weights and attention output, in float64 from the
    weights: word + position (RoBERTa's start after the padding index) + token-type
    embeddings, LayerNorm (none in XLM-R-XL), ELECTRA's projection, then per layer Q, K,
    V with biases, softmax(QKᵀ/√d) (causal in a decoder), O; post-norm layers (a
    LayerNorm before attention and before the MLP in XLM-R-XL), GELU MLP."""
    c = model.config
    p = {k: v.double() for k, v in model.state_dict().items()}
    n, heads = ids.shape[1], c.num_attention_heads
    d = c.hidden_size // heads
    kind = c.model_type

    def norm(x, name):
        return layer_norm(x, p[f"{name}.weight"], p[f"{name}.bias"], c.layer_norm_eps)

    def linear(x, name):
        return x @ p[f"{name}.weight"].T + p[f"{name}.bias"]

    if kind in ROBERTA_POSITIONS:  # fairseq: non-padding tokens count from padding_idx + 1
        keep = (ids[0] != c.pad_token_id).long()
        positions = torch.cumsum(keep, 0) * keep + c.pad_token_id
    else:
        positions = torch.arange(n)
    h = (
        p["embeddings.word_embeddings.weight"][ids[0]]
        + p["embeddings.position_embeddings.weight"][positions]
        + p["embeddings.token_type_embeddings.weight"][0]
    )
    pre_norm = kind == "xlm-roberta-xl"
    if not pre_norm:
        h = norm(h, "embeddings.LayerNorm")
    if "embeddings_project.weight" in p:
        h = linear(h, "embeddings_project")
    Xs, Ws, Os = [], [], []
    for i in range(c.num_hidden_layers):
        at = f"encoder.layer.{i}."
        x = norm(h, at + "attention.self_attn_layer_norm") if pre_norm else h
        q, k, v = (
            linear(x, at + f"attention.self.{m}").view(n, heads, d).transpose(0, 1)
            for m in ("query", "key", "value")
        )
        scores = q @ k.transpose(1, 2) / math.sqrt(d)
        if c.is_decoder:
            scores = scores.masked_fill(torch.ones(n, n).triu(1).bool(), -math.inf)
        w = softmax(scores)
        a = linear((w @ v).transpose(0, 1).reshape(n, heads * d), at + "attention.output.dense")
        Xs.append(x.numpy())
        Ws.append(w.numpy())
        Os.append(a.numpy())
        if pre_norm:
            h = h + a
            inner = GELU(linear(norm(h, at + "LayerNorm"), at + "intermediate.dense"))
            h = h + linear(inner, at + "output.dense")
        else:
            h = norm(h + a, at + "attention.output.LayerNorm")
            inner = GELU(linear(h, at + "intermediate.dense"))
            h = norm(h + linear(inner, at + "output.dense"), at + "output.LayerNorm")
    return Xs, Ws, Os


@pytest.mark.parametrize("kind", list(BERTLIKE))
def test_bertlike_every_layer_is_exact_in_float64(kind):
    model = bertlike(kind, seed=3)
    reference = bertlike_by_hand(model, IDS)
    agrees(model, reference, 3)
    own = own_eager(model)
    for layer in range(3):  # transformers' own run, unchanged
        assert np.abs(own[layer] - reference[1][layer]).max() <= 1e-5


@pytest.mark.parametrize("kind", ["xlm-roberta", "electra"])
def test_bertlike_decoder_is_causal_and_exact(kind):
    model = bertlike(kind, seed=4, is_decoder=True)
    reference = bertlike_by_hand(model, IDS)
    agrees(model, reference, 3)
    got = import_layer(model, IDS, 1, LABELS)
    assert got.scenario.settings.mask == "causal"


def test_a_padding_token_in_xlm_roberta_keeps_its_own_position():
    ids = torch.tensor([[3, 1, 5, 42, 1, 11, 2]])  # 1: XLM-R's padding index
    model = bertlike("xlm-roberta", seed=5)
    agrees(model, bertlike_by_hand(model, ids), 3, ids)


@pytest.mark.parametrize("kind", list(BERTLIKE))
def test_bertlike_float32_imports_within_float32_rounding(kind):
    model = bertlike(kind, seed=6).float()
    for layer in range(3):
        got = import_layer(model, IDS, layer, LABELS)
        r = compute(got.scenario)
        assert np.abs(r.weights - got.model_weights).max() <= 1e-5
        assert np.abs(r.final - got.model_output).max() <= 1e-5


def save_bertlike(kind, folder):
    folder.mkdir(parents=True, exist_ok=True)
    bertlike(kind, seed=7).float().save_pretrained(folder)
    word_tokenizer(True).save(str(folder / "tokenizer.json"))
    return folder


@pytest.mark.parametrize("kind", list(BERTLIKE))
def test_a_saved_bertlike_folder_imports_exactly(tmp_path, kind):
    folder = save_bertlike(kind, tmp_path / kind)
    loaded = transformers.AutoModel.from_pretrained(
        folder, dtype=torch.float64, attn_implementation="eager"
    ).eval()
    Xs, Ws, _ = bertlike_by_hand(loaded, text_ids())
    for layer in range(3):
        got = import_model_layer(Request(str(folder), TEXT, layer))
        assert got.agreement_weights <= EXACT and got.agreement_output <= EXACT
        np.testing.assert_allclose(got.scenario.X, Xs[layer], rtol=0, atol=EXACT)
        np.testing.assert_allclose(got.provenance.model_weights, Ws[layer], rtol=0, atol=EXACT)
    got = import_model_layer(Request(str(folder), TEXT, 2, dtype="float32"))
    assert got.agreement_weights <= 1e-5 and got.agreement_output <= 1e-5


@pytest.mark.parametrize(
    ("kind", "most"), [("xlm-roberta", 38), ("camembert", 38), ("electra", 40)]
)
def test_roberta_positions_leave_room_for_the_padding_offset(tmp_path, kind, most):
    folder = save_bertlike(kind, tmp_path / kind)
    assert peek(str(folder), TEXT).max_tokens == most


NAMES = {"xlm-roberta": "XLM-RoBERTa", "camembert": "CamemBERT",
         "xlm-roberta-xl": "XLM-RoBERTa-XL", "electra": "ELECTRA"}  # fmt: skip


@pytest.mark.parametrize("kind", list(BERTLIKE))
@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"position_embedding_type": "relative_key"}, "{} relative_key position embeddings"),
        ({"is_decoder": True, "add_cross_attention": True}, "{} add_cross_attention"),
    ],
)
def test_bertlike_options_are_refused_by_name_before_loading(tmp_path, kind, change, message):
    folder = edited(save_bertlike(kind, tmp_path / kind), **change)
    expected = message.format(NAMES[kind])
    assert expected in peek(str(folder), "the cat").problem
    unreadable_weights(folder)
    with pytest.raises(ScenarioError, match=expected):
        import_model_layer(Request(str(folder), TEXT, 0))


# ModernBERT

GLOBAL_THETA, LOCAL_THETA = 40_000.0, 500.0


def modernbert(seed: int = 0, **options):
    config = transformers.ModernBertConfig(**{
        "vocab_size": 50, "hidden_size": 16, "intermediate_size": 24, "num_hidden_layers": 4,
        "num_attention_heads": 2, "max_position_embeddings": 64,
        "global_attn_every_n_layers": 2, "local_attention": 4,
        "global_rope_theta": GLOBAL_THETA, "local_rope_theta": LOCAL_THETA,
        "attention_bias": True, "norm_bias": True, "mlp_bias": True, "pad_token_id": 0,
        "bos_token_id": 1, "eos_token_id": 2, "cls_token_id": 1, "sep_token_id": 2,
        "attn_implementation": "eager", **options,
    })  # fmt: skip
    torch.manual_seed(seed)
    return randomized(transformers.ModernBertModel(config).double(), seed)


def modernbert_by_hand(model, ids, thetas=(GLOBAL_THETA, LOCAL_THETA), half_width=2):
    """Each layer's X, attention weights and attention output, in float64 from the
    weights: token embeddings, LayerNorm; per layer a LayerNorm (none in layer 0), the
    fused QKV with its bias, RoPE (half-split pairs, base^(−2i/d)) with the global base in
    layers 0, 2, … and the local one in 1, 3, …, where a query sees only keys within
    ``half_width`` either side; softmax(QKᵀ/√d), O; then LayerNorm and a GELU-gated MLP."""
    c = model.config
    p = {k: v.double() for k, v in model.state_dict().items()}
    n, heads = ids.shape[1], c.num_attention_heads
    d = c.hidden_size // heads

    def norm(x, name):
        return layer_norm(x, p[f"{name}.weight"], p.get(f"{name}.bias"), c.norm_eps)

    def linear(x, name):
        bias = p.get(f"{name}.bias")
        return x @ p[f"{name}.weight"].T + (0 if bias is None else bias)

    def rope(x, theta):
        angles = torch.arange(n, dtype=torch.float64)[:, None] * theta ** (
            -torch.arange(0, d, 2, dtype=torch.float64) / d
        )
        cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()
        return x * cos + torch.cat([-x[..., d // 2 :], x[..., : d // 2]], -1) * sin

    far = (torch.arange(n)[:, None] - torch.arange(n)[None, :]).abs() > half_width
    h = norm(p["embeddings.tok_embeddings.weight"][ids[0]], "embeddings.norm")
    Xs, Ws, Os = [], [], []
    for i in range(c.num_hidden_layers):
        at = f"layers.{i}."
        local = i % 2 == 1
        x = h if i == 0 else norm(h, at + "attn_norm")
        qkv = linear(x, at + "attn.Wqkv").view(n, 3, heads, d).permute(1, 2, 0, 3)
        theta = thetas[1] if local else thetas[0]
        q, k, v = rope(qkv[0], theta), rope(qkv[1], theta), qkv[2]
        scores = q @ k.transpose(1, 2) / math.sqrt(d)
        if local:
            scores = scores.masked_fill(far, -math.inf)
        w = softmax(scores)
        a = linear((w @ v).transpose(0, 1).reshape(n, heads * d), at + "attn.Wo")
        Xs.append(x.numpy())
        Ws.append(w.numpy())
        Os.append(a.numpy())
        h = h + a
        gate_in, gate = linear(norm(h, at + "mlp_norm"), at + "mlp.Wi").chunk(2, -1)
        h = h + linear(GELU(gate_in) * gate, at + "mlp.Wo")
    return Xs, Ws, Os


def test_modernbert_every_layer_is_exact_in_float64():
    model = modernbert(seed=8)
    reference = modernbert_by_hand(model, IDS)
    agrees(model, reference, 4)
    for layer in (1, 3):  # the local layers: the band, and nothing outside it
        weights = reference[1][layer]
        assert np.all(weights[:, 0, 3:] == 0) and np.all(weights[:, 0, :3] > 0)
    own = own_eager(model)  # transformers' own run: angles and rotation in float32
    for layer in range(4):
        assert np.abs(own[layer] - reference[1][layer]).max() <= 1e-5


def test_modernbert_without_biases_and_with_an_odd_window():
    model = modernbert(seed=9, attention_bias=False, norm_bias=False, local_attention=5)
    reference = modernbert_by_hand(model, IDS, half_width=2)  # 5 // 2
    agrees(model, reference, 4)


def test_modernbert_layer_types_choose_the_local_layers():
    types = ["full_attention", "sliding_attention", "full_attention", "sliding_attention"]
    model = modernbert(seed=10, layer_types=types)
    agrees(model, modernbert_by_hand(model, IDS), 4)
    got = import_layer(model, IDS, 3, LABELS)
    assert got.scenario.settings.mask == "custom"
    assert import_layer(model, IDS, 2, LABELS).scenario.settings.mask == "none"


def test_modernbert_float32_imports_within_float32_rounding():
    model = modernbert(seed=11).float()
    for layer in range(4):
        got = import_layer(model, IDS, layer, LABELS)
        r = compute(got.scenario)
        assert np.abs(r.weights - got.model_weights).max() <= 1e-5
        assert np.abs(r.final - got.model_output).max() <= 1e-5


def save_modernbert(folder):
    folder.mkdir(parents=True, exist_ok=True)
    modernbert(seed=12).float().save_pretrained(folder)
    word_tokenizer(True).save(str(folder / "tokenizer.json"))
    return folder


def test_a_saved_modernbert_folder_imports_exactly(tmp_path):
    folder = save_modernbert(tmp_path / "modernbert")
    config = json.loads((folder / "config.json").read_text())
    assert config["rope_parameters"]["sliding_attention"]["rope_theta"] == LOCAL_THETA
    loaded = transformers.AutoModel.from_pretrained(
        folder, dtype=torch.float64, attn_implementation="eager"
    ).eval()
    Xs, Ws, _ = modernbert_by_hand(loaded, text_ids())
    for layer in range(4):
        got = import_model_layer(Request(str(folder), TEXT, layer))
        assert got.agreement_weights <= EXACT and got.agreement_output <= EXACT
        np.testing.assert_allclose(got.scenario.X, Xs[layer], rtol=0, atol=EXACT)
        np.testing.assert_allclose(got.provenance.model_weights, Ws[layer], rtol=0, atol=EXACT)
    got = import_model_layer(Request(str(folder), TEXT, 1, dtype="float32"))
    assert got.agreement_weights <= 1e-5 and got.agreement_output <= 1e-5


def test_a_modernbert_config_json_of_transformers_4_imports_exactly(tmp_path):
    """ModernBERT's published config.json names the bases and the global layers the
    transformers 4 way: global_rope_theta, local_rope_theta, global_attn_every_n_layers."""
    folder = save_modernbert(tmp_path / "modernbert")
    config = json.loads((folder / "config.json").read_text())
    for key in ("rope_parameters", "layer_types"):
        del config[key]
    (folder / "config.json").write_text(json.dumps(config))
    edited(folder, global_rope_theta=900.0, local_rope_theta=30.0, global_attn_every_n_layers=2)
    loaded = transformers.AutoModel.from_pretrained(
        folder, dtype=torch.float64, attn_implementation="eager"
    ).eval()
    _, Ws, _ = modernbert_by_hand(loaded, text_ids(), thetas=(900.0, 30.0))
    for layer in range(4):
        got = import_model_layer(Request(str(folder), TEXT, layer))
        assert got.agreement_weights <= EXACT and got.agreement_output <= EXACT
        assert got.scenario.settings.rope_base == (30.0 if layer % 2 else 900.0)
        np.testing.assert_allclose(got.provenance.model_weights, Ws[layer], rtol=0, atol=EXACT)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"rope_parameters": {
                "full_attention": {"rope_type": "default", "rope_theta": 1e4},
                "sliding_attention": {"rope_type": "yarn", "factor": 2.0, "rope_theta": 1e4},
            }},
            "ModernBERT rope_parameters type 'yarn' is not supported",
        ),
        (
            {"layer_types": ["full_attention", "chunked_attention"] * 2},
            "ModernBERT layer type 'chunked_attention' is not supported",
        ),
        ({"head_dim": 4}, "ModernBERT head_dim 4"),
    ],
)  # fmt: skip
def test_modernbert_options_are_refused_by_name_before_loading(tmp_path, change, message):
    folder = edited(save_modernbert(tmp_path / "modernbert"), **change)
    assert message in peek(str(folder), "the cat").problem
    unreadable_weights(folder)
    with pytest.raises(ScenarioError, match=message):
        import_model_layer(Request(str(folder), TEXT, 0))


# T5 and its kin: an option the import does not model, refused by name (the family is
# tested in test_family_t5.py)


@pytest.mark.parametrize("model_type", ["t5", "mt5", "umt5"])
def test_a_t5_option_is_refused_by_name_before_loading(tmp_path, model_type):
    folder = tmp_path / model_type
    folder.mkdir()
    config = transformers.T5Config(
        vocab_size=50, d_model=16, d_kv=4, d_ff=32, num_layers=2, num_heads=4
    ).to_dict()
    config |= {"model_type": model_type, "relative_attention_max_distance": 8}
    (folder / "config.json").write_text(json.dumps(config))
    word_tokenizer(False).save(str(folder / "tokenizer.json"))
    unreadable_weights(folder)
    message = "relative_attention_max_distance 8 is not supported"
    assert message in peek(str(folder), "the cat").problem
    with pytest.raises(ScenarioError, match=message):
        import_model_layer(Request(str(folder), TEXT, 0))
