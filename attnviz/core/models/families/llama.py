"""The Llama family: Llama, Mistral, Qwen2, Qwen3 and StarCoder2; causal, RoPE (half-split
pairs), key/value heads shared by groups of query heads.

Config options that change attention: ``rope_parameters`` / ``rope_scaling`` (the
default RoPE and every scaling type transformers gives these models: ``linear``, Llama
3.1's ``llama3``, ``yarn`` (beta_fast, beta_slow, truncate, mscale, mscale_all_dim,
attention_factor), ``dynamic`` (NTK: the base rescaled for a text longer than
max_position_embeddings) and ``longrope`` (short_factor / long_factor by the text's
length, attention_factor); each pair's frequency is recomputed in float64 for the text's
length and kept in the scenario with the factor on cos and sin; any other type is
refused by name: "proportional", and Phi-3's old name "su", on which transformers'
Llama fails),
``rope_theta``, ``head_dim``, ``attention_bias`` (Llama, Qwen3; Qwen2 always has Q, K,
V biases), StarCoder2's ``use_bias`` (Q, K, V and O biases), Mistral's and StarCoder2's
``sliding_window`` (every layer, when set; one as long as the text or longer is the
causal mask), Qwen2's and Qwen3's ``use_sliding_window``,
``max_window_layers`` and ``layer_types`` (a window in the layers they name), Qwen3's
QK-norm and ``rms_norm_eps``. Llama's code reads no ``sliding_window``: a stray one in
its config changes nothing, and is ignored here too.

transformers keeps the RMS norms and the rotary angles in float32 even in a float64
model; the import runs every layer's norms (input, post-attention, QK and final) and the
angles in the model's own dtype, so that a float64 import is float64 throughout.
StarCoder2's norms are torch's LayerNorm, which stays in the model's dtype (its
``norm_epsilon`` is the model's own); its MLP (c_fc, c_proj) comes after attention.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from attnviz.core.maths.scenario import Settings
from attnviz.core.models.families.base import Config, Family, rope_problem
from attnviz.core.models.hf_layer import (
    ImportedLayer,
    _imported,
    _norm64,
    _numpy,
    _rope64,
    _run,
    layer_scenario,
    separate_qkv,
    shared_norm,
    swapped_forwards,
)

MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "starcoder2")
# RoPE types whose frequencies depend on the config alone, with cos and sin unscaled:
# other families import these through ``rope_frequencies`` without a factor or a length
FIXED_ROPE_TYPES = ("default", "linear", "llama3")
ROPE_TYPES = (*FIXED_ROPE_TYPES, "yarn", "dynamic", "longrope")


def check_config(config: Config) -> str:
    window = config.get("sliding_window")
    every_layer = config.get("model_type") in ("mistral", "starcoder2")
    if every_layer and isinstance(window, (int, float)) and window < 1 and window is not False:
        return f"{config['model_type']} sliding_window {window!r} hides every key"
    return rope_problem(config, ROPE_TYPES)


def rope_frequencies(
    config: Any, dims: int, length: int | None = None
) -> tuple[float, np.ndarray, float]:
    """RoPE's base, each pair's frequency (radians per position) and the factor on cos and
    sin, in float64, as transformers' rope init computes them for the config's type and a
    text of ``length`` tokens (the dynamic and longrope types depend on it)."""
    rope = dict(getattr(config, "rope_parameters", None) or {})
    theta = float(rope.get("rope_theta", getattr(config, "rope_theta", 10000.0)))
    freq = theta ** (-np.arange(0, dims, 2, dtype=np.float64) / dims)
    scaled = _SCALED.get(_rope_type(config))
    if scaled is None:
        return theta, freq, 1.0
    return scaled(_Rope(rope, config, theta, freq, dims, length))


@dataclass(frozen=True)
class _Rope:
    """What a scaled RoPE's frequencies are computed from."""

    parameters: dict[str, Any]  # config.rope_parameters
    config: Any
    theta: float
    freq: np.ndarray  # the base's: theta^(−2i/dims)
    dims: int
    length: int | None  # the text's tokens

    def context(self) -> float:
        """The positions the model was trained on before it was scaled: as transformers
        reads it, the config's own original_max_position_embeddings (Phi-3's), else the
        RoPE parameters', else max_position_embeddings."""
        context = getattr(self.config, "original_max_position_embeddings", None)
        if context is None:
            context = self.parameters.get("original_max_position_embeddings")
        if context is None:
            context = self.config.max_position_embeddings
        return float(context)

    def factor(self) -> float:
        """``factor``; absent (YaRN, longrope): max_position_embeddings / context."""
        factor = self.parameters.get("factor")
        if factor is None:
            return float(self.config.max_position_embeddings) / self.context()
        return float(factor)


