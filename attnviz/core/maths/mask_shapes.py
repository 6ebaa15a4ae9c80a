"""Ready-made custom masks (n queries × m keys, 1 = may attend) for the mask editor.

Each follows the scenario's causal alignment, so that with cross-attention under
bottom-right alignment the last query lines up with the last key.
"""

from __future__ import annotations

import numpy as np

from attnviz.core.maths.variants import query_offset, visible

SHAPES = ("causal", "prefix-LM", "blocks", "sliding window", "everything")


def mask_shape(
    shape: str, n: int, m: int, size: int = 2, alignment: str = "top-left"
) -> np.ndarray:
    """The (n, m) 0/1 matrix of a named mask shape.

    "causal": each query sees itself and the keys before it. "prefix-LM": the first
    ``size`` keys see each other both ways (a prompt), the rest is causal.
    "blocks": documents of ``size`` tokens packed together; each query sees the earlier
    keys of its own document only (block-diagonal causal). "sliding window": the last
    ``size`` keys. "everything": no mask.
    """
    if size < 1:
        raise ValueError(f"{shape}: size {size} is not a positive number of tokens")
    i = np.arange(n)[:, None] + query_offset(n, m, alignment)
    j = np.arange(m)[None, :]
    if shape == "causal":
        seen = visible(n, m, "causal", alignment=alignment)
    elif shape == "prefix-LM":
        seen = (j <= i) | (j < size) & (i < size)
    elif shape == "blocks":
        seen = (j <= i) & (j // size == i // size)
    elif shape == "sliding window":
        seen = visible(n, m, "sliding-window", window=size, alignment=alignment)
    elif shape == "everything":
        seen = np.ones((n, m), dtype=bool)
    else:
        raise ValueError(f"mask shape {shape!r}: expected one of {', '.join(SHAPES)}")
    return seen.astype(np.float64)
