"""The layer a block of query rows at a time: concat and final with no n × m matrix kept,
for the layer-wide figures and exports at long sequences."""

from __future__ import annotations

import numpy as np

from attnviz.core.maths.forward import context, head_count, inputs, keys, kv_of, mix, queries
from attnviz.core.maths.positions import dropout_keep
from attnviz.core.maths.results import Result
from attnviz.core.maths.scenario import Scenario
from attnviz.core.maths.scoring import Rule, softmax_in_place, weighted


def head_output(
    s: Scenario,
    h: int,
    X: np.ndarray,
    X_kv: np.ndarray,
    rule: Rule,
    keep: np.ndarray | None,
    block: int = 256,
) -> np.ndarray:
    """Head h's output weights · V by forward's steps (BLAS may round a block's products
    differently in the last bit), a block of query rows at a time."""
    _, Q_rot = queries(s, X, [h])
    _, V, K_rot = keys(s, X_kv, kv_of(s, [h]))
    Kt = np.ascontiguousarray(K_rot[0].T)
    out = np.empty((s.n, V.shape[2]))
    for a in range(0, s.n, block):
        rows = slice(a, min(s.n, a + block))
        w = (Q_rot[0, rows] @ Kt)[None]
        rule.scale(w, [h], rows)
        rule.mask(w, rows)
        softmax_in_place(w, rule.sinks([h]), rule.row_ends(rows, w.shape[-2]))
        rule.reweight(w, None if keep is None else keep[rows], rows)
        out[rows] = weighted(rule, w[0], V[0], rows)
    return out


def layer(s: Scenario, block: int = 256) -> Result:
    """X, concat and final of compute(s) (to the last bit or two), one head and one block
    of query rows at a time. The Result holds no heads (``heads`` is empty)."""
    X, X_kv = inputs(s)
    rule = Rule.of(s)
    outputs = []
    for h in range(head_count(s)):
        keep = dropout_keep(s.settings, (1, s.n, s.m), skip=h)
        outputs.append(head_output(s, h, X, X_kv, rule, None if keep is None else keep[0], block))
    concat, final = mix(s, outputs)
    return Result(**context(s, X, rule.future), heads=(), concat=concat, final=final)
