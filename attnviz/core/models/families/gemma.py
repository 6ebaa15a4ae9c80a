"""The Gemma family: Gemma, Gemma 2 and Gemma 3's text model (``gemma``, ``gemma2``,
``gemma3_text``); causal, RoPE (half-split pairs), key/value heads shared by groups of
query heads (GQA, MQA).

Config options that change attention, and what the import does with each:

- ``head_dim`` (need not be hidden_size / heads), ``num_key_value_heads`` and
  ``attention_bias`` (biases on Q, K, V and O): modelled.
- the scale: Gemma multiplies the scores by head_dim^−½; Gemma 2 and 3 by
  ``query_pre_attn_scalar``^−½, kept as the scenario's ``scale_value``.
- ``attn_logit_softcapping`` (Gemma 2): scores soft-capped after the scale,
  c·tanh(s/c), as the scenario's ``softcap``. Gemma 3's attention never passes it, so
  there it changes nothing and is ignored here too; ``final_logit_softcapping`` caps the
  logits, not attention.
- ``layer_types`` and ``sliding_window`` (Gemma 2 and 3; without ``layer_types`` Gemma 2
  slides in every other layer from the first, and Gemma 3 in all but every
  ``sliding_window_pattern``-th, 6 by default): the layers that slide get a
  sliding-window mask, query i seeing keys i − window < j ≤ i as transformers' mask does;
  a window longer than a scenario can be (2,048 tokens) is kept at that length, which
  hides nothing more. A null ``sliding_window`` and layer types other than
  ``full_attention`` and ``sliding_attention`` are refused. Gemma's code reads no
  ``sliding_window``: a stray one changes nothing.
- RoPE: ``rope_parameters`` / ``rope_scaling`` / ``rope_theta`` (the default RoPE and
  ``linear`` scaling, frequencies recomputed in float64 and kept in the scenario; other
  types refused by name); Gemma 3's two bases: ``rope_local_base_freq`` (or
  ``rope_parameters["sliding_attention"]``) in the sliding layers, the global base (and
  its scaling) in the others. ``partial_rotary_factor`` other than 1 is refused.
- Gemma 3's QK-norm: an RMS norm of each head's Q and K times (1 + weight), eps
  ``rms_norm_eps``: the scenario's QK-norm "rms" with weights 1 + weight per head.
- ``use_bidirectional_attention`` and ``is_causal`` false (attention to later tokens) are
  refused by name, as is Gemma 3's multimodal model (``gemma3``: it has no family here).

transformers keeps Gemma's RMS norms (which multiply by 1 + weight), the rotary angles
and the softmax in float32 even in a float64 model, and multiplies the embeddings by
√hidden_size rounded to float32; the import runs every layer's norms (input,
post-attention, feed-forward, QK and final), the angles and the embedding scale in the
model's own dtype, so that a float64 import is float64 throughout.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np

from attnviz.core.maths.scenario import LIMITS, Settings
from attnviz.core.models.families.base import ROPE_KEYS, Config, Family, flag, rope_problem
from attnviz.core.models.families.llama import rope_frequencies
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

MODEL_TYPES = ("gemma", "gemma2", "gemma3_text")
ROPE_TYPES = ("default", "linear")  # the RoPE variants this family imports
LAYER_TYPES = ("full_attention", "sliding_attention")
NAMES = {"gemma": "Gemma", "gemma2": "Gemma 2", "gemma3_text": "Gemma 3"}


def check_config(config: Config) -> str:
    name = NAMES.get(str(config.get("model_type")), "Gemma")
    if flag(config, "use_bidirectional_attention"):
        return f"{name} use_bidirectional_attention (attention to later tokens) is not supported"
    if not flag(config, "is_causal", default=True):
        return f"{name} is_causal false (attention to later tokens) is not supported"
    if config.get("model_type") != "gemma":  # Gemma 2 and 3 build a sliding mask always
        if "sliding_window" in config and config["sliding_window"] is None:
            return f"{name} sliding_window null is not supported (transformers needs one)"
        for kind in config.get("layer_types") or ():
            if kind not in LAYER_TYPES:
                return f"{name} layer type {kind!r} is not supported"
    return rope_problem(config, ROPE_TYPES) or _partial_rotary(config, name)


def _partial_rotary(config: Config, name: str) -> str:
    """partial_rotary_factor, top-level or in any set of RoPE parameters, other than 1."""
    factors = [config.get("partial_rotary_factor")]
    for key in ROPE_KEYS:
        rope = config.get(key)
        if isinstance(rope, dict):
            sets = [v for v in rope.values() if isinstance(v, dict)] or [rope]
            factors += [s.get("partial_rotary_factor") for s in sets]
    other = [f for f in factors if f not in (None, 1)]
    return f"{name} partial_rotary_factor {other[0]!r} is not supported" if other else ""


def _rope(config: Any) -> dict[str | None, tuple[float, np.ndarray, str]]:
    """Each kind of layer's RoPE base, frequencies (float64) and type: Gemma 3 has one
    set per layer type (its rotary module is asked for one by name), Gemma and Gemma 2
    one for every layer (under None)."""
    dims = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    if config.model_type != "gemma3_text":
        sets = {None: dict(config.rope_parameters)}
    else:
        sets = {kind: dict(config.rope_parameters[kind]) for kind in set(config.layer_types)}
    out: dict[str | None, tuple[float, np.ndarray, str]] = {}
    for kind, rope in sets.items():
        theta, frequencies, _ = rope_frequencies(SimpleNamespace(rope_parameters=rope), dims)
        out[kind] = theta, frequencies, str(rope.get("rope_type", "default"))
    return out


def _lifted(model: Any, rope: dict[str | None, tuple[float, np.ndarray, str]]) -> dict[Any, Any]:
    """Forwards that keep every float32 step of the model in its own dtype: the rotary
    angles (of each layer type), the embedding scale and every RMS norm (each layer's
    input, post-attention, feed-forward and QK norms, the final norm), which multiplies
    by 1 + weight."""
    import torch

    base = model.base_model
    by_type = {kind: _rope64(base.rotary_emb, f) for kind, (_, f, _) in rope.items()}

    def angles(x: Any, position_ids: Any, layer_type: str | None = None) -> Any:
        return by_type[layer_type](x, position_ids)

    embed = base.embed_tokens

    def embedding(input_ids: Any) -> Any:  # √hidden_size in float64, not float32
        return torch.nn.Embedding.forward(embed, input_ids) * embed.scalar_embed_scale

    forwards = {base.rotary_emb: angles, embed: embedding}
    for module in model.modules():
        if type(module).__name__.endswith("RMSNorm"):
            forwards[module] = _norm64(module, shift=1.0)
    return forwards


def _window(config: Any, layer: int) -> int | None:
    """The sliding window the model's mask applies in ``layer`` (None: plain causal)."""
    if config.model_type == "gemma" or config.layer_types[layer] != "sliding_attention":
        return None
    return min(int(config.sliding_window), LIMITS.tokens)


