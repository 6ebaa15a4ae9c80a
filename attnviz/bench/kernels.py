"""The implementations a sweep times, and the masks they are given.

- ``naive``: Q Kᵀ, scale, −∞ mask, softmax, · V: the scores are materialised; under GQA
  K and V are first copied to every query head (``repeat_interleave``);
- ``sdpa``: torch's default dispatch of ``F.scaled_dot_product_attention``, and
  ``flash``, ``efficient``, ``cudnn``, ``math``, one backend each (forced with
  ``sdpa_kernel``); GQA through ``enable_gqa=True``;
- ``flex``: ``torch.compile(flex_attention)`` with a block mask (tiles a window or the
  documents hide entirely are skipped); ``flex-eager``: flex_attention without the
  compiler, which materialises the scores (for a machine without a C++ toolchain).

A window or documents reach naive and SDPA as a dense boolean mask (built once per n,
outside the timing); a plain causal mask as ``is_causal``. torch only, imported lazily.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any

from attnviz.bench.arithmetic import has_mask, query_rows
from attnviz.bench.config import FLEX, Config

BACKENDS = {
    "flash": "FLASH_ATTENTION",
    "efficient": "EFFICIENT_ATTENTION",
    "cudnn": "CUDNN_ATTENTION",
    "math": "MATH",
}
FLEX_BLOCK = 128  # flex_attention's default tile (rows and columns of a block mask)
_compiled: dict[str, Callable[..., Any]] = {}


# Masks --------------------------------------------------------------------------------


def key_range(c: Config, n: int, device: Any) -> tuple[Any, Any]:
    """For each query row i of a prefill, the first and last key it sees (inclusive):
    a causal mask or window ends at i, a window starts W − 1 before it, a document is
    the block of n / D tokens that holds i. Every mask here keeps one such range a row."""
    import torch

    i = torch.arange(n, device=device)
    first, last = torch.zeros_like(i), torch.full_like(i, n - 1)
    if c.causal or c.window:
        last = i.clone()
    if c.window:
        first = (i - c.window + 1).clamp(min=0)
    if c.documents:
        length = n // c.documents
        first = torch.maximum(first, i // length * length)
        last = torch.minimum(last, (i // length + 1) * length - 1)
    return first, last


def dense_mask(c: Config, n: int, device: Any, hidden: bool = False) -> Any:
    """The n × n boolean mask of a window or documents (True: the key takes part, or,
    with hidden, True: the key is hidden, as masked_fill wants); None without one."""
    import torch

    if not has_mask(c):
        return None
    first, last = key_range(c, n, device)
    j = torch.arange(n, device=device)
    seen = (j[None, :] >= first[:, None]) & (j[None, :] <= last[:, None])
    return ~seen if hidden else seen


def block_mask(c: Config, n: int, device: Any) -> Any:
    """flex_attention's BlockMask for the sweep's mask at n, or None for full attention.

    Built from the key ranges per row (never from an n × n mask, which torch's own
    create_block_mask materialises): a tile of 128 queries × 128 keys is full when every
    row sees every key of it, partial when some row sees some key, else skipped.
    """
    import torch
    from torch.nn.attention.flex_attention import BlockMask

    if not (c.causal or has_mask(c)):
        return None
    blocks = -(-n // FLEX_BLOCK)
    padded = blocks * FLEX_BLOCK
    first, last = key_range(c, n, device)
    # Padding rows see nothing; padding keys are never seen, so no tile with them is full.
    first = torch.cat([first, first.new_full((padded - n,), padded)]).view(blocks, -1, 1)
    last = torch.cat([last, last.new_full((padded - n,), -1)]).view(blocks, -1, 1)
    k0 = torch.arange(blocks, device=device) * FLEX_BLOCK
    k_end = (k0 + FLEX_BLOCK).clamp(max=n) - 1
    some = ((first <= k_end) & (last >= k0)).any(dim=1)
    full = ((first <= k0) & (last >= k0 + FLEX_BLOCK - 1)).all(dim=1)
    partial = some & ~full

    def counts(tiles: Any) -> tuple[Any, Any]:
        order = torch.argsort((~tiles).to(torch.int8), dim=-1, stable=True)
        return tiles.sum(-1).to(torch.int32)[None, None], order.to(torch.int32)[None, None]

    documents = c.documents
    length = n // documents if documents else n
    causal, window = c.causal or bool(c.window), c.window

    def keep(b: Any, h: Any, q: Any, kv: Any) -> Any:
        ok = q >= kv if causal else q == q
        if window:
            ok = ok & (q - kv < window)
        if documents:
            ok = ok & (q // length == kv // length)
        return ok

    return BlockMask.from_kv_blocks(
        *counts(partial), *counts(full), FLEX_BLOCK, keep, seq_lengths=(n, n)
    )


def mask_for(impl: str, c: Config, n: int, device: Any) -> Any:
    """What impl is given as its mask at n: a BlockMask (flex), a dense mask (naive:
    True hides; SDPA: True keeps) for a window or documents, or None."""
    if impl in FLEX:
        return block_mask(c, n, device) if c.phase == "prefill" else None
    return dense_mask(c, n, device, hidden=impl == "naive")


# Implementations ------------------------------------------------------------------------


def naive(q: Any, k: Any, v: Any, causal: bool, hidden: Any = None) -> Any:
    """The brief's explicit attention: the scores are materialised. hidden (True: the key
    is hidden) replaces the causal mask when given; K and V are repeated under GQA."""
    import torch

    if k.shape[1] != q.shape[1]:
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if hidden is not None:
        scores = scores.masked_fill(hidden, -math.inf)
    elif causal:
        n = q.shape[-2]
        future = torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(future, -math.inf)
    return torch.softmax(scores, dim=-1) @ v


def flex_function(impl: str) -> Callable[..., Any]:
    """flex_attention, compiled for "flex" (one torch.compile wrapper, reused)."""
    import torch
    from torch.nn.attention.flex_attention import flex_attention

    if impl == "flex-eager":
        return flex_attention
    if "flex" not in _compiled:
        _compiled["flex"] = torch.compile(flex_attention)
    return _compiled["flex"]


def call(impl: str, q: Any, k: Any, v: Any, causal: bool, mask: Any = None) -> Any:
    """impl on these inputs; mask is what ``mask_for`` gave it (None: none or causal)."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    gqa = {"enable_gqa": True} if k.shape[1] != q.shape[1] else {}
    if impl == "naive":
        return naive(q, k, v, causal, mask)
    if impl in FLEX:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "flex_attention called without torch.compile")
            return flex_function(impl)(q, k, v, block_mask=mask, **gqa)
    kw = {"attn_mask": mask, "is_causal": causal and mask is None, **gqa}
    if impl == "sdpa":
        return F.scaled_dot_product_attention(q, k, v, **kw)
    with sdpa_kernel(getattr(SDPBackend, BACKENDS[impl])):
        return F.scaled_dot_product_attention(q, k, v, **kw)


