"""GPT-2: causal, one fused Q/K/V projection (``Conv1D``, which stores W as attnviz does:
rows are inputs), biases everywhere.

Config options that change attention: ``scale_attn_weights`` (÷√d_k, on by default) and
``scale_attn_by_inverse_layer_idx`` (÷(layer + 1) more) are the scale attnviz has;
``reorder_and_upcast_attn`` only changes float32 rounding (the scores are taken in
float32 with the scale folded in), so in float64 it is the same maths and in float32 a
rounding difference; ``add_cross_attention`` (a decoder reading an encoder) is refused.
"""

from __future__ import annotations

from typing import Any

from attnviz.core.maths.scenario import Settings, from_heads
from attnviz.core.models.families.base import Config, Family, flag
from attnviz.core.models.hf_layer import ImportedLayer, _heads, _imported, _numpy, _run


def check_config(config: Config) -> str:
    if flag(config, "add_cross_attention"):
        return "GPT-2 add_cross_attention (a decoder that reads an encoder) is not supported"
    return ""


def scale(config: Any, layer: int, d_k: int) -> dict[str, Any]:
    """The score scale GPT-2 uses in ``layer``, as attnviz's settings (computed as
    transformers computes it)."""
    scaled = getattr(config, "scale_attn_weights", True)
    if not getattr(config, "scale_attn_by_inverse_layer_idx", False):
        return {} if scaled else {"scale": False}
    value = d_k**-0.5 if scaled else 1.0
    return {"scale_value": value / float(layer + 1)}


def prepare(model: Any) -> None:
    """transformers' reordered, upcast path refuses float64 tensors (it insists on a
    float32 softmax); in float64 it is the plain path's maths, which is taken instead."""
    import torch

    if model.dtype == torch.float64:
        for block in _blocks(model):
            block.attn.reorder_and_upcast_attn = False


def _blocks(model: Any) -> Any:
    return model.transformer.h if hasattr(model, "transformer") else model.h


def import_layer(model: Any, input_ids: Any, layer: int, tokens: tuple[str, ...]) -> ImportedLayer:
    config = model.config
    heads = config.num_attention_heads
    module = _blocks(model)[layer].attn
    X_t, attention_out, out = _run(model, input_ids, module, module.c_proj)
    X = _numpy(X_t)
    W = _numpy(module.c_attn.weight)  # Conv1D: (d_model, 3·d_model), rows are inputs
    b = _numpy(module.c_attn.bias)
    d_model = X.shape[1]
    (W_Q, b_Q), (W_K, b_K), (W_V, b_V) = (
        _heads(W[:, k * d_model : (k + 1) * d_model], b[k * d_model : (k + 1) * d_model], heads)
        for k in range(3)
    )
    heads_list = [
        {"W_Q": W_Q[h], "W_K": W_K[h], "W_V": W_V[h], "b_Q": b_Q[h], "b_K": b_K[h], "b_V": b_V[h]}
        for h in range(heads)
    ]
    settings = Settings(mask="causal", **scale(config, layer, W_Q.shape[2]))
    W_O, b_O = _numpy(module.c_proj.weight), _numpy(module.c_proj.bias)
    scenario = from_heads(tokens, X, heads_list, W_O, settings, b_O=b_O)
    return _imported(scenario, out, attention_out, "gpt2", layer)


FAMILY = Family(
    "GPT-2",
    ("gpt2",),
    check_config,
    import_layer,
    prepare,
    stale_buffers=(r"\.attn\.bias$", r"\.attn\.masked_bias$"),  # the causal mask, −10⁴
)
