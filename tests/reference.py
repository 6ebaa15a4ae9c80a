"""An independent, deliberately plain attention reference for the tests.

Loops over heads and rows, written from the brief, sharing no code with attnviz.core.
"""

from __future__ import annotations

import math

import numpy as np

X = np.array(
    [
        [0.90, 0.10, -0.30, 0.20],
        [0.20, 0.80, 0.40, -0.50],
        [-0.40, 0.10, 0.90, 0.30],
        [0.30, -0.60, 0.20, 0.80],
    ]
)
W_Q = np.array(
    [
        [[0.1, 0.3], [0.7, -0.9], [0.3, -0.7], [-0.9, 0.7]],
        [[-0.6, -0.2], [-0.2, -0.8], [0.8, 0.6], [0.9, 0.8]],
    ]
)
W_K = np.array(
    [
        [[0.9, -0.9], [0.6, -0.3], [-0.9, 0.7], [0.2, -0.4]],
        [[0.9, -0.7], [0.8, 0.3], [0.4, 0.0], [-0.9, -0.9]],
    ]
)
W_V = np.array(
    [
        [[0.5, -0.2], [0.1, 0.6], [-0.3, 0.4], [0.7, 0.1]],
        [[0.2, 0.4], [-0.5, 0.3], [0.6, -0.1], [0.1, -0.6]],
    ]
)
W_O = np.array(
    [
        [0.5, -0.1, 0.3, 0.2],
        [0.1, 0.6, -0.2, 0.4],
        [-0.3, 0.2, 0.5, 0.1],
        [0.2, 0.3, 0.1, -0.4],
    ]
)


def head(X, Wq, Wk, Wv, mask="causal", scale=True):
    """One head, row by row: returns (scores, weights, output)."""
    Q, K, V = X @ Wq, X @ Wk, X @ Wv
    n, d_k = Q.shape
    S = np.array([[float(np.dot(Q[i], K[j])) for j in range(n)] for i in range(n)])
    if scale:
        S = S / math.sqrt(d_k)
    W = np.zeros((n, n))
    for i in range(n):
        row = S[i].copy()
        if mask == "causal":
            row[i + 1 :] = -np.inf
        elif mask == "causal-zero":
            row[i + 1 :] = 0.0
        e = np.exp(row - row.max())
        W[i] = e / e.sum()
        if mask == "drop-after-softmax":
            W[i, i + 1 :] = 0.0
    return S, W, W @ V


def multi_head(X, Wq, Wk, Wv, Wo, mask="causal", scale=True):
    """Every head, concatenated in order and mixed by W_O: (weights per head, concat, final)."""
    outs = [head(X, Wq[h], Wk[h], Wv[h], mask, scale) for h in range(len(Wq))]
    concat = np.concatenate([o[2] for o in outs], axis=1)
    return [o[1] for o in outs], concat, concat @ Wo


def sinusoidal(n: int, d: int) -> np.ndarray:
    """Sinusoidal position encoding, by hand: PE[p, 2i] = sin(p / 10000^(2i/d)) and
    PE[p, 2i+1] = cos(the same angle)."""
    pe = np.zeros((n, d))
    for p in range(n):
        for c in range(d):
            angle = p / 10000 ** (2 * (c // 2) / d)
            pe[p, c] = math.sin(angle) if c % 2 == 0 else math.cos(angle)
    return pe
