"""OPT: causal, separate Q/K/V and output projections with biases, learned positions.

OPT multiplies the query (its bias included) by 1/√d_k before Q·Kᵀ and passes a scale of
1 to the attention: (s·q)·k = s·(q·k), the same scores as attnviz's ÷√d_k after the
product, to rounding.

Config options that change attention: ``enable_bias`` (every projection's bias, or
none), ``do_layer_norm_before`` (true: X is the ``self_attn_layer_norm`` output; false,
as OPT-350m: the norm follows the residual addition, and X is the raw residual stream
the attention receives), ``word_embed_proj_dim`` other than ``hidden_size``
(``project_in`` maps the embeddings up before the first layer: X is what the attention
receives, after it), ``layer_norm_elementwise_affine`` and ``_remove_final_layer_norm``
(norms around, not in, the attention). Nothing in OPT's attention is refused.

transformers' OPT goes through the attention interface: the import's float64 eager
attention keeps the softmax, which OPT's own takes in float32, in the model's dtype.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from attnviz.core.maths.scenario import Settings, from_heads
from attnviz.core.models.families.base import Config, Family
from attnviz.core.models.hf_layer import ImportedLayer, _heads, _imported, _numpy, _run


def check_config(config: Config) -> str:
    return ""


def _decoder(model: Any) -> Any:
    return model.model.decoder if hasattr(model, "model") else model.decoder


def import_layer(model: Any, input_ids: Any, layer: int, tokens: tuple[str, ...]) -> ImportedLayer:
    config = model.config
    heads = config.num_attention_heads
    module = _decoder(model).layers[layer].self_attn
    X_t, attention_out, out = _run(model, input_ids, module, module.out_proj)
    X = _numpy(X_t)

    def part(linear: Any) -> tuple[np.ndarray, np.ndarray]:
        bias = None if linear.bias is None else _numpy(linear.bias)
        return _heads(_numpy(linear.weight).T, bias, heads)

    (W_Q, b_Q), (W_K, b_K), (W_V, b_V) = (
        part(p) for p in (module.q_proj, module.k_proj, module.v_proj)
    )
    heads_list = [
        {"W_Q": W_Q[h], "W_K": W_K[h], "W_V": W_V[h], "b_Q": b_Q[h], "b_K": b_K[h], "b_V": b_V[h]}
        for h in range(heads)
    ]
    o = module.out_proj
    b_O = np.zeros((1, X.shape[1])) if o.bias is None else _numpy(o.bias)[None]
    scenario = from_heads(
        tokens, X, heads_list, _numpy(o.weight).T, Settings(mask="causal"), b_O=b_O
    )
    return _imported(scenario, out, attention_out, "opt", layer)


FAMILY = Family("OPT", ("opt",), check_config, import_layer)
