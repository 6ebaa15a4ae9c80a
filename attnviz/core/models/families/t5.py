"""The T5 family: T5, mT5 and UMT5; the encoder's self-attention only, with T5's learned,
bucketed relative position bias (positional "relative-bias").

Only the encoder is imported: its layers are the model's layers here (config.json's
``num_layers``, the encoder's), and the model is loaded as ``T5EncoderModel`` (``MT5…``,
``UMT5…``), so that a checkpoint of the whole model (encoder and decoder) or of the
encoder alone loads; the decoder's weights are never loaded (they are no part of the
layer count, nor refused as unexpected), and the decoder's self- and cross-attention
are not offered.

Config options that change the encoder's attention: ``num_heads``, ``d_kv`` (heads of
d_kv, which need not divide d_model), ``relative_attention_num_buckets`` and
``relative_attention_max_distance`` (T5's buckets of the relative position j − i, two
directions in the encoder: modelled; fewer than 4 buckets, more than 1024, or a largest
distance not beyond the exact ones are refused by name), ``is_decoder`` (true would
make the encoder loaded alone attend causally with one direction: refused by name).
T5 scales no score (Settings ``scale`` off) and its q, k, v and o have no biases. In T5
and mT5 only layer 0 holds ``relative_attention_bias`` and every layer adds layer 0's
table; in UMT5 every layer holds and adds its own. ``layer_norm_epsilon``,
``feed_forward_proj``, ``d_ff`` change what later layers receive, which the run
computes; ``dropout_rate`` does nothing in evaluation.

transformers computes T5LayerNorm's mean square in float32 even in a float64 model; the
import runs every norm of the encoder (each layer's two and the final one) in the
model's own dtype. The buckets' logarithm is float32 in T5's own code: that is T5's
definition of the buckets, and attnviz computes them the same way.
"""

from __future__ import annotations

from typing import Any

from attnviz.core.maths.scenario import Settings
from attnviz.core.maths.variants import (
    RELATIVE_BUCKETS_MOST,
    RELATIVE_DISTANCE_MOST,
    relative_exact,
)
from attnviz.core.models.families.base import Config, Family, flag
from attnviz.core.models.hf_layer import (
    ImportedLayer,
    _imported,
    _norm64,
    _numpy,
    _run,
    layer_scenario,
    linear_heads,
    swapped_forwards,
)

MODEL_TYPES = ("t5", "mt5", "umt5")
ENCODERS = {"t5": "T5EncoderModel", "mt5": "MT5EncoderModel", "umt5": "UMT5EncoderModel"}
DECODER = (r"(?:^|\.)decoder\.",)  # the decoder's weights: never loaded


def check_config(config: Config) -> str:
    buckets = config.get("relative_attention_num_buckets", 32)
    distance = config.get("relative_attention_max_distance", 128)
    if not isinstance(buckets, int) or not 4 <= buckets <= RELATIVE_BUCKETS_MOST:
        return (
            f"relative_attention_num_buckets {buckets!r} is not supported (the encoder's "
            f"two directions take 4 to {RELATIVE_BUCKETS_MOST} buckets)"
        )
    exact = relative_exact(buckets, True)
    if not isinstance(distance, int) or not exact < distance <= RELATIVE_DISTANCE_MOST:
        return (
            f"relative_attention_max_distance {distance!r} is not supported (T5's buckets "
            f"need a distance beyond the {exact} with buckets of their own)"
        )
    if flag(config, "is_decoder"):
        return (
            "is_decoder true is not supported (the import reads T5's encoder, which would "
            "then attend causally)"
        )
    return ""


def model_class(model_type: str) -> str:
    """The encoder alone: T5EncoderModel, MT5EncoderModel or UMT5EncoderModel."""
    return ENCODERS.get(model_type, "AutoModel")


def _encoder(model: Any) -> Any:
    """The encoder stack (of an encoder model, or of a whole T5 model)."""
    return model.get_encoder() if hasattr(model, "get_encoder") else model.encoder


def _lifted(encoder: Any) -> dict[Any, Any]:
    """Every layer norm of the encoder in the model's own dtype (T5 takes the mean square
    in float32)."""
    return {
        module: _norm64(module)
        for module in encoder.modules()
        if type(module).__name__.endswith("LayerNorm")
    }


def import_layer(model: Any, input_ids: Any, layer: int, tokens: tuple[str, ...]) -> ImportedLayer:
    encoder = _encoder(model)
    config = encoder.config
    heads = config.num_heads
    attention = encoder.block[layer].layer[0].SelfAttention
    with swapped_forwards(_lifted(encoder)):
        X_t, attention_out, out = _run(encoder, input_ids, attention, attention.o)
    X = _numpy(X_t)
    # T5, mT5: layer 0's table serves every layer; UMT5: each layer has its own
    owner = (
        attention
        if attention.has_relative_attention_bias
        else encoder.block[0].layer[0].SelfAttention
    )
    table = _numpy(owner.relative_attention_bias.weight)  # (buckets, heads)

    settings = Settings(
        scale=False,
        mask="none",
        positional="relative-bias",
        relative_buckets=int(config.relative_attention_num_buckets),
        relative_max_distance=int(config.relative_attention_max_distance),
        relative_bidirectional=True,
    )
    q, k, v = (linear_heads(p, heads) for p in (attention.q, attention.k, attention.v))
    scenario = layer_scenario(tokens, X, (q, k, v), attention.o, settings, relative_bias=table)
    return _imported(scenario, out, attention_out, config.model_type, layer)


FAMILY = Family(
    "the T5 family (its encoder)",
    MODEL_TYPES,
    check_config,
    import_layer,
    model_class=model_class,
    not_loaded=DECODER,
    causal=False,  # an encoder: config.json's is_causal has nothing to turn off
    # its n_positions is the length it was trained on: a relative bias has no table
    max_positions=lambda config: None,
)
