"""The T5 family (T5, mT5, UMT5): the encoder's self-attention with T5's learned,
bucketed relative position bias. Each encoder layer of a tiny seeded float64 model must
import exactly: attnviz's numbers against the model's run, and against a whole forward of
the encoder written out here in float64 from the weights (RMS norms without a mean, no
score scale, layer 0's table in every layer of T5 and mT5, each layer's own in UMT5)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from attnviz.core.maths.forward import compute
from attnviz.core.maths.scenario import ScenarioError

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from offline_hub import offline  # noqa: E402, F401  (autouse)
from safetensors.torch import load_file, save_file  # noqa: E402
from tiny_models import edited, word_tokenizer  # noqa: E402
from variant_reference import t5_bucket  # noqa: E402

from attnviz.cli import main  # noqa: E402
from attnviz.core.io.layers_files import load_layers  # noqa: E402
from attnviz.core.models.hf_layer import import_layer  # noqa: E402
from attnviz.core.models.importer import Request, import_model_layer, peek  # noqa: E402

EXACT = 1e-12
TEXT = "the big dog ran to the red house and it was small"
IDS = torch.tensor([[3, 17, 5, 42, 8, 11, 2, 30, 9]])
LABELS = tuple(f"t{i}" for i in range(9))
KINDS = ("t5", "mt5", "umt5")
CLASSES = {
    "t5": ("T5Config", "T5EncoderModel", "T5Model"),
    "mt5": ("MT5Config", "MT5EncoderModel", "MT5Model"),
    "umt5": ("UMT5Config", "UMT5EncoderModel", "UMT5Model"),
}


def tiny_config(kind: str, **changes):
    """3 encoder layers (2 decoder layers), 4 heads of d_kv 6 over d_model 16 (so the
    heads' width is not d_model's), 8 buckets (2 exact distances a direction) up to
    distance 6: the 9 tokens reach every bucket."""
    options = {
        "vocab_size": 50,
        "d_model": 16,
        "d_kv": 6,
        "d_ff": 24,
        "num_layers": 3,
        "num_decoder_layers": 2,
        "num_heads": 4,
        "relative_attention_num_buckets": 8,
        "relative_attention_max_distance": 6,
        "feed_forward_proj": "gated-gelu" if kind != "t5" else "relu",
        "layer_norm_epsilon": 1e-5,
        "dropout_rate": 0.0,
        "attn_implementation": "eager",
        **changes,
    }
    return getattr(transformers, CLASSES[kind][0])(**options)


def seeded(model):
    """Every weight random, the norms' and the bias tables' too, so that each counts."""
    torch.manual_seed(3)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "layer_norm" in name:
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
            elif "relative_attention_bias" in name:
                p.copy_(torch.randn_like(p))
            else:
                p.copy_(0.4 * torch.randn_like(p))
    return model.eval()


def tiny_t5(kind: str = "t5", dtype=torch.float64, whole: bool | str = False, **changes):
    """A seeded encoder model (whole: the encoder-decoder model, or the class named) of
    the kind."""
    config = tiny_config(kind, **changes)
    name = whole if isinstance(whole, str) else CLASSES[kind][2 if whole else 1]
    return seeded(getattr(transformers, name)(config)).to(dtype)


def by_hand(model, ids):
    """Each layer's X (its normed input), attention weights and attention output, written
    out here in float64 from the model's weights: embeddings; per layer an RMS norm
    (no mean), Q, K, V without biases, scores Q Kᵀ (no scale) plus the table's entry of
    the bucket of j − i (layer 0's table, or the layer's own in UMT5), softmax, O; the
    residual; the feed-forward (ReLU, or gated GELU) after its own norm."""
    c = model.config
    p = {k: v.double() for k, v in model.state_dict().items()}
    n, heads, d = ids.shape[1], c.num_heads, c.d_kv
    eps = c.layer_norm_epsilon

    def rms(x, w):
        return w * (x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps))

    def gelu_new(x):
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))

    buckets = torch.tensor(
        [
            [t5_bucket(j - i, True, c.relative_attention_num_buckets,
                       c.relative_attention_max_distance) for j in range(n)]
            for i in range(n)
        ]
    )  # fmt: skip
    h = p["shared.weight"][ids[0]]
    layers = []
    for k in range(c.num_layers):
        pre = f"encoder.block.{k}.layer."
        X = rms(h, p[pre + "0.layer_norm.weight"])
        own = f"{pre}0.SelfAttention.relative_attention_bias.weight"
        table = (
            p[own]
            if own in p
            else p["encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"]
        )
        Q, K, V = (
            (X @ p[f"{pre}0.SelfAttention.{x}.weight"].T).view(n, heads, d).transpose(0, 1)
            for x in "qkv"
        )
        S = Q @ K.transpose(1, 2) + table[buckets].permute(2, 0, 1)
        W = torch.softmax(S, dim=-1)
        out = (W @ V).transpose(0, 1).reshape(n, heads * d) @ p[f"{pre}0.SelfAttention.o.weight"].T
        layers.append((X.numpy(), W.numpy(), out.numpy()))
        h = h + out
        x = rms(h, p[pre + "1.layer_norm.weight"])
        if c.is_gated_act:
            hidden = gelu_new(x @ p[pre + "1.DenseReluDense.wi_0.weight"].T) * (
                x @ p[pre + "1.DenseReluDense.wi_1.weight"].T
            )
        else:
            hidden = torch.relu(x @ p[pre + "1.DenseReluDense.wi.weight"].T)
        h = h + hidden @ p[pre + "1.DenseReluDense.wo.weight"].T
    return layers


def own_eager(model, ids=IDS):
    """transformers' own eager attention weights, every layer, the model unchanged."""
    with torch.no_grad():
        return [
            a[0].double().numpy() for a in model(input_ids=ids, output_attentions=True).attentions
        ]


