"""Where tokens sit: positions, the sinusoidal encoding, which keys the mask hides, and
the settings read off them (the scale, RoPE's width, dropout's draw)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from attnviz.core.maths.scenario import Scenario, Settings
from attnviz.core.maths.variants import query_offset, relative_bucket, visible


def sinusoidal(n: int, d_model: int, rows: Any = slice(None)) -> np.ndarray:
    """Sinusoidal position encoding, the given rows (positions) of its n × d_model table:
    PE[p, 2i] = sin(p / 10000^(2i/d)), PE[p, 2i+1] = cos(...). Each cell's sin or cos
    alone, the same numbers whichever rows are asked for."""
    pos = np.arange(n)[rows][:, None]
    pair = np.arange(d_model) // 2
    angle = pos / np.power(10000.0, 2 * pair / d_model)
    out: np.ndarray = np.empty_like(angle)
    np.sin(angle[:, 0::2], out=out[:, 0::2])
    np.cos(angle[:, 1::2], out=out[:, 1::2])
    return out


def future_mask(n: int) -> np.ndarray:
    """(n, n) bool, True where key j comes after query i."""
    return np.triu(np.ones((n, n), dtype=bool), k=1)


def hidden_keys(s: Scenario) -> np.ndarray:
    """(n, m) bool, True where the mask hides key j from query i: the future keys (under
    the causal alignment), and under a sliding window or a custom mask what those hide.
    (With no mask, the future keys all the same: what the leak is measured on.)"""
    st = s.settings
    if st.mask in ("sliding-window", "custom"):
        return ~visible(s.n, s.m, st.mask, st.window, st.causal_alignment, s.mask_matrix)
    return ~visible(s.n, s.m, "causal", alignment=st.causal_alignment)


def positions(s: Scenario) -> tuple[np.ndarray, np.ndarray]:
    """The positions of the queries and of the keys (RoPE and ALiBi): keys 0 … m − 1,
    queries from m − n under bottom-right alignment, else from 0."""
    offset = query_offset(s.n, s.m, s.settings.causal_alignment)
    return np.arange(s.n) + offset, np.arange(s.m)


def relative_buckets(s: Scenario, rows: Any = slice(None)) -> np.ndarray:
    """(n, m) the bucket of T5's table each score of the given query rows reads: that of
    the relative position j − i of key j to query i (``positions``)."""
    st = s.settings
    qpos, kpos = positions(s)
    return relative_bucket(
        kpos[None, :] - qpos[rows][:, None],
        st.relative_bidirectional,
        st.relative_buckets,
        st.relative_max_distance,
    )


def relative_terms(s: Scenario, heads: Any = slice(None)) -> np.ndarray:
    """(H', n, m) what T5's relative position bias adds to the given query heads' scores:
    relative_bias[bucket(j − i), h]."""
    table = np.asarray(s.relative_bias)[:, heads]
    terms: np.ndarray = np.moveaxis(table[relative_buckets(s)], -1, 0)
    return terms


def rope_width(st: Settings, width: int) -> int:
    """How many leading features RoPE turns: rope_dims, else all of an even width (one
    fewer for an odd one)."""
    return st.rope_dims if st.rope_dims is not None else width - width % 2


def scale_of(st: Settings, d_k: int) -> float | None:
    """What scores are multiplied by: scale_value, or None to divide by √d_k exactly (the
    textbook operation, so its numbers are the brief's), or 1.0 with scaling off."""
    if not st.scale:
        return 1.0
    return st.scale_value


def dropout_keep(settings: Settings, shape: tuple[int, ...], skip: int = 0) -> np.ndarray | None:
    """The seeded dropout keep-mask (True = kept), or None when dropout is off.

    ``skip``: how many leading heads (slices of axis 0) of a larger draw to pass over, so
    that head h alone is ``dropout_keep(st, (1, n, m), skip=h)[0]``, bit for bit the same
    as ``dropout_keep(st, (heads, n, m))[h]`` without drawing the others.
    """
    if settings.dropout == 0:
        return None
    bits = np.random.PCG64(settings.dropout_seed)  # what default_rng(seed) uses
    bits.advance(skip * math.prod(shape[1:]))  # one 64-bit step per float64 drawn
    return np.random.Generator(bits).random(shape) >= settings.dropout
