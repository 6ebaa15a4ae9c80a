"""GPT-NeoX (Pythia): causal, one fused Q/K/V projection laid out head by head, partial
RoPE (half-split pairs) on each head's first features.

The fused ``query_key_value`` output is read as (heads, 3, d_k): each head's query, key
and value features lie side by side, head after head (not all queries, then all keys),
as the attention's ``view(…, heads, 3·d_k)`` then ``chunk(3)`` reads it.

Config options that change attention: ``rotary_pct`` / ``partial_rotary_factor`` (how
many leading features of each head RoPE turns: ``int(d_k · factor)``, the scenario's
``rope_dims``; none at all for a factor of 0; a factor that turns an odd number of
features, or more than the head has, is refused by name: transformers' RoPE fails on
it), ``rotary_emb_base`` / ``rope_theta`` (the base), ``rope_scaling`` /
``rope_parameters`` (the default RoPE, ``linear`` and ``llama3``, whose frequencies are
the Llama family's, recomputed in float64; other types are refused by name),
``attention_bias`` (Q/K/V and output biases, or none). ``use_parallel_residual`` changes
the block (the MLP reads the layer's input beside the attention instead of after it),
not the attention: X is what the attention receives either way, the layer's
``input_layernorm`` output.

transformers' GPT-NeoX goes through the attention interface (the import's float64
eager attention keeps the softmax in the model's dtype); the rotary angles, which it
takes in float32, are computed in the model's dtype in every layer. The float32
``_attn`` upcast of older transformers versions is gone from 5.x's code.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from attnviz.core.maths.scenario import Settings
from attnviz.core.models.families.base import Config, Family, rope_problem
from attnviz.core.models.families.llama import FIXED_ROPE_TYPES, rope_frequencies
from attnviz.core.models.hf_layer import (
    ImportedLayer,
    _imported,
    _numpy,
    _rope64,
    _run,
    layer_scenario,
    swapped_forwards,
)


def check_config(config: Config) -> str:
    problem = rope_problem(config, FIXED_ROPE_TYPES)
    if problem:
        return problem
    rope = config.get("rope_scaling") or config.get("rope_parameters") or {}
    factor = rope.get("partial_rotary_factor", config.get("rotary_pct", 0.25))
    return partial_problem("GPT-NeoX", config, factor, (6144, 64))


def partial_problem(name: str, config: Config, factor: object, default: tuple[int, int]) -> str:
    """Why the share ``factor`` of each head that RoPE turns is refused ('' when it is
    not): transformers' RoPE fails on an odd number of features, or more than the head's
    (``default``: the family's hidden_size and num_attention_heads)."""
    width = config.get("hidden_size", default[0])
    heads = config.get("num_attention_heads", default[1])
    if not (
        isinstance(width, int)
        and isinstance(heads, int)
        and heads > 0
        and isinstance(factor, float | int)
    ):
        return ""  # transformers refuses such a config itself
    d_k = width // heads
    dims = int(d_k * factor)
    if dims % 2 or dims > d_k:
        return (
            f"{name} partial rotary factor {factor} is not supported (it turns {dims} of "
            f"the head's {d_k} features; transformers' RoPE needs an even number, at most "
            f"{d_k})"
        )
    return ""


def rotary(config: Any, rotary_emb: Any, dims: int) -> tuple[dict[str, Any], Any]:
    """RoPE on each head's first ``dims`` features, half-split (the GPT-NeoX style): the
    scenario's settings and a float64 forward for the model's rotary embedding module
    (the same frequencies, which transformers computes in float32)."""
    theta, frequencies, _ = rope_frequencies(config, dims)  # (its types: no factor)
    if dims == 0:  # a partial rotary factor of 0: no RoPE
        return {"mask": "causal"}, _rope64(rotary_emb, frequencies)
    settings: dict[str, Any] = {
        "positional": "rope",
        "rope_base": theta,
        "rope_dims": dims,
        "mask": "causal",
    }
    rope = dict(getattr(config, "rope_parameters", None) or {})
    if str(rope.get("rope_type", rope.get("type", "default"))) != "default":
        settings["rope_frequencies"] = tuple(float(f) for f in frequencies)
    return settings, _rope64(rotary_emb, frequencies)


def import_layer(model: Any, input_ids: Any, layer: int, tokens: tuple[str, ...]) -> ImportedLayer:
    config = model.config
    heads = config.num_attention_heads
    base = model.base_model
    module = base.layers[layer].attention
    settings, forward = rotary(config, base.rotary_emb, module.rotary_ndims)
    with swapped_forwards({base.rotary_emb: forward}):
        X_t, attention_out, out = _run(model, input_ids, module, module.dense)
    X = _numpy(X_t)
    d_model, d = X.shape[1], module.head_size
    fused = module.query_key_value
    W = _numpy(fused.weight).T.reshape(d_model, heads, 3, d)  # per head: q, k, v
    b = np.zeros((heads, 3, d)) if fused.bias is None else _numpy(fused.bias).reshape(heads, 3, d)
    q, k, v = ((W[:, :, i, :].transpose(1, 0, 2), b[:, None, i, :]) for i in range(3))
    scenario = layer_scenario(tokens, X, (q, k, v), module.dense, Settings(**settings))
    return _imported(scenario, out, attention_out, config.model_type, layer)


FAMILY = Family("GPT-NeoX", ("gpt_neox",), check_config, import_layer)