def _linear(r: _Rope) -> tuple[float, np.ndarray, float]:
    """Every frequency divided by ``factor``."""
    return r.theta, r.freq / r.factor(), 1.0


def _llama3(r: _Rope) -> tuple[float, np.ndarray, float]:
    """Llama 3.1's: long wavelengths divided by ``factor``, short ones kept, smoothed
    between."""
    factor, low, high = (
        float(r.parameters[k]) for k in ("factor", "low_freq_factor", "high_freq_factor")
    )
    freq, context = r.freq, r.context()
    wavelength = 2 * np.pi / freq
    scaled = np.where(wavelength > context / low, freq / factor, freq)
    smooth = (context / wavelength - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelength < context / high) & ~(wavelength > context / low)
    return r.theta, np.where(medium, smoothed, scaled), 1.0


def _mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's attention scale for ``factor``: 0.1·mscale·ln(factor) + 1 (1 when factor ≤ 1)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def _yarn(r: _Rope) -> tuple[float, np.ndarray, float]:
    """YaRN: pairs that turn fewer than ``beta_slow`` times over the original context are
    interpolated (divided by ``factor``), those that turn more than ``beta_fast`` times
    keep their frequency, a linear ramp over the pairs between; cos and sin times
    ``attention_factor`` (else mscale / mscale_all_dim, else 0.1·ln(factor) + 1)."""
    p, factor, context, dims = r.parameters, r.factor(), r.context(), r.dims
    attention = p.get("attention_factor")
    if attention is None:
        mscale, mscale_all_dim = p.get("mscale"), p.get("mscale_all_dim")
        attention = (
            _mscale(factor, mscale) / _mscale(factor, mscale_all_dim)
            if mscale and mscale_all_dim
            else _mscale(factor)
        )

    def pair(rotations: float) -> float:  # the pair that turns this often over the context
        return dims * math.log(context / (rotations * 2 * math.pi)) / (2 * math.log(r.theta))

    low, high = pair(float(p.get("beta_fast") or 32)), pair(float(p.get("beta_slow") or 1))
    if p.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dims - 1)
    if low == high:
        high += 0.001  # as transformers does
    ramp = np.clip((np.arange(dims // 2, dtype=np.float64) - low) / (high - low), 0.0, 1.0)
    return r.theta, r.freq / factor * ramp + r.freq * (1 - ramp), float(attention)


def _dynamic(r: _Rope) -> tuple[float, np.ndarray, float]:
    """Dynamic NTK: a text no longer than max_position_embeddings has the base's
    frequencies; a longer one (n tokens) a base rescaled to
    theta·(factor·n/max − (factor − 1))^(dims/(dims − 2))."""
    most = int(r.config.max_position_embeddings)
    if r.length is None or r.length <= most:
        return r.theta, r.freq, 1.0
    factor = float(r.parameters["factor"])
    base = r.theta * (factor * r.length / most - (factor - 1)) ** (r.dims / (r.dims - 2))
    return base, base ** (-np.arange(0, r.dims, 2, dtype=np.float64) / r.dims), 1.0


def _longrope(r: _Rope) -> tuple[float, np.ndarray, float]:
    """LongRoPE (Phi-3): each frequency divided by its ``short_factor``, or by its
    ``long_factor`` for a text longer than the original context; cos and sin times
    ``attention_factor``, else √(1 + ln(factor)/ln(context)) (1 when factor ≤ 1)."""
    context, factor = r.context(), r.factor()
    attention = r.parameters.get("attention_factor")
    if attention is None:
        attention = 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(context))
    long = r.length is not None and r.length > context
    ext = np.asarray(r.parameters["long_factor" if long else "short_factor"], dtype=np.float64)
    return r.theta, r.freq / ext, float(attention)


_SCALED: dict[str, Callable[[_Rope], tuple[float, np.ndarray, float]]] = {
    "linear": _linear,
    "llama3": _llama3,
    "yarn": _yarn,
    "dynamic": _dynamic,
    "longrope": _longrope,
}


def _rope_type(config: Any) -> str:
    rope = dict(getattr(config, "rope_parameters", None) or {})
    return str(rope.get("rope_type", rope.get("type", "default")))


def _window(config: Any, layer: int) -> int | None:
    """The sliding window the model's mask applies in ``layer`` (None: plain causal)."""
    if config.model_type in ("mistral", "starcoder2"):  # every layer, when the config sets one
        window = getattr(config, "sliding_window", None)
    elif config.model_type in ("qwen2", "qwen3"):
        types = getattr(config, "layer_types", None) or ()
        sliding = layer < len(types) and types[layer] == "sliding_attention"
        window = getattr(config, "sliding_window", None) if sliding else None
    else:
        window = None  # Llama's mask is causal whatever the config says
    return int(window) if window else None


def mask_settings(window: int | None, n: int) -> dict[str, Any]:
    """The scenario's mask for a model's sliding ``window`` (None: none) over n tokens: a
    window of n or more hides no key a causal mask shows (query i sees i − window < j ≤ i),
    so it is the causal mask (and a window of Phi-4-mini's 262,144 fits no scenario)."""
    if window is None or window >= n:
        return {"mask": "causal"}
    return {"mask": "sliding-window", "window": window}


def _lifted(model: Any, frequencies: np.ndarray, factor: float) -> dict[Any, Any]:
    """Forwards that keep every float32 step of the model in its own dtype: the rotary
    angles (with these frequencies and factor on cos and sin) and every RMS norm (each
    layer's input, post-attention and QK norms, the final norm)."""
    base = model.base_model
    forwards = {base.rotary_emb: _rope64(base.rotary_emb, frequencies, factor)}
    for module in model.modules():
        if type(module).__name__.endswith("RMSNorm"):
            forwards[module] = _norm64(module)
    return forwards


def run_rotary(
    model: Any, input_ids: Any, entry: Any, projection: Any
) -> tuple[tuple[Any, Any, Any], dict[str, Any]]:
    """Run the model (as ``_run``) with its RoPE and RMS norms lifted into its own dtype,
    and return the run with the scenario's RoPE settings: the base, and for a scaled RoPE
    each pair's frequency for this text and the factor on cos and sin."""
    config = model.config
    base = model.base_model
    dims = 2 * base.rotary_emb.inv_freq.shape[0]
    theta, frequencies, factor = rope_frequencies(config, dims, int(input_ids.shape[1]))
    with swapped_forwards(_lifted(model, frequencies, factor)):
        ran = _run(model, input_ids, entry, projection)
    settings: dict[str, Any] = {"positional": "rope", "rope_base": theta}
    if dims < getattr(entry, "head_dim", dims):  # partial rotary: the leading features
        settings["rope_dims"] = dims
    if getattr(config, "rope_parameters", None) and _rope_type(config) != "default":
        settings |= {
            "rope_frequencies": tuple(float(f) for f in frequencies),
            "rope_factor": factor,
        }
    return ran, settings


def import_layer(model: Any, input_ids: Any, layer: int, tokens: tuple[str, ...]) -> ImportedLayer:
    config = model.config
    heads, kv = config.num_attention_heads, config.num_key_value_heads
    base = model.base_model
    module = base.layers[layer].self_attn
    (X_t, attention_out, out), rope = run_rotary(model, input_ids, module, module.o_proj)
    X = _numpy(X_t)

    qkv = separate_qkv(module, heads, kv)
    options = mask_settings(_window(config, layer), X.shape[0])
    qk: dict[str, Any] = {}
    if hasattr(module, "q_norm"):  # Qwen3: one weight per feature of d_k, shared by every head
        qk = {
            "q_norm": shared_norm(module.q_norm.weight, heads),
            "k_norm": shared_norm(module.k_norm.weight, kv),
        }
        options |= {"qk_norm": "rms", "qk_norm_eps": float(module.q_norm.variance_epsilon)}
    settings = Settings(**rope, **options)
    scenario = layer_scenario(tokens, X, qkv, module.o_proj, settings, **qk)
    return _imported(scenario, out, attention_out, config.model_type, layer)


FAMILY = Family("the Llama family", MODEL_TYPES, check_config, import_layer)
