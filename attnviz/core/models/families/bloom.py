"""BLOOM: causal, ALiBi (one slope per head), one fused Q/K/V projection laid out per
head (``query_key_value`` rows: head, then Q/K/V, then feature), a LayerNorm before
attention, biases everywhere.

How BLOOM adds ALiBi: the scores are ``alibi.baddbmm(Q, Kᵀ, beta=1, alpha=1/√d)``, that
is Q·Kᵀ/√d + slope·j for key position j (``build_alibi_tensor``), not the paper's
−slope·|i − j|. Under the causal mask j ≤ i, so −slope·|i − j| = slope·j − slope·i: the
two differ by slope·i, one constant per query row, which softmax cancels. The weights
(and so the output) are the same; the scenario has ALiBi with BLOOM's own slopes
(``_get_alibi_slopes``: 2^(−8/p)^k for the p heads up to the largest power of two, then
every other slope of 2p for the rest, as attnviz's default slopes are).

Config options: ``n_head`` (the slopes follow it, a power of two or not);
``apply_residual_connection_post_layernorm`` only changes which residual the block adds
(X is what attention receives either way); ``slow_but_exact`` with ``pretraining_tp``
above 1 is refused: transformers then sums the output projections in slices without
their biases, another layer than the checkpoint's (``pretraining_tp`` alone changes
nothing). Older checkpoints' ``attention_softmax_in_fp32``, ``masked_softmax_fusion``,
``offset_alibi``, ``skip_bias_add`` and ``skip_bias_add_qkv`` are read by no code in
transformers and change nothing.

BLOOM's attention is its own code, not transformers' attention interface: its softmax
is taken in float32 (``F.softmax(…, dtype=torch.float32)``, whatever
``attention_softmax_in_fp32`` says) and its slopes are float32 powers. The import runs
the model with two of its module's names swapped while it runs: ``F`` by one whose
softmax is taken in the wider of float32 and the tensor's own dtype (float64 in a
float64 model, unchanged otherwise), and ``_get_alibi_slopes`` by the same slopes
computed in float64; so a float64 import is float64 throughout. The causal mask adds
the dtype's lowest number rather than −∞: exp of it underflows to exactly 0.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from attnviz.core.maths.scenario import Settings, from_heads
from attnviz.core.models.families.base import Config, Family, flag
from attnviz.core.models.hf_layer import (
    ImportedLayer,
    _imported,
    _numpy,
    _run,
    swapped_names,
)


def check_config(config: Config) -> str:
    tp = config.get("pretraining_tp")
    if flag(config, "slow_but_exact") and isinstance(tp, int) and tp > 1:
        return (
            f"BLOOM slow_but_exact with pretraining_tp {tp} is not supported (transformers "
            "then sums the output projections in slices and drops their biases)"
        )
    return ""


def slopes64(num_heads: int, device: Any = None) -> Any:
    """BLOOM's ALiBi slopes (``_get_alibi_slopes``) computed in float64."""
    import torch

    p = 2 ** math.floor(math.log2(num_heads))
    base = torch.full((), 2 ** (-(2 ** -(math.log2(p) - 3))), dtype=torch.float64, device=device)
    slopes = torch.pow(base, torch.arange(1, 1 + p, device=device))
    if p != num_heads:
        extra = torch.full(
            (), 2 ** (-(2 ** -(math.log2(2 * p) - 3))), dtype=torch.float64, device=device
        )
        odd = torch.arange(1, 1 + 2 * min(p, num_heads - p), 2, device=device)
        slopes = torch.cat([slopes, torch.pow(extra, odd)], dim=0)
    return slopes


class _WideSoftmax:
    """torch.nn.functional, but for a softmax in the wider of the asked dtype and the
    tensor's own."""

    def __getattr__(self, name: str) -> Any:
        from torch.nn import functional

        return getattr(functional, name)

    @staticmethod
    def softmax(x: Any, dim: int, dtype: Any = None, **kwargs: Any) -> Any:
        import torch

        wide = x.dtype if dtype is None else torch.promote_types(x.dtype, dtype)
        return torch.softmax(x, dim=dim, dtype=wide, **kwargs)


def import_layer(model: Any, input_ids: Any, layer: int, tokens: tuple[str, ...]) -> ImportedLayer:
    from transformers.models.bloom import modeling_bloom

    config = model.config
    heads = config.n_head
    blocks = model.base_model.h
    module = blocks[layer].self_attention
    lifted = {"F": _WideSoftmax(), "_get_alibi_slopes": slopes64}
    with swapped_names(modeling_bloom, lifted):
        X_t, attention_out, out = _run(model, input_ids, module, module.dense)
    X = _numpy(X_t)
    d_model = X.shape[1]
    d = d_model // heads
    # rows of query_key_value: head, then Q/K/V, then feature
    W = _numpy(module.query_key_value.weight).T.reshape(d_model, heads, 3, d)
    b = _numpy(module.query_key_value.bias).reshape(heads, 3, 1, d)
    heads_list = [
        {
            "W_Q": W[:, h, 0],
            "W_K": W[:, h, 1],
            "W_V": W[:, h, 2],
            "b_Q": b[h, 0],
            "b_K": b[h, 1],
            "b_V": b[h, 2],
        }
        for h in range(heads)
    ]
    slopes = tuple(float(s) for s in np.asarray(slopes64(heads).numpy()))
    settings = Settings(mask="causal", positional="alibi", alibi_slopes=slopes)
    W_O, b_O = _numpy(module.dense.weight).T, _numpy(module.dense.bias)
    scenario = from_heads(tokens, X, heads_list, W_O, settings, b_O=b_O)
    return _imported(scenario, out, attention_out, "bloom", layer)


FAMILY = Family("BLOOM", ("bloom",), check_config, import_layer)