# Each layer, exactly -------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_every_encoder_layer_imports_exactly_and_equals_the_forward_by_hand(kind):
    model = tiny_t5(kind)
    reference = by_hand(model, IDS)
    own = own_eager(model)
    for layer in range(3):
        got = import_layer(model, IDS, layer, LABELS)
        s, r = got.scenario, compute(got.scenario)
        X, W, out = reference[layer]
        np.testing.assert_allclose(r.weights, got.model_weights, rtol=0, atol=EXACT)
        np.testing.assert_allclose(r.final, got.model_output, rtol=0, atol=EXACT)
        np.testing.assert_allclose(s.X, X, rtol=0, atol=EXACT)
        np.testing.assert_allclose(r.weights, W, rtol=0, atol=EXACT)
        np.testing.assert_allclose(r.final, out, rtol=0, atol=EXACT)
        # transformers' own (its norms' mean square in float32): within 1e-5
        np.testing.assert_allclose(own[layer], W, rtol=0, atol=1e-5)
        st = s.settings
        assert (st.positional, st.scale, st.mask) == ("relative-bias", False, "none")
        assert (st.relative_buckets, st.relative_max_distance) == (8, 6)
        assert st.relative_bidirectional and (s.n_heads, s.d_k, s.d_model) == (4, 6, 16)
        assert not s.b_Q.any() and not s.b_O.any()


def test_t5_layers_share_layer_0s_table_and_umt5_layers_have_their_own():
    for kind, shared in (("t5", True), ("mt5", True), ("umt5", False)):
        model = tiny_t5(kind)
        tables = [import_layer(model, IDS, k, LABELS).scenario.relative_bias for k in range(3)]
        assert np.array_equal(tables[0], tables[2]) == shared, kind
        assert tables[0].shape == (8, 4)


def test_a_whole_encoder_decoder_model_imports_its_encoder():
    whole, encoder = tiny_t5("t5", whole=True), tiny_t5("t5")
    encoder.load_state_dict(whole.state_dict(), strict=False)
    for layer in range(3):
        a = import_layer(whole, IDS, layer, LABELS)
        b = import_layer(encoder, IDS, layer, LABELS)
        np.testing.assert_array_equal(a.model_weights, b.model_weights)


@pytest.mark.parametrize("kind", KINDS)
def test_a_float32_model_agrees_to_float32_rounding(kind):
    model = tiny_t5(kind, torch.float32)
    for layer in range(3):
        got = import_layer(model, IDS, layer, LABELS)
        r = compute(got.scenario)
        np.testing.assert_allclose(r.weights, got.model_weights, rtol=0, atol=1e-5)
        np.testing.assert_allclose(r.final, got.model_output, rtol=0, atol=1e-5)


def test_long_texts_reach_the_logarithmic_buckets_of_t5s_defaults():
    """32 buckets up to distance 128 (T5's defaults) over 40 tokens: buckets past the
    8 exact ones, the same as the model's."""
    model = tiny_t5("t5", relative_attention_num_buckets=32, relative_attention_max_distance=128)
    ids = torch.tensor([[3 + (7 * i) % 45 for i in range(40)]])
    got = import_layer(model, ids, 1, tuple(f"t{i}" for i in range(40)))
    np.testing.assert_allclose(compute(got.scenario).weights, got.model_weights, rtol=0, atol=EXACT)
    np.testing.assert_allclose(by_hand(model, ids)[1][1], got.model_weights, rtol=0, atol=EXACT)


# Saved folders: the importer, the CLI ----------------------------------------------------------


def save_t5(folder, kind="t5", whole: bool | str = True, **changes):
    """A float32 checkpoint (the encoder-decoder model's, the encoder's alone, or the
    class named's) and a word-level tokenizer."""
    folder.mkdir(parents=True, exist_ok=True)
    tiny_t5(kind, torch.float32, whole=whole, **changes).save_pretrained(folder)
    word_tokenizer(False).save(str(folder / "tokenizer.json"))
    return folder


