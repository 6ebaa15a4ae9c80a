"""StableLM: causal, separate Q/K/V projections, partial RoPE (half-split pairs) on each
head's first features, key/value heads shared by groups of query heads.

Config options that change attention: ``partial_rotary_factor`` (how many leading
features of each head RoPE turns: ``int(d_k · factor)``, the scenario's ``rope_dims``;
an odd number of features, or more than the head has, is refused by name),
``rope_theta``, ``rope_scaling`` / ``rope_parameters`` (the default RoPE, ``linear`` and
``llama3``, with the Llama family's frequencies recomputed in float64; other types are
refused by name), ``use_qkv_bias`` (Q/K/V biases; the output has none),
``num_key_value_heads``. ``qk_layernorm`` (a LayerNorm per head over Q and K, with a
mean and its own weights per head) is refused by name: attnviz's QK norm is an RMS norm.
``use_parallel_residual`` changes the block (the MLP reads the normed input beside the
attention), not the attention: X is the ``input_layernorm`` output either way.

transformers' StableLM goes through the attention interface (the import's float64 eager
attention keeps the softmax in the model's dtype); its rotary angles, which it takes in
float32, are computed in the model's dtype in every layer.
"""

from __future__ import annotations

from typing import Any

from attnviz.core.maths.scenario import Settings
from attnviz.core.models.families.base import Config, Family, flag, rope_problem
from attnviz.core.models.families.gpt_neox import partial_problem, rotary
from attnviz.core.models.families.llama import FIXED_ROPE_TYPES
from attnviz.core.models.hf_layer import (
    ImportedLayer,
    _imported,
    _numpy,
    _run,
    layer_scenario,
    separate_qkv,
    swapped_forwards,
)


def check_config(config: Config) -> str:
    if flag(config, "qk_layernorm"):
        return (
            "StableLM qk_layernorm (a LayerNorm per head over Q and K) is not supported "
            "(attnviz's QK norm is an RMS norm)"
        )
    problem = rope_problem(config, FIXED_ROPE_TYPES)
    if problem:
        return problem
    rope = config.get("rope_scaling") or config.get("rope_parameters") or {}
    factor = rope.get("partial_rotary_factor", config.get("partial_rotary_factor", 0.25))
    return partial_problem("StableLM", config, factor, (2560, 32))


def import_layer(model: Any, input_ids: Any, layer: int, tokens: tuple[str, ...]) -> ImportedLayer:
    config = model.config
    heads, kv = config.num_attention_heads, config.num_key_value_heads
    base = model.base_model
    module = base.layers[layer].self_attn
    settings, forward = rotary(config, base.rotary_emb, module.rotary_ndims)
    with swapped_forwards({base.rotary_emb: forward}):
        X_t, attention_out, out = _run(model, input_ids, module, module.o_proj)
    X = _numpy(X_t)

    qkv = separate_qkv(module, heads, kv)
    scenario = layer_scenario(tokens, X, qkv, module.o_proj, Settings(**settings))
    return _imported(scenario, out, attention_out, config.model_type, layer)


FAMILY = Family("StableLM", ("stablelm",), check_config, import_layer)
