"""The Llama family: Llama, Mistral, Qwen2 and Qwen3; causal, RoPE (half-split pairs),
key/value heads shared by groups of query heads.

Config options that change attention: ``rope_parameters`` / ``rope_scaling`` (the
default RoPE, ``linear`` and Llama 3.1's ``llama3``, whose frequencies are recomputed in
float64 and kept in the scenario; other scaling types are refused by name),
``rope_theta``, ``head_dim``, ``attention_bias`` (Llama, Qwen3; Qwen2 always has Q, K,
V biases), Mistral's
``sliding_window`` (every layer), Qwen2's and Qwen3's ``use_sliding_window``,
``max_window_layers`` and ``layer_types`` (a window in the layers they name), Qwen3's
QK-norm and ``rms_norm_eps``. Llama's code reads no ``sliding_window``: a stray one in
its config changes nothing, and is ignored here too.

transformers keeps the RMS norms and the rotary angles in float32 even in a float64
model; the import runs every layer's norms (input, post-attention, QK and final) and the
angles in the model's own dtype, so that a float64 import is float64 throughout.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from attnviz.core.maths.scenario import Scenario, Settings, head_stack
from attnviz.core.models.families.base import Config, Family, rope_problem
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

MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
ROPE_TYPES = ("default", "linear", "llama3")  # the RoPE variants this family imports


def check_config(config: Config) -> str:
    return rope_problem(config, ROPE_TYPES)


def rope_frequencies(config: Any, dims: int) -> tuple[float, np.ndarray]:
    """RoPE's base and each pair's frequency, in float64, as transformers' rope init
    computes them for the config's type: the base's, divided by ``factor`` (linear), or
    Llama 3.1's (long wavelengths divided by ``factor``, short ones kept, smoothed
    between)."""
    rope = dict(getattr(config, "rope_parameters", None) or {})
    theta = float(rope.get("rope_theta", getattr(config, "rope_theta", 10000.0)))
    freq = theta ** (-np.arange(0, dims, 2, dtype=np.float64) / dims)
    kind = _rope_type(config)
    if kind == "linear":
        return theta, freq / float(rope["factor"])
    if kind == "llama3":
        factor, low, high = (
            float(rope[k]) for k in ("factor", "low_freq_factor", "high_freq_factor")
        )
        context = float(rope["original_max_position_embeddings"])
        wavelength = 2 * np.pi / freq
        scaled = np.where(wavelength > context / low, freq / factor, freq)
        smooth = (context / wavelength - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelength < context / high) & ~(wavelength > context / low)
        return theta, np.where(medium, smoothed, scaled)
    return theta, freq


def _rope_type(config: Any) -> str:
    rope = dict(getattr(config, "rope_parameters", None) or {})
    return str(rope.get("rope_type", rope.get("type", "default")))


def _window(config: Any, layer: int) -> int | None:
    """The sliding window the model's mask applies in ``layer`` (None: plain causal)."""
    if config.model_type == "mistral":
        window = getattr(config, "sliding_window", None)
    elif config.model_type in ("qwen2", "qwen3"):
        types = getattr(config, "layer_types", None) or ()
        sliding = layer < len(types) and types[layer] == "sliding_attention"
        window = getattr(config, "sliding_window", None) if sliding else None
    else:
        window = None  # Llama's mask is causal whatever the config says
    return int(window) if window else None


def _lifted(model: Any, frequencies: np.ndarray) -> dict[Any, Any]:
    """Forwards that keep every float32 step of the model in its own dtype: the rotary
    angles and every RMS norm (each layer's input, post-attention and QK norms, the
    final norm)."""
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
    theta, frequencies = rope_frequencies(config, 2 * base.rotary_emb.inv_freq.shape[0])
    with swapped_forwards(_lifted(model, frequencies)):
        X_t, attention_out, out = _run(model, input_ids, module, module.o_proj)
    X = _numpy(X_t)

    def part(linear: Any, count: int) -> tuple[np.ndarray, np.ndarray]:
        bias = None if linear.bias is None else _numpy(linear.bias)
        return _heads(_numpy(linear.weight).T, bias, count)

    W_Q, b_Q = part(module.q_proj, heads)
    W_K, b_K = part(module.k_proj, kv)
    W_V, b_V = part(module.v_proj, kv)
    o = module.o_proj
    b_O = np.zeros((1, X.shape[1])) if o.bias is None else _numpy(o.bias)[None]
    window = _window(config, layer)
    options: dict[str, Any] = (
        {"mask": "sliding-window", "window": window} if window else {"mask": "causal"}
    )
    scaled: dict[str, Any] = {}
    if getattr(config, "rope_parameters", None) and _rope_type(config) != "default":
        scaled = {"rope_frequencies": tuple(float(f) for f in frequencies)}
    qk: dict[str, Any] = {}
    if hasattr(module, "q_norm"):  # Qwen3: one weight per feature of d_k, shared by every head
        d = W_Q.shape[2]
        qk = {
            "q_norm": np.tile(_numpy(module.q_norm.weight).reshape(1, 1, d), (heads, 1, 1)),
            "k_norm": np.tile(_numpy(module.k_norm.weight).reshape(1, 1, d), (kv, 1, 1)),
        }
        options |= {"qk_norm": "rms", "qk_norm_eps": float(module.q_norm.variance_epsilon)}
    scenario = Scenario(
        tokens=tokens,
        X=X,
        W_Q=head_stack("W_Q", W_Q),
        W_K=head_stack("W_K", W_K),
        W_V=head_stack("W_V", W_V),
        W_O=_numpy(o.weight).T,
        settings=Settings(positional="rope", rope_base=theta, **options, **scaled),
        b_Q=head_stack("b_Q", b_Q),
        b_K=head_stack("b_K", b_K),
        b_V=head_stack("b_V", b_V),
        b_O=b_O,
        **qk,
    )
    return _imported(scenario, out, attention_out, config.model_type, layer)


FAMILY = Family("the Llama family", MODEL_TYPES, check_config, import_layer)
