"""ModernBERT: bidirectional, one fused ``Wqkv`` projection, RoPE with one base for the
global layers and another for the local ones, the local layers attending to a band.

Config options that change attention: ``attention_bias`` (biases on ``Wqkv`` and ``Wo``,
modelled; ModernBERT's checkpoints have none), ``layer_types`` or, before it,
``global_attn_every_n_layers`` (which layers are global, "full_attention", and which
local, "sliding_attention"; another type is refused by name), ``local_attention`` (the
local band: query i sees key j when |i − j| ≤ local_attention // 2, transformers'
bidirectional sliding-window mask; a custom mask in the scenario), ``rope_parameters``
per layer type or, before it, ``global_rope_theta`` / ``local_rope_theta`` (the bases;
RoPE types but the default are refused by name), ``head_dim`` (refused when it is not
hidden_size / num_attention_heads: transformers' attention ignores it while its RoPE
reads it). ``is_decoder`` is ignored, as transformers' ModernBERT ignores it (it is never
causal); the norms' ``norm_bias`` / ``norm_eps`` act before attention, which X holds.

transformers keeps the rotary angles in float32 and applies the rotation to float32
copies of Q and K even in a float64 model; the import computes the angles from float64
frequencies and rotates Q and K in the model's own dtype, in every layer, so that a
float64 import is float64 throughout. Its eager softmax (float32) is replaced by the
registered eager attention that keeps the model's dtype, as for every family.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

import numpy as np

from attnviz.core.maths.scenario import Settings
from attnviz.core.models.families.base import Config, Family, rope_problem
from attnviz.core.models.hf_layer import (
    ImportedLayer,
    _heads,
    _imported,
    _numpy,
    _run,
    layer_scenario,
    swapped_forwards,
    swapped_names,
)

LAYER_TYPES = ("full_attention", "sliding_attention")
THETA = {"full_attention": 160_000.0, "sliding_attention": 10_000.0}  # transformers' defaults
OLD_THETA = {"full_attention": "global_rope_theta", "sliding_attention": "local_rope_theta"}


def check_config(config: Config) -> str:
    problem = rope_problem(config, ("default",))
    if problem:
        return f"ModernBERT {problem}"
    for kind in config.get("layer_types") or ():
        if kind not in LAYER_TYPES:
            return f"ModernBERT layer type {kind!r} is not supported ({', '.join(LAYER_TYPES)})"
    head_dim, hidden, heads = (
        config.get(k) for k in ("head_dim", "hidden_size", "num_attention_heads")
    )
    if head_dim is None or not isinstance(hidden, int) or not isinstance(heads, int) or heads < 1:
        return ""  # (transformers refuses a config without the sizes when it builds the model)
    if head_dim != hidden // heads:
        return (
            f"ModernBERT head_dim {head_dim} (not hidden_size / num_attention_heads, "
            f"{hidden // heads}) is not supported: transformers' attention ignores it "
            "while its RoPE reads it"
        )
    return ""


def theta(config: Any, kind: str) -> float:
    """The RoPE base of layers of type ``kind``, as the model's config holds it."""
    parameters = (getattr(config, "rope_parameters", None) or {}).get(kind) or {}
    old = getattr(config, OLD_THETA[kind], None)
    return float(parameters.get("rope_theta", old if old is not None else THETA[kind]))


def frequencies(base: float, dims: int) -> np.ndarray:
    """RoPE's frequency for each pair, base^(−2i/d), in float64."""
    pairs: np.ndarray = base ** (-np.arange(0, dims, 2, dtype=np.float64) / dims)
    return pairs


def band(n: int, half_width: int) -> np.ndarray:
    """A local layer's mask: query i sees key j when |i − j| ≤ half_width (1 = may attend)."""
    i = np.arange(n)
    mask: np.ndarray = (np.abs(i[:, None] - i[None, :]) <= half_width).astype(np.float64)
    return mask


def _rotary64(rotary: Any, config: Any, dims: int) -> Any:
    """A forward for ModernBERT's rotary embedding that keeps its angles in float64."""
    import torch

    inv = {kind: torch.tensor(frequencies(theta(config, kind), dims)) for kind in LAYER_TYPES}

    def forward(x: Any, position_ids: Any, layer_type: str) -> tuple[Any, Any]:
        freqs = position_ids[..., None].double() * inv[layer_type].to(x.device)
        emb = torch.cat((freqs, freqs), dim=-1)
        scale = getattr(rotary, f"{layer_type}_attention_scaling", 1.0)
        return (emb.cos() * scale).to(x.dtype), (emb.sin() * scale).to(x.dtype)

    return forward


def _rotation_in_own_dtype() -> AbstractContextManager[None]:
    """transformers' ModernBERT rotates float32 copies of Q and K: while inside, it
    rotates them in their own dtype (the same maths, without the float32 step)."""
    from transformers.models.modernbert import modeling_modernbert as code

    def rotate(q: Any, k: Any, cos: Any, sin: Any, unsqueeze_dim: int = 1) -> tuple[Any, Any]:
        cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
        return q * cos + code.rotate_half(q) * sin, k * cos + code.rotate_half(k) * sin

    return swapped_names(code, {"apply_rotary_pos_emb": rotate})


def import_layer(model: Any, input_ids: Any, layer: int, tokens: tuple[str, ...]) -> ImportedLayer:
    config = model.config
    heads = config.num_attention_heads
    base = model.base_model
    module = base.layers[layer].attn
    d = module.head_dim
    kind = config.layer_types[layer]
    with (
        swapped_forwards({base.rotary_emb: _rotary64(base.rotary_emb, config, d)}),
        _rotation_in_own_dtype(),
    ):
        X_t, attention_out, out = _run(model, input_ids, module, module.Wo)
    X = _numpy(X_t)
    W = _numpy(module.Wqkv.weight).T  # (d_model, 3 · heads · d): Q, then K, then V
    b = None if module.Wqkv.bias is None else _numpy(module.Wqkv.bias)
    width = heads * d
    q, k, v = (
        _heads(
            W[:, k * width : (k + 1) * width],
            None if b is None else b[k * width : (k + 1) * width],
            heads,
        )
        for k in range(3)
    )
    local = kind == "sliding_attention"
    settings = Settings(
        mask="custom" if local else "none", positional="rope", rope_base=theta(config, kind)
    )
    band_mask = band(X.shape[0], int(config.sliding_window)) if local else None
    scenario = layer_scenario(tokens, X, (q, k, v), module.Wo, settings, mask_matrix=band_mask)
    return _imported(scenario, out, attention_out, config.model_type, layer)


FAMILY = Family("ModernBERT", ("modernbert",), check_config, import_layer, causal=False)
