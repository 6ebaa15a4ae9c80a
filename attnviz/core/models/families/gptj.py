"""GPT-J: causal, separate Q/K/V projections without biases (nor on the output), RoPE
on each head's first ``rotary_dim`` features in interleaved pairs (features 2i, 2i + 1).

Config options that change attention: ``rotary_dim`` (the scenario's ``rope_dims``;
null turns all ``n_embd`` features, which transformers' code can do only in a one-head
model, so a null with more heads is refused by name, as is an odd or too wide one).
The base is 10000 in transformers' code, which reads no ``rope_theta`` nor
``rope_scaling``: either in a config changes nothing, and is ignored here too.

transformers' GPT-J computes its sine and cosine table in float32 (a buffer of every
position) and its own eager attention takes Q·Kᵀ and the softmax in float32 even in a
float64 model. The import runs the model through its float64 eager attention (the
attention interface, which 5.x's GPT-J goes through) and with the sine and cosine
computed in the model's dtype in every layer, so that a float64 import is float64
throughout.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from attnviz.core.maths.scenario import Settings, from_heads
from attnviz.core.models.families.base import Config, Family
from attnviz.core.models.hf_layer import (
    ImportedLayer,
    _heads,
    _imported,
    _numpy,
    _run,
    swapped_forwards,
)

BASE = 10000.0  # transformers' create_sinusoidal_positions


def check_config(config: Config) -> str:
    width = config.get("n_embd", config.get("hidden_size", 4096))  # either name loads
    heads = config.get("n_head", config.get("num_attention_heads", 16))
    if not (isinstance(width, int) and isinstance(heads, int) and heads > 0):
        return ""  # transformers refuses such a config itself
    d_k = width // heads
    dims = config.get("rotary_dim", 64)
    if dims is None:
        if heads > 1:
            return (
                f"GPT-J rotary_dim null with {heads} heads is not supported (transformers "
                "turns all n_embd features, which fits a one-head model only)"
            )
        return ""
    if not isinstance(dims, int) or dims <= 0 or dims % 2 or dims > d_k:
        return (
            f"GPT-J rotary_dim {dims!r} is not supported (expected an even number from 2 "
            f"to the head's {d_k} features)"
        )
    return ""


def _rotary64(dims: int) -> Any:
    """A forward for GPT-J's rotary module: (sin, cos) of each position's angles, one per
    pair of the ``dims`` turned features, in float64 (transformers' table is float32)."""
    import torch

    inv_freq = torch.tensor(BASE ** (-np.arange(0, dims, 2, dtype=np.float64) / dims))

    def forward(x: Any, position_ids: Any) -> tuple[Any, Any]:
        angles = position_ids[..., None].double() * inv_freq.to(x.device)
        return angles.sin().to(x.dtype), angles.cos().to(x.dtype)

    return forward


def import_layer(model: Any, input_ids: Any, layer: int, tokens: tuple[str, ...]) -> ImportedLayer:
    config = model.config
    heads = config.num_attention_heads
    base = model.base_model
    module = base.h[layer].attn
    dims = config.rotary_dim or config.hidden_size
    with swapped_forwards({base.rotary_emb: _rotary64(dims)}):
        X_t, attention_out, out = _run(model, input_ids, module, module.out_proj)
    X = _numpy(X_t)
    (W_Q, _), (W_K, _), (W_V, _) = (
        _heads(_numpy(p.weight).T, None, heads)
        for p in (module.q_proj, module.k_proj, module.v_proj)
    )
    heads_list = [{"W_Q": W_Q[h], "W_K": W_K[h], "W_V": W_V[h]} for h in range(heads)]
    settings = Settings(
        mask="causal",
        positional="rope",
        rope_base=BASE,
        rope_style="interleaved",
        rope_dims=dims,
    )
    W_O = _numpy(module.out_proj.weight).T
    scenario = from_heads(tokens, X, heads_list, W_O, settings)
    return _imported(scenario, out, attention_out, "gptj", layer)


FAMILY = Family("GPT-J", ("gptj",), check_config, import_layer)