SAVED = [("t5", True), ("t5", False), ("mt5", True), ("umt5", True),
         ("t5", "T5ForConditionalGeneration")]  # fmt: skip


@pytest.mark.parametrize(("kind", "whole"), SAVED)
def test_a_saved_folder_imports_every_layer(tmp_path, kind, whole):
    folder = save_t5(tmp_path / kind, kind, whole)
    model = getattr(transformers, CLASSES[kind][1]).from_pretrained(
        str(folder), dtype=torch.float64
    )
    ids = torch.tensor([word_tokenizer(False).encode(TEXT).ids])
    reference = by_hand(model.eval(), ids)
    for layer in range(3):
        imported = import_model_layer(Request(str(folder), TEXT, layer))
        assert max(imported.agreement_weights, imported.agreement_output) <= EXACT
        r = compute(imported.scenario)
        np.testing.assert_allclose(r.weights, reference[layer][1], rtol=0, atol=EXACT)
        assert imported.provenance.layers == 3  # the encoder's, not the decoder's 2
    assert peek(str(folder), TEXT).problem == ""


def test_attnviz_import_all_layers_writes_each_exact_layer(tmp_path, capsys):
    folder = save_t5(tmp_path / "t5")
    out = tmp_path / "all.attn.npz"
    assert main(["import", str(folder), "--text", TEXT, "--layer", "all", "--out", str(out)]) == 0
    assert "imported layers 0-2 of 3" in capsys.readouterr().out
    stack = load_layers(out)
    assert stack.stored == (0, 1, 2)
    model = transformers.T5EncoderModel.from_pretrained(str(folder), dtype=torch.float64).eval()
    ids = torch.tensor([word_tokenizer(False).encode(TEXT).ids])
    reference = by_hand(model, ids)
    for k, s in zip(stack.stored, stack.scenarios, strict=True):
        r = compute(s)
        np.testing.assert_allclose(r.weights, reference[k][1], rtol=0, atol=EXACT)
        np.testing.assert_allclose(r.weights, s.provenance.model_weights, rtol=0, atol=EXACT)
        assert s.settings.positional == "relative-bias" and s.relative_bias.shape == (8, 4)


def test_a_checkpoint_missing_an_encoder_weight_or_with_an_extra_one_is_refused(tmp_path):
    folder = save_t5(tmp_path / "t5")
    path = folder / "model.safetensors"
    weights = load_file(path)
    name = "encoder.block.1.layer.0.SelfAttention.k.weight"
    save_file({k: v for k, v in weights.items() if k != name}, path, metadata={"format": "pt"})
    with pytest.raises(ScenarioError, match=r"does not hold every weight.*SelfAttention\.k"):
        import_model_layer(Request(str(folder), TEXT, 1))
    extra = {"encoder.block.1.layer.0.SelfAttention.relative_attention_bias.weight":
             torch.zeros(8, 4)}  # fmt: skip
    save_file({**weights, **extra}, path, metadata={"format": "pt"})
    with pytest.raises(ScenarioError, match="has no place for"):
        import_model_layer(Request(str(folder), TEXT, 1))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"relative_attention_num_buckets": 3},
            "relative_attention_num_buckets 3 is not supported",
        ),
        ({"relative_attention_num_buckets": 4096}, "relative_attention_num_buckets 4096"),
        ({"relative_attention_max_distance": 2}, "relative_attention_max_distance 2 is not"),
        ({"is_decoder": True}, "is_decoder true is not supported"),
    ],
)
@pytest.mark.parametrize("kind", KINDS)
def test_what_the_import_does_not_model_is_refused_by_name_before_loading(
    tmp_path, kind, changes, message
):
    folder = edited(save_t5(tmp_path / kind, kind), **changes)
    (folder / "model.safetensors").write_bytes(b"never read")
    assert message in peek(str(folder), TEXT).problem
    with pytest.raises(ScenarioError, match=message):
        import_model_layer(Request(str(folder), TEXT, 0))


def test_a_t5_text_is_not_limited_to_its_training_length(tmp_path):
    """n_positions in a T5 config is the length it was trained on: its relative bias has
    no table of positions, so a longer text imports (up to a scenario's own limit)."""
    from attnviz.core.maths.scenario import LIMITS

    folder = edited(save_t5(tmp_path / "t5"), n_positions=4)
    looked = peek(str(folder), TEXT)
    assert looked.problem == "" and looked.max_tokens == LIMITS.tokens
    assert len(looked.tokens.ids) > 4
    got = import_model_layer(Request(str(folder), TEXT, 0))
    assert got.agreement_weights <= 1e-12
