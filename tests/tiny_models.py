"""Tiny seeded transformers models, in memory or saved as Hugging Face folders.

Each folder holds what a real checkpoint does: ``config.json``, ``model.safetensors``
(float32, as checkpoints usually are) and a word-level ``tokenizer.json`` built with the
``tokenizers`` library; the BERT family's tokenizer adds ``[CLS]`` and ``[SEP]``.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import torch
import transformers

LLAMA_KINDS = ("llama", "qwen2", "qwen3", "mistral")
KINDS = ("gpt2", "bert", "roberta", "distilbert", *LLAMA_KINDS)
WORDS = (
    "the",
    "cat",
    "sat",
    "on",
    "mat",
    "a",
    "dog",
    "ran",
    "to",
    "red",
    "big",
    "small",
    "house",
    "and",
    "it",
    "was",
)


def tiny(kind: str, dtype=None):
    torch.manual_seed(0)
    if kind == "distilbert":
        config = transformers.DistilBertConfig(
            vocab_size=50, dim=16, n_layers=3, n_heads=4, hidden_dim=32, max_position_embeddings=32
        )
        model = transformers.DistilBertModel(config)
    elif kind == "roberta":
        config = transformers.RobertaConfig(
            vocab_size=50,
            hidden_size=16,
            num_hidden_layers=3,
            num_attention_heads=4,
            intermediate_size=32,
            max_position_embeddings=40,
        )
        model = transformers.RobertaModel(config, add_pooling_layer=False)
    elif kind == "gpt2":
        config = transformers.GPT2Config(
            vocab_size=50,
            n_positions=32,
            n_embd=16,
            n_layer=3,
            n_head=4,
            attn_implementation="eager",
        )
        model = transformers.GPT2Model(config)
    else:
        config = transformers.BertConfig(
            vocab_size=50,
            hidden_size=16,
            num_hidden_layers=3,
            num_attention_heads=4,
            intermediate_size=32,
            max_position_embeddings=32,
            attn_implementation="eager",
        )
        model = transformers.BertModel(config, add_pooling_layer=False)
    return model.to(dtype or torch.float64).eval()


def tiny_llama(kind: str, dtype=None):
    torch.manual_seed(1)
    common = dict(
        vocab_size=50,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=32,
        max_position_embeddings=64,
        attn_implementation="eager",
    )
    if kind == "llama":
        model = transformers.LlamaModel(transformers.LlamaConfig(**common))
    elif kind == "qwen2":
        model = transformers.Qwen2Model(transformers.Qwen2Config(**common))
    elif kind == "qwen3":
        model = transformers.Qwen3Model(transformers.Qwen3Config(**common, head_dim=4))
    else:
        model = transformers.MistralModel(transformers.MistralConfig(**common, sliding_window=3))
    with torch.no_grad():  # initialised to zero: give Qwen2's biases values to check
        for block in model.layers:
            for proj in (block.self_attn.q_proj, block.self_attn.k_proj, block.self_attn.v_proj):
                if proj.bias is not None:
                    proj.bias.normal_()
            for norm in (
                getattr(block.self_attn, "q_norm", None),
                getattr(block.self_attn, "k_norm", None),
            ):
                if norm is not None:  # initialised to one: give QK-norm weights values too
                    norm.weight.uniform_(0.5, 1.5)
    return model.to(dtype or torch.float64).eval()


def tiny_model(kind: str, dtype=None):
    return tiny_llama(kind, dtype) if kind in LLAMA_KINDS else tiny(kind, dtype)


def word_tokenizer(bert_style: bool):
    """A word-level tokenizer over WORDS (ids 3…; 0 [UNK], 1 [CLS], 2 [SEP])."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {"[UNK]": 0, "[CLS]": 1, "[SEP]": 2, **{w: i + 3 for i, w in enumerate(WORDS)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.add_special_tokens(["[UNK]", "[CLS]", "[SEP]"])
    if bert_style:
        tokenizer.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 1), ("[SEP]", 2)]
        )
    return tokenizer


def save_tiny(kind: str, folder: Path) -> Path:
    """Save a tiny seeded model of ``kind`` with its tokenizer into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    tiny_model(kind, torch.float32).save_pretrained(folder)
    word_tokenizer(kind in ("bert", "roberta", "distilbert")).save(str(folder / "tokenizer.json"))
    return folder


def fake_package(root, name: str, archive_entries: dict[str, bytes]):
    """An installed distribution ``name`` whose package holds model.zip."""
    package = root / name.replace("-", "_")
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("raise RuntimeError('attnviz must not import this')\n")
    with zipfile.ZipFile(package / "model.zip", "w") as z:
        for entry, data in archive_entries.items():
            z.writestr(entry, data)
    info = root / f"{name.replace('-', '_')}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    files = [f"{package.name}/__init__.py", f"{package.name}/model.zip", f"{info.name}/METADATA"]
    (info / "RECORD").write_text("".join(f"{f},,\n" for f in files))


def save_model(model, folder: Path, bert_style: bool = False) -> Path:
    """Save ``model`` (in float32, as checkpoints are) with the word-level tokenizer."""
    folder.mkdir(parents=True, exist_ok=True)
    model.float().save_pretrained(folder)
    word_tokenizer(bert_style).save(str(folder / "tokenizer.json"))
    return folder


def edited(folder: Path, drop=(), **changes) -> Path:
    """The folder with its config.json changed: ``drop`` keys removed, ``changes`` set."""
    config = json.loads((folder / "config.json").read_text())
    config = {k: v for k, v in config.items() if k not in drop}
    (folder / "config.json").write_text(json.dumps({**config, **changes}))
    return folder


def unreadable_weights(folder: Path) -> None:
    """Weights no loader could read: a refusal after this was made from the config."""
    (folder / "model.safetensors").write_bytes(b"never read")


def own_eager(model, ids):
    """transformers' own eager attention weights, every layer, the model unchanged (its
    float32 steps kept), as float64 arrays."""
    with torch.no_grad():
        out = model(input_ids=ids, output_attentions=True)
    return [a[0].double().numpy() for a in out.attentions]


def layer_exactly(model, ids, labels, layer: int, X, weights, exact: float = 1e-12):
    """Import ``layer`` and check it to ``exact``: attnviz's weights and output against the
    model's run, and its X and weights against a reference written out by hand; returns
    the imported layer and attnviz's computation of it."""
    import numpy as np

    from attnviz.core.maths.forward import compute
    from attnviz.core.models.hf_layer import import_layer

    got = import_layer(model, ids, layer, labels)
    r = compute(got.scenario)
    np.testing.assert_allclose(got.scenario.X, X, rtol=0, atol=exact)
    np.testing.assert_allclose(r.weights, got.model_weights, rtol=0, atol=exact)
    np.testing.assert_allclose(r.final, got.model_output, rtol=0, atol=exact)
    np.testing.assert_allclose(r.weights, weights, rtol=0, atol=exact)
    np.testing.assert_allclose(got.model_weights, weights, rtol=0, atol=exact)
    return got, r