def flex_missing() -> str | None:
    """Why this torch has no flex_attention (added in torch 2.5), or None."""
    import torch

    try:
        from torch.nn.attention.flex_attention import BlockMask, flex_attention  # noqa: F401
    except ImportError:
        return f"torch {torch.__version__} has no torch.nn.attention.flex_attention (2.5 or later)"
    return None


def refusal(impl: str, c: Config, device: str, dtype: Any) -> str | None:
    """None if impl runs on a tiny problem of the sweep's shape, else why not (torch's own
    words where it has any). Flex is only looked up here: compiling it takes seconds, so
    a compiler that fails is found by the float64 check."""
    import torch

    if impl in FLEX:
        if c.phase == "decode":
            return "the decode phase is timed for naive and SDPA"
        return flex_missing()
    n = max(16, c.documents)
    q = torch.randn(1, c.heads, query_rows(c, n), c.d_head, device=device, dtype=dtype)
    kv = torch.randn(1, c.groups, n, c.d_head, device=device, dtype=dtype)
    causal = c.causal and c.phase == "prefill"
    return probe(impl, q, kv, kv, causal, mask_for(impl, c, n, device))


def probe(impl: str, q: Any, k: Any, v: Any, causal: bool, mask: Any = None) -> str | None:
    """None if impl runs on these inputs, else why not."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            call(impl, q, k, v, causal, mask)
            return None
        except (RuntimeError, TypeError) as e:
            said = [str(w.message).strip().splitlines()[0][:160] for w in caught]
            dtype = str(q.dtype).removeprefix("torch.")
            reason = f"no {impl} kernel for {dtype} on {q.device.type}"
            if said:
                return f"{reason} ({said[0]})"
            return reason if "No viable backend" in str(e) else f"{reason} ({str(e)[:160]})"


def notes(c: Config) -> list[str]:
    """What the report should say about how the implementations ran this config."""
    out = []
    if c.groups != c.heads and "naive" in c.impls:
        out.append(
            f"naive: K and V repeated from {c.groups} to {c.heads} heads (GQA by copying, "
            "inside the timing); SDPA and flex read them shared (enable_gqa)"
        )
    if "flex-eager" in c.impls:
        out.append("flex-eager: flex_attention without torch.compile (unfused: scores stored)")
    if "flex" in c.impls and c.phase == "prefill":
        out.append("flex: compile ms is the first call after torch.compiler.reset() at each n")
    return out
