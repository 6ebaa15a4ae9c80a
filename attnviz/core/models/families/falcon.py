"""Falcon: causal; one fused Q/K/V projection (``query_key_value``) in one of three
layouts; RoPE (half-split pairs) or ALiBi; a LayerNorm before attention.

Config options that change attention, and what is done with each:

- ``new_decoder_architecture`` with ``num_kv_heads``: key/value heads shared by groups
  of query heads; the fused rows are, for each key/value head, its group's queries,
  then its key, then its value. ``multi_query`` (without it): one key/value head; the
  rows are every query head, then the key, then the value. Neither: one key and value
  per head, the rows per head as Q, K, V. Modelled, each layout read as
  ``FalconAttention.forward`` splits it. A ``num_kv_heads`` other than the head count
  with neither is refused by name (transformers' fused layout then has one key per
  head and its attention fails).
- RoPE: ``rope_parameters`` / ``rope_scaling`` of type default, ``linear`` and
  ``llama3``, whose frequencies are the Llama family's own (``llama.rope_frequencies``,
  float64); other types are refused by name. (With ALiBi, RoPE is not applied and its
  settings change nothing.)
- ``alibi``: Falcon's ALiBi is folded into the mask as (slope·j)/√d for key position j,
  added to the scores Q·Kᵀ/√d; under the causal mask that is −(slope/√d)·|i − j| plus
  one constant per query row, which softmax cancels: the scenario has ALiBi with slopes
  slope/√d. The slopes are BLOOM's formula, but transformers rounds each slope to
  bfloat16 and multiplies in bfloat16, so slope·j is rounded to 8 significant bits:
  with more than 8 heads the slopes are no powers of two and slope·j is not linear in
  j (e.g. 2^(−1/2)·3 becomes 2.125), so those configs are refused by name; with at most
  8 heads the slopes are powers of two and slope·j is exact up to position 256, and a
  longer text is refused by name.
- ``bias``: Q/K/V and output biases (modelled; zero when off).
- ``parallel_attn`` and ``num_ln_in_parallel_attn`` change only how the block adds the
  MLP and which LayerNorm feeds it: X is what the attention receives either way.

The attention goes through transformers' attention interface (its softmax kept in the
model's dtype by the import's eager attention); the rotary angles are lifted to the
model's dtype, as the Llama family's are; the LayerNorms and the ALiBi term are computed
in the model's dtype already, so a float64 import is float64 throughout.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from attnviz.core.maths.scenario import ScenarioError, Settings
from attnviz.core.models.families.base import Config, Family, flag, rope_problem
from attnviz.core.models.families.bloom import slopes64
from attnviz.core.models.families.llama import FIXED_ROPE_TYPES, rope_frequencies
from attnviz.core.models.hf_layer import (
    ImportedLayer,
    _imported,
    _numpy,
    _rope64,
    _run,
    layer_scenario,
    swapped_forwards,
)

ALIBI_MOST_HEADS = 8  # more: slopes that are no powers of two, rounded products
ALIBI_MOST_POSITION = 256  # a power-of-two slope times a larger position may round


def check_config(config: Config) -> str:
    heads = config.get("num_attention_heads", 71)
    kv = config.get("num_kv_heads")
    one_key_per_head = not flag(config, "new_decoder_architecture") and not flag(
        config, "multi_query", True
    )
    if one_key_per_head and kv is not None and kv != heads:
        return (
            f"Falcon num_kv_heads {kv} without new_decoder_architecture or multi_query "
            f"is not supported (the fused layout has one key per head; {heads} heads)"
        )
    if flag(config, "alibi"):
        if isinstance(heads, int) and heads > ALIBI_MOST_HEADS:
            return (
                f"Falcon alibi with {heads} heads is not supported (transformers rounds "
                "each slope·position to bfloat16, which is not linear in the position "
                f"beyond {ALIBI_MOST_HEADS} heads)"
            )
        return ""
    return rope_problem(config, FIXED_ROPE_TYPES)


def _split(module: Any, heads: int) -> dict[str, np.ndarray]:
    """W_Q (heads, d_model, d), W_K and W_V (kv, d_model, d) and their biases, from the
    fused rows: for each key/value head, its queries, then its key, then its value."""
    kv, d = module.num_kv_heads, module.head_dim
    slots = heads // kv + 2
    W = _numpy(module.query_key_value.weight).T
    d_model = W.shape[0]
    W = W.reshape(d_model, kv, slots, d)
    bias = module.query_key_value.bias
    b = np.zeros((kv, slots, d)) if bias is None else _numpy(bias).reshape(kv, slots, d)
    return {
        "W_Q": W[:, :, :-2].reshape(d_model, heads, d).transpose(1, 0, 2),
        "W_K": W[:, :, -2].transpose(1, 0, 2),
        "W_V": W[:, :, -1].transpose(1, 0, 2),
        "b_Q": b[:, :-2].reshape(heads, 1, d),
        "b_K": b[:, -2][:, None],
        "b_V": b[:, -1][:, None],
    }


def _positional(config: Any, heads: int, d: int, rope: tuple[float, np.ndarray]) -> dict[str, Any]:
    if config.alibi:
        slopes = slopes64(heads).numpy() / math.sqrt(d)
        return {"positional": "alibi", "alibi_slopes": tuple(float(s) for s in slopes)}
    theta, frequencies = rope
    options: dict[str, Any] = {"positional": "rope", "rope_base": theta}
    kind = dict(getattr(config, "rope_parameters", None) or {}).get("rope_type", "default")
    if kind != "default":
        options["rope_frequencies"] = tuple(float(f) for f in frequencies)
    return options


def import_layer(model: Any, input_ids: Any, layer: int, tokens: tuple[str, ...]) -> ImportedLayer:
    config = model.config
    heads = config.num_attention_heads
    if config.alibi and input_ids.shape[1] > ALIBI_MOST_POSITION + 1:
        raise ScenarioError(
            f"Falcon alibi over {input_ids.shape[1]} tokens is not supported (transformers "
            f"rounds slope·position to bfloat16, not exact beyond position {ALIBI_MOST_POSITION})"
        )
    base = model.base_model
    module = base.h[layer].self_attention
    theta, frequencies, _ = rope_frequencies(config, 2 * base.rotary_emb.inv_freq.shape[0])
    with swapped_forwards({base.rotary_emb: _rope64(base.rotary_emb, frequencies)}):
        X_t, attention_out, out = _run(model, input_ids, module, module.dense)
    X = _numpy(X_t)
    parts = _split(module, heads)
    settings = Settings(
        mask="causal", **_positional(config, heads, module.head_dim, (theta, frequencies))
    )
    q, k, v = ((parts[f"W_{x}"], parts[f"b_{x}"]) for x in "QKV")
    scenario = layer_scenario(tokens, X, (q, k, v), module.dense, settings)
    return _imported(scenario, out, attention_out, "falcon", layer)


FAMILY = Family("Falcon", ("falcon",), check_config, import_layer)
