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

import numpy as np

from attnviz.core.maths.scenario import Scenario, Settings, head_stack
from attnviz.core.models.families.base import Config, Family, rope_problem
from attnviz.core.models.families.llama import FIXED_ROPE_TYPES, rope_frequencies
from attnviz.core.models.hf_layer import (
    ImportedLayer,
    _heads,
    _imported,
    _norm64,
    _numpy,
    _rope64,
    _run,
    swapped_forwards,
)

MODEL_TYPES = ("olmo2",)


def check_config(config: Config) -> str:
    return rope_problem(config, FIXED_ROPE_TYPES)


def _rope_type(config: Any) -> str:
    rope = dict(getattr(config, "rope_parameters", None) or {})
    return str(rope.get("rope_type", rope.get("type", "default")))


def _lifted(model: Any, frequencies: np.ndarray) -> dict[Any, Any]:
    """Forwards that keep every float32 step of the model in its own dtype: the rotary
    angles and every RMS norm (each layer's QK norms, post-attention and post-feedforward
    norms, the final norm)."""
    base = model.model if hasattr(model, "model") else model
    forwards = {base.rotary_emb: _rope64(base.rotary_emb, frequencies)}
    for module in model.modules():
        if type(module).__name__.endswith("RMSNorm"):
            forwards[module] = _norm64(module)
    return forwards


def import_layer(model: Any, input_ids: Any, layer: int, tokens: tuple[str, ...]) -> ImportedLayer:
    config = model.config
    heads, kv = config.num_attention_heads, config.num_key_value_heads
    base = model.model if hasattr(model, "model") else model
    module = base.layers[layer].self_attn
    theta, frequencies, _ = rope_frequencies(config, 2 * base.rotary_emb.inv_freq.shape[0])
    with swapped_forwards(_lifted(model, frequencies)):
        X_t, attention_out, out = _run(model, input_ids, module, module.o_proj)
    X = _numpy(X_t)

    def part(linear: Any, count: int) -> tuple[np.ndarray, np.ndarray]:
        bias = None if linear.bias is None else _numpy(linear.bias)
        return _heads(_numpy(linear.weight).T, bias, count)

    W_Q, b_Q = part(module.q_proj, heads)
    W_K, b_K = part(module.k_proj, kv)
    W_V, b_V = part(module.v_proj, kv)
    d = W_Q.shape[2]
    o = module.o_proj
    b_O = np.zeros((1, X.shape[1])) if o.bias is None else _numpy(o.bias)[None]
    scaled: dict[str, Any] = {}
    if getattr(config, "rope_parameters", None) and _rope_type(config) != "default":
        scaled = {"rope_frequencies": tuple(float(f) for f in frequencies)}
    settings = Settings(
        mask="causal",
        positional="rope",
        rope_base=theta,
        qk_norm="rms-whole",
        qk_norm_eps=float(module.q_norm.variance_epsilon),
        **scaled,
    )
    scenario = Scenario(
        tokens=tokens,
        X=X,
        W_Q=head_stack("W_Q", W_Q),
        W_K=head_stack("W_K", W_K),
        W_V=head_stack("W_V", W_V),
        W_O=_numpy(o.weight).T,
        settings=settings,
        b_Q=head_stack("b_Q", b_Q),
        b_K=head_stack("b_K", b_K),
        b_V=head_stack("b_V", b_V),
        b_O=b_O,
        # the whole projection's norm weights, one row of d_k per head
        q_norm=head_stack("q_norm", _numpy(module.q_norm.weight).reshape(heads, 1, d)),
        k_norm=head_stack("k_norm", _numpy(module.k_norm.weight).reshape(kv, 1, d)),
    )
    return _imported(scenario, out, attention_out, config.model_type, layer)


FAMILY = Family("OLMo 2", MODEL_TYPES, check_config, import_layer)
