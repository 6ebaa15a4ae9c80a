"""OLMo 2 (``olmo2``): causal, RoPE (half-split pairs), key/value heads shared by groups
of query heads, and QK-norm over the WHOLE projection: ``q_norm`` is an RMS norm over
all heads' features of a token together (heads·d_k weights), ``k_norm`` over all key/value
heads' (kv_heads·d_k), applied to the projections (bias included) before the heads are
split. The scenario models it as QK-norm ``"rms-whole"``, the weights cut into per-head
rows (heads, 1, d_k) and (kv_heads, 1, d_k).

Config options that change attention: ``num_attention_heads``, ``num_key_value_heads``
and ``head_dim`` (read from the weights' shapes), ``attention_bias`` (biases on Q, K, V
and O, modelled), ``rms_norm_eps`` (the QK-norm's eps, modelled), ``rope_parameters`` /
``rope_scaling`` and ``rope_theta`` (the default RoPE, and the ``linear`` and ``llama3``
scalings with the Llama family's frequencies, computed in float64 and kept in the
scenario; other scaling types are refused by name), ``attention_dropout`` (training
only: the import runs the model in eval mode). OLMo 2's code reads no sliding window:
a stray ``sliding_window`` changes nothing, and is ignored here too.

OLMo 2 normalises AFTER attention and after the MLP (``post_attention_layernorm``,
``post_feedforward_layernorm``): the attention's X is the raw residual stream entering
the layer, and its output, captured at ``o_proj``, is concat·W_O + b_O before that norm.

transformers keeps the RMS norms (QK, post-attention, post-feedforward, final) and the
rotary angles in float32 even in a float64 model; the import runs all of them in the
model's own dtype in every layer, so that a float64 import is float64 throughout. The
attention goes through transformers' attention interface (``_eager64``: the softmax in
the model's dtype).
"""

from __future__ import annotations

from typing import Any

from attnviz.core.maths.scenario import Settings
from attnviz.core.models.families.base import Config, Family, rope_problem
from attnviz.core.models.families.llama import FIXED_ROPE_TYPES, run_rotary
from attnviz.core.models.hf_layer import (
    ImportedLayer,
    _imported,
    _numpy,
    layer_scenario,
    separate_qkv,
)

MODEL_TYPES = ("olmo2",)


def check_config(config: Config) -> str:
    return rope_problem(config, FIXED_ROPE_TYPES)


def import_layer(model: Any, input_ids: Any, layer: int, tokens: tuple[str, ...]) -> ImportedLayer:
    config = model.config
    heads, kv = config.num_attention_heads, config.num_key_value_heads
    module = model.base_model.layers[layer].self_attn
    (X_t, attention_out, out), rope = run_rotary(model, input_ids, module, module.o_proj)
    X = _numpy(X_t)
    qkv = separate_qkv(module, heads, kv)
    d = module.head_dim
    settings = Settings(
        mask="causal",
        qk_norm="rms-whole",
        qk_norm_eps=float(module.q_norm.variance_epsilon),
        **rope,
    )
    scenario = layer_scenario(
        tokens, X, qkv, module.o_proj, settings,
        # the whole projection's norm weights, one row of d_k per head
        q_norm=_numpy(module.q_norm.weight).reshape(heads, 1, d),
        k_norm=_numpy(module.k_norm.weight).reshape(kv, 1, d),
    )  # fmt: skip
    return _imported(scenario, out, attention_out, config.model_type, layer)


FAMILY = Family("OLMo 2", MODEL_TYPES, check_config, import_layer)
