"""MPT (MosaicML): causal, ALiBi (one slope per head), one fused Q/K/V projection, a
LayerNorm (weight, no bias) before attention, no biases anywhere.

How MPT adds ALiBi: ``build_mpt_alibi_tensor`` gives key position j the bias
slope·(j − L + 1) for ``max_seq_len`` L, and the attention keeps its last n columns for
an n-token text: the scores are Q·Kᵀ·scale + slope·(j − n + 1). Under the causal mask
j ≤ i, so −slope·|i − j| = slope·(j − n + 1) − slope·(i − n + 1): the two differ by one
constant per query row, which softmax cancels. The weights (and so the output) are the
same; the scenario has ALiBi with MPT's own slopes: for P the next power of two at or
above the head count, 2^(−k·8/P) for k = 1…P, then (when P is not the head count) the
even k first and the odd k after, the first n_heads of them: BLOOM's slopes, in the
same order, for any head count.

Config options that change attention (``attn_config``, a nested object, and the model's
own), and what is done with each:

- ``softmax_scale``: the scores' scale (scenario ``scale_value``); null: 1/√d_k.
- ``Wqkv``: the fused rows are every head's query, then every head's key, then every
  head's value (``chunk(3)``, then head by head): modelled.
- ``n_heads``: the slopes follow it, a power of two or not.
- ``no_bias``: transformers' MPT has no biases (Q/K/V, output, LayerNorms) whatever it
  says; ``no_bias`` false (a checkpoint with biases, which transformers would drop) is
  refused by name.
- ``alibi`` false: transformers' MPT adds ALiBi whatever it says, and has no learned
  positions; refused by name (the checkpoint was trained without ALiBi).
- ``alibi_bias_max``: transformers computes the slopes with 8 whatever it says
  (``MptModel.forward`` does not pass it on); any other value is refused by name.
- ``clip_qkv`` (Q, K and V clamped to ±clip_qkv: not a variant attnviz has), ``qk_ln``
  and llm-foundry's ``qk_gn`` (norms over the Q and K projections, which transformers'
  MPT does not apply), ``prefix_lm`` (the prefix sees itself both ways; transformers'
  MPT is causal), an ``attn_type`` other than ``multihead_attention`` (the only one
  transformers implements), and llm-foundry's ``rope``, ``sliding_window_size``,
  ``attn_logit_softcapping``, ``fused_qkv`` false and ``block_overrides`` (which
  transformers does not read): refused by name.
- ``attn_impl`` (torch, flash, triton: the same maths), ``attn_pdrop`` (dropout, off in
  evaluation), ``attn_uses_sequence_id`` (one text is one sequence) and
  ``learned_pos_emb`` (llm-foundry turns it off under ALiBi; transformers has none)
  change nothing.
- A text longer than ``max_seq_len`` is refused by name (transformers' ALiBi tensor
  has that many positions, and its attention fails beyond).

MPT's attention is its own code, not transformers' attention interface, and keeps two
steps in float32: the slopes (float32 powers of two) and the softmax
(``softmax(scores.float())``). The import runs the model with its module's
``build_mpt_alibi_tensor`` swapped for the same tensor computed in float64 and cast to
the model's dtype, and every layer's ``MptAttention.forward`` swapped for the same code
with the softmax taken in the wider of float32 and the scores' own dtype (float64 in a
float64 model, unchanged otherwise); so a float64 import is float64 throughout. The
causal mask fills the dtype's lowest number rather than −∞: exp of it underflows to
exactly 0.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from attnviz.core.maths.scenario import ScenarioError, Settings, from_heads
from attnviz.core.models.families.base import Config, Family, flag
from attnviz.core.models.hf_layer import (
    ImportedLayer,
    _imported,
    _numpy,
    _run,
    swapped_forwards,
    swapped_names,
)

ATTN_TYPE = "multihead_attention"  # the only attn_type transformers' MPT implements
ALIBI_BIAS_MAX = 8  # the slopes' exponent range transformers uses, whatever the config says
# attn_config switches that transformers' MPT does not read (or does not model here), each
# with the values (besides null) that leave attention alone: any other is refused by name
_NEUTRAL: dict[str, tuple[Any, ...]] = {
    "clip_qkv": (0,),  # transformers clamps when it is truthy
    "qk_ln": (False,),
    "qk_gn": (False,),
    "prefix_lm": (False,),
    "rope": (False,),
    "sliding_window_size": (-1,),
    "attn_logit_softcapping": (),
    "fused_qkv": (True,),
}
_WHY = {
    "clip_qkv": "clamping Q, K and V is not a variant attnviz has",
    "qk_ln": "a LayerNorm over the Q and K projections, which transformers' MPT does not apply",
    "qk_gn": "a norm over the Q and K projections, which transformers' MPT does not apply",
    "prefix_lm": "the prefix sees itself both ways; transformers' MPT is causal",
}


def _attention_problem(attn: Config) -> str:
    kind = attn.get("attn_type", ATTN_TYPE)
    if kind != ATTN_TYPE:
        return f"MPT attn_type {kind!r} is not supported (transformers implements {ATTN_TYPE})"
    for key, neutral in _NEUTRAL.items():
        value = attn.get(key)
        if value is not None and value not in neutral:
            why = _WHY.get(key, "transformers' MPT does not read it")
            return f"MPT attn_config {key} {value!r} is not supported ({why})"
    if not flag(attn, "alibi", True):
        return (
            "MPT alibi false is not supported (transformers' MPT adds ALiBi whatever it says, "
            "and has no learned positions)"
        )
    bias_max = attn.get("alibi_bias_max", ALIBI_BIAS_MAX)
    if bias_max is not None and bias_max != ALIBI_BIAS_MAX:
        return (
            f"MPT alibi_bias_max {bias_max!r} is not supported (transformers computes the "
            f"slopes with {ALIBI_BIAS_MAX} whatever it says)"
        )
    scale = attn.get("softmax_scale")
    if scale is not None and not (
        isinstance(scale, (int, float)) and not isinstance(scale, bool) and 0 < scale <= 1e9
    ):
        return f"MPT softmax_scale {scale!r} is not supported (expected a positive number)"
    return ""


def check_config(config: Config) -> str:
    attn = config.get("attn_config")
    if attn is not None and not isinstance(attn, dict):
        return f"config.json: MPT attn_config is {type(attn).__name__}; expected an object"
    if not flag(config, "no_bias", True):
        return (
            "MPT no_bias false is not supported (transformers' MPT has no biases and would "
            "drop the checkpoint's)"
        )
    if config.get("block_overrides"):
        return "MPT block_overrides is not supported (transformers' MPT does not read it)"
    return _attention_problem(attn or {})


def slopes64(num_heads: int, alibi_bias_max: float = ALIBI_BIAS_MAX) -> np.ndarray:
    """MPT's ALiBi slopes (``build_mpt_alibi_tensor``) in float64."""
    p = 2 ** math.ceil(math.log2(num_heads))
    exponents = np.arange(1, p + 1, dtype=np.float64) * (alibi_bias_max / p)
    slopes: np.ndarray = 1.0 / np.power(2.0, exponents)
    if p != num_heads:
        slopes = np.concatenate([slopes[1::2], slopes[::2]])[:num_heads]
    return slopes