def _settings(config: Any, layer: int, rope: tuple[float, np.ndarray, str]) -> dict[str, Any]:
    """The scenario's settings for ``layer``: mask, RoPE, scale and soft-cap."""
    theta, frequencies, kind = rope
    window = _window(config, layer)
    options: dict[str, Any] = {"positional": "rope", "rope_base": theta}
    options |= {"mask": "sliding-window", "window": window} if window else {"mask": "causal"}
    if kind != "default":
        options["rope_frequencies"] = tuple(float(f) for f in frequencies)
    if config.model_type != "gemma":
        options["scale_value"] = float(config.query_pre_attn_scalar) ** -0.5
    if config.model_type == "gemma2" and config.attn_logit_softcapping is not None:
        options["softcap"] = float(config.attn_logit_softcapping)
    return options


def import_layer(model: Any, input_ids: Any, layer: int, tokens: tuple[str, ...]) -> ImportedLayer:
    config = model.config
    heads, kv = config.num_attention_heads, config.num_key_value_heads
    base = model.base_model
    module = base.layers[layer].self_attn
    rope = _rope(config)
    with swapped_forwards(_lifted(model, rope)):
        X_t, attention_out, out = _run(model, input_ids, module, module.o_proj)
    X = _numpy(X_t)

    qkv = separate_qkv(module, heads, kv)
    kind = config.layer_types[layer] if config.model_type == "gemma3_text" else None
    options = _settings(config, layer, rope[kind])
    qk: dict[str, Any] = {}
    if hasattr(module, "q_norm"):  # Gemma 3: 1 + weight per feature of d_k, every head
        qk = {
            "q_norm": shared_norm(module.q_norm.weight, heads, shift=1.0),
            "k_norm": shared_norm(module.k_norm.weight, kv, shift=1.0),
        }
        options |= {"qk_norm": "rms", "qk_norm_eps": float(module.q_norm.eps)}
    scenario = layer_scenario(tokens, X, qkv, module.o_proj, Settings(**options), **qk)
    return _imported(scenario, out, attention_out, config.model_type, layer)


FAMILY = Family("the Gemma family", MODEL_TYPES, check_config, import_layer)
