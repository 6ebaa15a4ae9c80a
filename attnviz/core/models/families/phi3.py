"""Phi-3, Phi-3.5 and Phi-4-mini (model type "phi3"): causal, RoPE (half-split pairs),
one fused Q/K/V projection without biases, key/value heads shared by groups of query
heads, RMS norms.

Config options that change attention: ``qkv_proj`` is split into Q (heads·d), K (kv·d)
and V (kv·d) rows; ``partial_rotary_factor`` turns only the leading features of each
head (the scenario's rope_dims); ``rope_parameters`` / ``rope_scaling`` of type
"default" or "longrope" (and the old names "su" and "yarn", which transformers' Phi-3
reads as longrope): short_factor / long_factor by the text's length against
``original_max_position_embeddings``, ``attention_factor`` or √(1 + ln(factor)/ln(original
context)) on cos and sin, computed in float64 by the Llama family's ``rope_frequencies``;
any other type is refused by name (transformers' Phi-3 refuses it too). ``sliding_window``:
when the config sets one, transformers' Phi-3 masks every layer with it (query i sees
keys i − window < j ≤ i), and so does the scenario (a window as long as the text or
longer hides nothing: the causal mask); a window below 1 is refused.
``rms_norm_eps``; ``attention_dropout`` and ``resid_pdrop`` act in training only.

transformers keeps the RMS norms and the rotary angles in float32 even in a float64
model; the import runs every layer's norms and the angles in the model's own dtype, as
the Llama family does, so that a float64 import is float64 throughout.
"""

from __future__ import annotations

from typing import Any

from attnviz.core.maths.scenario import Settings
from attnviz.core.models.families.base import Config, Family, rope_problem
from attnviz.core.models.families.llama import mask_settings, run_rotary
from attnviz.core.models.hf_layer import ImportedLayer, _heads, _imported, _numpy, layer_scenario

ROPE_TYPES = ("default", "longrope", "su", "yarn")  # su and yarn: longrope in Phi-3


def check_config(config: Config) -> str:
    window = config.get("sliding_window")
    if window is not None and (
        isinstance(window, bool) or not isinstance(window, int) or window < 1
    ):
        return f"Phi-3 sliding_window {window!r} is not supported (expected a whole number ≥ 1)"
    return rope_problem(config, ROPE_TYPES)


def import_layer(model: Any, input_ids: Any, layer: int, tokens: tuple[str, ...]) -> ImportedLayer:
    config = model.config
    heads, kv = config.num_attention_heads, config.num_key_value_heads
    base = model.base_model
    module = base.layers[layer].self_attn
    (X_t, attention_out, out), rope = run_rotary(model, input_ids, module, module.o_proj)
    X = _numpy(X_t)
    d = module.head_dim
    W = _numpy(module.qkv_proj.weight).T  # (d_model, heads·d + 2·kv·d)
    q, k = heads * d, heads * d + kv * d
    qkv = (_heads(W[:, :q], None, heads), _heads(W[:, q:k], None, kv), _heads(W[:, k:], None, kv))
    window = getattr(config, "sliding_window", None)
    mask = mask_settings(None if window is None else int(window), X.shape[0])
    scenario = layer_scenario(tokens, X, qkv, module.o_proj, Settings(**rope, **mask))
    return _imported(scenario, out, attention_out, config.model_type, layer)


FAMILY = Family("Phi-3", ("phi3",), check_config, import_layer)