def _alibi_tensor(dtype: Any) -> Any:
    """``build_mpt_alibi_tensor`` computed in float64, given in ``dtype``."""
    import torch

    def build(
        num_heads: int, sequence_length: int, alibi_bias_max: float = 8, device: Any = None
    ) -> Any:
        slopes = torch.tensor(slopes64(num_heads, alibi_bias_max), device=device)
        positions = torch.arange(1 - sequence_length, 1, dtype=torch.float64, device=device)
        return (slopes[:, None, None] * positions.view(1, 1, -1)).to(dtype)

    return build


def _attention64(attn: Any) -> Any:
    """``MptAttention.forward`` with the softmax in the wider of float32 and the scores'
    own dtype (transformers: ``softmax(scores.float())``); otherwise the same steps, but
    for ``clip_qkv`` (refused) and the dropout (off in evaluation)."""
    import torch

    def forward(
        hidden_states: Any,
        position_bias: Any,
        cache: Any = None,
        attention_mask: Any = None,
        **kwargs: Any,
    ) -> tuple[Any, Any]:
        batch, n = hidden_states.shape[:2]
        q, k, v = (
            s.reshape(batch, n, attn.n_heads, attn.head_dim).transpose(1, 2)
            for s in attn.Wqkv(hidden_states).chunk(3, dim=2)
        )
        if cache is not None:
            k, v = cache.update(k, v, attn.layer_idx, kwargs=kwargs)
        scores = torch.matmul(q, k.transpose(-1, -2)) * attn.softmax_scale
        if position_bias is not None:
            queries = n if cache is None else n + cache.get_seq_length()
            first_query = max(0, position_bias.size(1) - queries)
            first_key = max(0, position_bias.size(2) - k.shape[-2])
            scores = scores + position_bias[:, first_query:, first_key:]
        if attention_mask is not None:
            scores = scores.masked_fill(attention_mask, torch.finfo(q.dtype).min)
        wide = torch.promote_types(scores.dtype, torch.float32)
        weights = torch.softmax(scores, dim=-1, dtype=wide).to(v.dtype)
        context = torch.matmul(weights, v).permute(0, 2, 1, 3).reshape(batch, n, -1)
        return attn.out_proj(context), weights

    return forward


def import_layer(model: Any, input_ids: Any, layer: int, tokens: tuple[str, ...]) -> ImportedLayer:
    from transformers.models.mpt import modeling_mpt

    config = model.config
    n, most = int(input_ids.shape[1]), int(config.max_seq_len)
    if n > most:
        raise ScenarioError(
            f"MPT over {n} tokens is not supported (max_seq_len {most}: transformers' ALiBi "
            "covers that many positions)"
        )
    heads = config.n_heads
    blocks = model.base_model.blocks
    module = blocks[layer].attn
    lifted = {"build_mpt_alibi_tensor": _alibi_tensor(module.Wqkv.weight.dtype)}
    forwards = {block.attn: _attention64(block.attn) for block in blocks}
    with swapped_names(modeling_mpt, lifted), swapped_forwards(forwards):
        X_t, attention_out, out = _run(model, input_ids, module, module.out_proj)
    X = _numpy(X_t)
    d_model = X.shape[1]
    d = d_model // heads
    # columns of Wqkvᵀ: Q, K, V, each head by head, then feature
    W = _numpy(module.Wqkv.weight).T.reshape(d_model, 3, heads, d)
    heads_list = [{"W_Q": W[:, 0, h], "W_K": W[:, 1, h], "W_V": W[:, 2, h]} for h in range(heads)]
    scale = config.attn_config.softmax_scale
    settings = Settings(
        mask="causal",
        positional="alibi",
        alibi_slopes=tuple(float(s) for s in slopes64(heads)),
        scale_value=None if scale is None else float(scale),
    )
    W_O = _numpy(module.out_proj.weight).T
    scenario = from_heads(tokens, X, heads_list, W_O, settings)
    return _imported(scenario, out, attention_out, "mpt", layer)


FAMILY = Family("MPT", ("mpt",), check_config, import_layer)
