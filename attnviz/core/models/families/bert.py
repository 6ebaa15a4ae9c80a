"""The BERT family: BERT (and MiniLM, which is a BERT), RoBERTa, XLM-RoBERTa, CamemBERT,
XLM-RoBERTa-XL, ELECTRA and DistilBERT; bidirectional, separate Q, K, V projections with
biases.

XLM-RoBERTa and CamemBERT are RoBERTa's code under other names. XLM-RoBERTa-XL puts a
LayerNorm before attention (X is its output, which is what attention receives). ELECTRA's
embeddings have ``embedding_size`` features, projected to ``hidden_size`` by
``embeddings_project`` before the first layer: X is the projected state.

Config options that change attention: ``is_decoder`` makes every one but DistilBERT causal
(a mask attnviz has); ``add_cross_attention`` (a decoder reading an encoder) is refused, and
so is any ``position_embedding_type`` other than "absolute": transformers 5 ignores the
option and drops the relative-position weights such checkpoints carry, so the layer it
computes is not the one the checkpoint was trained as. DistilBERT's
``sinusoidal_pos_embds`` only changes the embeddings, which X already holds.
"""

from __future__ import annotations

from typing import Any

from attnviz.core.maths.scenario import Settings, from_heads
from attnviz.core.models.families.base import Config, Family, flag, positions
from attnviz.core.models.hf_layer import ImportedLayer, _heads, _imported, _numpy, _run

NAMES = {
    "bert": "BERT",
    "roberta": "RoBERTa",
    "xlm-roberta": "XLM-RoBERTa",
    "camembert": "CamemBERT",
    "xlm-roberta-xl": "XLM-RoBERTa-XL",
    "electra": "ELECTRA",
    "distilbert": "DistilBERT",
}


def check_config(config: Config) -> str:
    model_type = config.get("model_type")
    name = NAMES.get(str(model_type), "BERT")
    positions = config.get("position_embedding_type")
    if positions not in (None, "absolute"):
        return (
            f"{name} {positions} position embeddings are not supported (transformers 5 "
            "ignores the option and drops their weights)"
        )
    if flag(config, "add_cross_attention"):
        return f"{name} add_cross_attention (a decoder that reads an encoder) is not supported"
    if model_type == "distilbert" and flag(config, "is_decoder"):
        return "DistilBERT is_decoder is not supported (transformers' DistilBERT ignores it)"
    return ""


def import_layer(model: Any, input_ids: Any, layer: int, tokens: tuple[str, ...]) -> ImportedLayer:
    config = model.config
    heads = config.num_attention_heads
    if config.model_type == "distilbert":
        body = model.transformer if hasattr(model, "transformer") else model.distilbert.transformer
        module = body.layer[layer].attention
        inner, projection = module, module.out_lin
        linear = [module.q_lin, module.k_lin, module.v_lin]
    else:
        encoder = model.encoder if hasattr(model, "encoder") else model.bert.encoder
        module = encoder.layer[layer].attention
        inner, projection = module.self, module.output.dense
        linear = [inner.query, inner.key, inner.value]
    X_t, attention_out, out = _run(model, input_ids, inner, projection)
    X = _numpy(X_t)
    (W_Q, b_Q), (W_K, b_K), (W_V, b_V) = (
        _heads(_numpy(p.weight).T, _numpy(p.bias), heads) for p in linear
    )
    heads_list = [
        {"W_Q": W_Q[h], "W_K": W_K[h], "W_V": W_V[h], "b_Q": b_Q[h], "b_K": b_K[h], "b_V": b_V[h]}
        for h in range(heads)
    ]
    mask = "causal" if getattr(config, "is_decoder", False) else "none"
    W_O, b_O = _numpy(projection.weight).T, _numpy(projection.bias)
    scenario = from_heads(tokens, X, heads_list, W_O, Settings(mask=mask), b_O=b_O)
    return _imported(scenario, out, attention_out, config.model_type, layer)


# RoBERTa's code: its positions start after the padding index
ROBERTA_POSITIONS = ("roberta", "xlm-roberta", "camembert", "xlm-roberta-xl")


def max_positions(config: Config) -> int | None:
    """The positions a text may take: RoBERTa's first two are the padding index's."""
    n = positions(config)
    return n - 2 if n is not None and config.get("model_type") in ROBERTA_POSITIONS else n


FAMILY = Family(
    "the BERT family",
    tuple(NAMES),
    check_config,
    import_layer,
    causal=False,
    max_positions=max_positions,
)
