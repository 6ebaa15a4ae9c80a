"""What the RoPE view shows: each pair's frequency, the angles by position, one pair
turning, and that rotated scores depend only on the offset between positions."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from attnviz.core.maths.forward import compute_head
from attnviz.core.maths.positions import positions, rope_width
from attnviz.core.maths.scenario import Scenario, Settings
from attnviz.core.maths.variants import pair_frequencies, rope, rope_angles


@dataclass(frozen=True)
class Pairs:
    """RoPE's pairs for one width: which features each pair joins, and how fast it turns."""

    first: np.ndarray  # feature index (from 0) of each pair's first member
    second: np.ndarray  # and of its partner
    frequency: np.ndarray  # radians per position
    wavelength: np.ndarray  # positions per full turn, 2π / frequency


def pairs(st: Settings, d_k: int) -> Pairs:
    """The pairs RoPE turns at width d_k under the settings (none when fewer than 2)."""
    dims = min(rope_width(st, d_k), d_k - d_k % 2)
    if dims < 2:
        empty = np.zeros(0)
        return Pairs(empty.astype(int), empty.astype(int), empty, empty)
    index = np.arange(dims)
    if st.rope_style == "half":
        first, second = index[: dims // 2], index[dims // 2 :]
    else:
        first, second = index[0::2], index[1::2]
    freq = pair_frequencies(dims, st.rope_base, st.rope_frequencies)
    return Pairs(first, second, freq, 2 * np.pi / freq)


def width(s: Scenario) -> int:
    """The width of the rows RoPE turns: d_k, or d_model with projections off (Q = X)."""
    return s.d_k if s.settings.projections else s.d_model


def angles(s: Scenario) -> np.ndarray:
    """(n, pairs): the angle in radians by which each pair of query i turns."""
    dims = len(pairs(s.settings, width(s)).frequency) * 2
    if not dims:
        return np.zeros((s.n, 0))
    st = s.settings
    return rope_angles(positions(s)[0], dims, st.rope_base, st.rope_frequencies)


def turned_pair(s: Scenario, head: int, token: int, pair: int) -> tuple[np.ndarray, int]:
    """Query ``token``'s pair ``pair`` of head ``head`` as RoPE receives it (after any
    QK-norm), turned to each position from 0 to its own (and at least to n − 1):
    (positions, 2), and the query's own position (offset under bottom-right alignment)."""
    st = s.settings
    p = pairs(st, width(s))
    own = int(positions(s)[0][token])
    turned = compute_head(s, head).Q_rot[token : token + 1]
    q = _unturned(turned, np.array([own]), st, len(p.frequency) * 2)[0]
    a, b = q[p.first[pair]], q[p.second[pair]]
    theta = np.arange(max(s.n, own + 1)) * p.frequency[pair]
    cos, sin = np.cos(theta) * st.rope_factor, np.sin(theta) * st.rope_factor
    return np.stack([a * cos - b * sin, a * sin + b * cos], axis=1), own


def shift_change(s: Scenario, head: int, shift: int) -> float:
    """The largest change of head ``head``'s raw scores when every position (queries and
    keys) moves by ``shift``: rounding only, because RoPE scores depend on i − j alone."""
    h = compute_head(s, head)
    st = s.settings
    if st.positional != "rope":
        raise ValueError("the scenario does not use RoPE")
    qpos, kpos = positions(s)
    dims = len(pairs(st, width(s)).frequency) * 2
    # what RoPE received (Q and K after any QK-norm), turned at the shifted positions
    q, k = _unturned(h.Q_rot, qpos, st, dims), _unturned(h.K_rot, kpos, st, dims)
    shifted = _turned(q, qpos + shift, st, dims) @ _turned(k, kpos + shift, st, dims).T
    return float(np.abs(shifted - h.scores).max())


def _turned(A: np.ndarray, pos: np.ndarray, st: Settings, dims: int) -> np.ndarray:
    return rope(A, pos, st.rope_base, st.rope_style, dims, st.rope_frequencies, st.rope_factor)


def _unturned(turned: np.ndarray, pos: np.ndarray, st: Settings, dims: int) -> np.ndarray:
    """Undo RoPE: turn back by the same angles (a rotation's inverse is its transpose)
    and divide by its factor."""
    factor = 1.0 / st.rope_factor
    return rope(turned, -pos, st.rope_base, st.rope_style, dims, st.rope_frequencies, factor)
