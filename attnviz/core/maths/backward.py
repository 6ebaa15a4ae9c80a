"""The backward pass: the gradient of a loss over the layer's output with respect to every
input and every intermediate, in float64, by hand, step by step against ``forward.py``.

From dL/dfinal (``losses.py``), for ``final = concat W_O + b_O`` and each head::

    dW_O = concatᵀ dfinal,  db_O = Σ_rows dfinal,  dconcat = dfinal W_Oᵀ
    dweights = dout Vᵀ,      dV = weightsᵀ dout
    dP = dweights            (× keep / (1 − p) under dropout; 0 on the hidden keys
                              under drop-after-softmax)
    dmasked = P ⊙ (dP − rowsum(dP ⊙ P))                       the softmax
    dscaled = dmasked, 0 on the hidden keys (a −∞ or a 0 there is a constant: no
              gradient reaches the score, while under causal-zero the future keys'
              weights still pass gradient to their values: the leak, backwards)
    dscores = dscaled ⊙ (1 − tanh²(x / c)) · σ                x = scores · σ; ALiBi adds
                                                               a constant
    drelative_bias[b, h] = Σ over the scores (i, j) of bucket b of dscaled   (T5's table)
    dQ' = dscores K',  dK' = dscoresᵀ Q'
    dQ  = norm′(rope⁻¹(dQ'))                                  RoPE turned back, RMS norm
                                                               (all heads together
                                                               under "rms-whole")
    dW_Q = Xᵀ dQ,  db_Q = Σ_rows dQ,  dX += dQ W_Qᵀ           (K and V from X_kv)

A key/value head shared by a group of query heads (GQA) sums its group's gradients. The
forward pass's intermediates are reused: its weights, its K', Q', V, m and Z; the scores
are made again (one product) only where the soft-cap or a reweighting needs them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from attnviz.core.maths.forward import head_count, inputs, kept_columns, kv_of, turns
from attnviz.core.maths.positions import positions, relative_buckets, rope_width
from attnviz.core.maths.results import HEAD_MATRICES, TURNED_MATRICES, Head, Result
from attnviz.core.maths.scenario import MINUS_INF_MASKS, Scenario, Settings
from attnviz.core.maths.variants import rope

# each per-head intermediate, in the order of the layer (as `attnviz compute` gives them)
HEAD_GRADIENTS = (*HEAD_MATRICES[:3], *TURNED_MATRICES, *HEAD_MATRICES[3:])


@dataclass(frozen=True, eq=False)
class HeadGradients:
    """dL/d each intermediate of one query head, the shape of the intermediate (K, V and
    K_rot: this query head's share; a shared key/value head's gradient is its group's
    sum).

    Of the n × m gradients only ``masked`` (what softmax saw) is kept; ``weights``,
    ``scaled`` and ``scores`` are made from it (and the forward pass's head) when asked
    for, so that the backward pass holds one n × m matrix a head, as the forward does.
    """

    Q: np.ndarray
    K: np.ndarray
    V: np.ndarray
    Q_rot: np.ndarray
    K_rot: np.ndarray
    masked: np.ndarray
    output: np.ndarray
    settings: Settings
    head: Head  # the forward pass's, for the gradients made when asked for
    future: np.ndarray  # (n, m) bool: the keys the mask hides

    @property
    def weights(self) -> np.ndarray:
        """dL/dweights = doutput Vᵀ."""
        return _frozen(self.output @ self.head.V.T)

    @property
    def scaled(self) -> np.ndarray:
        """dL/dscaled: dmasked, but 0 where a −∞ or a zero mask wrote a constant."""
        masks = self.settings.mask in (*MINUS_INF_MASKS, "causal-zero")
        return _frozen(np.where(self.future, 0.0, self.masked) if masks else self.masked)

    @property
    def scores(self) -> np.ndarray:
        """dL/dscores: dscaled · σ, times 1 − tanh²(σ·scores/c) under a soft-cap."""
        return _frozen(_to_scores(self.settings, self.head, self.scaled))


@dataclass(frozen=True, eq=False)
class Gradients:
    """The loss and its gradient with respect to every input and intermediate.

    ``inputs`` maps the scenario's names (X, W_Q, b_O, …; X_kv under cross-attention,
    q_norm and k_norm under QK-norm, relative_bias under T5's relative bias; no weights
    with projections off) to arrays of the input's shape (stacks: heads × rows ×
    columns)."""

    loss: float
    inputs: dict[str, np.ndarray]
    heads: tuple[HeadGradients, ...]
    concat: np.ndarray
    final: np.ndarray

    def matrix(self, name: str, head: int | None = None) -> np.ndarray:
        """The gradient of one intermediate or input as a 2-D array (head: 0-based, for
        the per-head intermediates and the stacks of weights)."""
        if name in HEAD_GRADIENTS:
            if head is None:
                raise KeyError(f"d{name}: which head?")
            return getattr(self.heads[head], name)  # type: ignore[no-any-return]
        if name in ("concat", "final"):
            return getattr(self, name)  # type: ignore[no-any-return]
        if name not in self.inputs:
            raise KeyError(f"no gradient of {name!r} in this scenario")
        a = self.inputs[name]
        if a.ndim == 3:
            if head is None:
                raise KeyError(f"d{name}: which head?")
            one: np.ndarray = a[head]
            return one
        return a


def backward(s: Scenario, r: Result, d_final: np.ndarray, loss: float) -> Gradients:
    """Every gradient, from dL/dfinal and the forward pass ``r`` of ``s``."""
    st = s.settings
    X, X_kv = inputs(s)
    grads = _Inputs.zeros(s)
    d_concat = _through_mix(s, r, d_final, grads)
    d_in = np.zeros_like(X)
    d_in_kv = np.zeros_like(X_kv) if s.cross else d_in
    count = head_count(s)
    group = kv_of(s, range(count))
    buckets = relative_buckets(s).ravel() if "relative_bias" in grads.arrays else None
    gs = []
    for h in range(count):
        d_k = r.head(h).output.shape[1]
        d_out = np.ascontiguousarray(d_concat[:, h * d_k : (h + 1) * d_k])
        g = _head(st, r.head(h), d_out, r.future)
        if buckets is not None:  # each score adds its bucket's entry: dscaled summed
            table = grads.arrays["relative_bias"]
            table[:, h] = np.bincount(buckets, g.scaled.ravel(), minlength=len(table))
        gs.append(g)
    d_Qs, d_Ks = _through_norms(s, r, gs, group, grads)
    heads = []
    for h, (g, d_Q, d_K) in enumerate(zip(gs, d_Qs, d_Ks, strict=True)):
        heads.append(replace(g, Q=d_Q, K=d_K))
        if not st.projections:  # Q = K = V = X
            d_in += d_Q
            d_in_kv += d_K + g.V
            continue
        _project_back(s, X, d_Q, grads, d_in, "W_Q", "b_Q", h)
        _project_back(s, X_kv, d_K, grads, d_in_kv, "W_K", "b_K", group[h])
        _project_back(s, X_kv, g.V, grads, d_in_kv, "W_V", "b_V", group[h])
    grads.arrays["X"] += d_in  # the sinusoidal encoding is a constant: X's gradient is X+PE's
    if s.cross:
        grads.arrays["X_kv"] += d_in_kv
    return Gradients(loss, grads.done(), tuple(heads), _frozen(d_concat), _frozen(d_final))


def _through_mix(s: Scenario, r: Result, d_final: np.ndarray, grads: _Inputs) -> np.ndarray:
    """dconcat from dfinal, with W_O's and b_O's gradients (none with projections off)."""
    if not s.settings.projections:
        return d_final.copy()
    kept = kept_columns(s.settings, r.n_heads, r.d_k)
    grads.arrays["W_O"][kept] = r.concat[:, kept].T @ d_final
    grads.arrays["b_O"][0] = d_final.sum(axis=0)
    d_concat = d_final @ s.W_O.T
    d_concat[:, ~kept] = 0.0  # an ablated head's output reaches nothing
    return d_concat  # type: ignore[no-any-return]


def _head(st: Settings, head: Head, d_out: np.ndarray, future: np.ndarray) -> HeadGradients:
    """One head from its output's gradient back to Q' and K' (and V); Q and K are left
    empty, for the caller (their norms' weights are the scenario's)."""
    d = d_out @ head.V.T  # dweights, then dP, then dmasked, in place
    d_V = head.weights.T @ d_out
    P = _softmax(st, head)
    if st.mask == "drop-after-softmax":
        d[future] = 0.0
    if head.keep is not None:
        d *= head.keep
        d /= 1.0 - st.dropout
    d -= np.einsum("ij,ij->i", d, P)[:, None]
    d *= P  # P ⊙ (dP − rowsum(dP ⊙ P))
    # a −∞ or a zero mask writes a constant on the hidden keys: no gradient reaches their
    # scores (under −∞ P, and so d, is 0 there already)
    d_scaled = np.where(future, 0.0, d) if st.mask == "causal-zero" else d
    d_scores = _to_scores(st, head, d_scaled)
    empty = np.zeros(0)
    return HeadGradients(empty, empty, d_V, d_scores @ head.K_rot, d_scores.T @ head.Q_rot,
                         _frozen(d), d_out, st, head, future)  # fmt: skip


def _to_scores(st: Settings, head: Head, d_scaled: np.ndarray) -> np.ndarray:
    """dscores from dscaled: times σ, and 1 − tanh²(σ·scores/c) under a soft-cap (ALiBi
    and T5's relative bias add a term that does not depend on the scores)."""
    d_scores = d_scaled * _scale(st, head.Q_rot.shape[1])
    if st.softcap is not None:
        stages = head.made_stages()
        bias = head.rule.bias(head.index) if head.rule else 0.0
        capped = stages.scaled - bias  # scaled = c·tanh(σ·scores/c) + ALiBi's or T5's bias
        d_scores *= 1.0 - (capped / st.softcap) ** 2
    return d_scores


def _softmax(st: Settings, head: Head) -> np.ndarray:
    """The softmax P, the weights before drop-after-softmax and dropout: the forward's
    weights themselves without those, else made again from the scores and the forward's
    row maxima m and sums Z."""
    if st.mask != "drop-after-softmax" and st.dropout == 0:
        return head.weights
    masked = head.made_stages().masked
    return np.exp(masked - head.m[:, None]) / np.where(head.empty_rows, 1.0, head.Z)[:, None]  # type: ignore[no-any-return]


def _scale(st: Settings, d_k: int) -> float:
    """What raw scores are multiplied by: 1/√d_k, scale_value, or 1 with scaling off."""
    if not st.scale:
        return 1.0
    return 1.0 / np.sqrt(d_k) if st.scale_value is None else st.scale_value


def _through_norms(
    s: Scenario, r: Result, gs: list[HeadGradients], group: list[int], grads: _Inputs
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """dQ and dK of each query head (dK: its share) from dQ' and dK': RoPE turned back,
    then through QK-norm, head by head or ("rms-whole") all heads together."""
    st = s.settings
    qpos, kpos = positions(s)
    if st.qk_norm != "rms-whole":
        heads = list(enumerate(gs))
        d_Qs = [_unturned(st, g.Q_rot, r.head(h).Q, qpos, grads, "q_norm", h) for h, g in heads]
        d_Ks = [_unturned(st, g.K_rot, r.head(h).K, kpos, grads, "k_norm", group[h])
                for h, g in heads]  # fmt: skip
        return d_Qs, d_Ks
    d_Q = np.stack([unroped(st, g.Q_rot, qpos) for g in gs])
    d_K = np.stack([unroped(st, g.K_rot, kpos) for g in gs])
    Q = np.stack([r.head(h).Q for h in range(len(gs))])
    K = np.stack([r.head(group.index(k)).K for k in range(max(group) + 1)])
    ones = list(range(len(gs)))
    return list(_whole_back(st, Q, d_Q, ones, grads, "q_norm")), list(
        _whole_back(st, K, d_K, group, grads, "k_norm")
    )


def _whole_back(
    st: Settings, A: np.ndarray, d: np.ndarray, of: list[int], grads: _Inputs, norm: str
) -> np.ndarray:
    """Through the whole-projection RMS norm y_g = w_g ⊙ A_g / r, r per token over every
    head g of A (G, rows, d_k): d (J, rows, d_k) holds dy of J slots, slot j of head
    of[j] (GQA: a key/value head's query heads). Returns each slot's share of dA:

        dA_g = u_g / r − A_g / r³ · Σ_heads Σ_features (u ⊙ A) / (G·d_k),  u = w ⊙ dy

    the coupling term shared evenly by the slots of a head, so that a head's slots sum
    to its gradient. The norm weights' gradients are added to grads[norm]."""
    inv = 1.0 / np.sqrt(np.mean(A * A, axis=(0, 2), keepdims=True) + st.qk_norm_eps)
    Aj = A[of]
    u = d
    weights = grads.norms[norm]
    if weights is not None:
        for j, g in enumerate(of):
            grads.arrays[norm][g, 0] += (d[j] * Aj[j] * inv[0]).sum(axis=0)
        u = d * weights[of]
    c = (u * Aj).sum(axis=(0, 2), keepdims=True) / (A.shape[0] * A.shape[2])
    sizes = np.bincount(of)[of][:, None, None]
    return inv * u - Aj * inv**3 * c / sizes  # type: ignore[no-any-return]


def unroped(st: Settings, d_turned: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """d before RoPE from d after it (RoPE's transpose: the turn by −θ); d itself
    without RoPE."""
    d = d_turned
    if st.positional == "rope":
        dims = min(rope_width(st, d.shape[-1]), d.shape[-1] - d.shape[-1] % 2)
        if dims:
            back = -np.asarray(pos, dtype=np.float64)  # the transpose: f·R(θ)ᵀ = f·R(−θ)
            d = rope(d, back, st.rope_base, st.rope_style, dims, st.rope_frequencies,
                     st.rope_factor)  # fmt: skip
    return d


def _unturned(
    st: Settings,
    d_turned: np.ndarray,
    A: np.ndarray,
    pos: np.ndarray,
    grads: _Inputs,
    norm: str,
    h: int,
) -> np.ndarray:
    """dA from d(A turned): RoPE turned back, then through the RMS norm (its weights'
    gradient added to grads[norm][h])."""
    if not turns(st):
        return d_turned
    d = unroped(st, d_turned, pos)
    if st.qk_norm != "rms":
        return d
    inv = 1.0 / np.sqrt(np.mean(A * A, axis=-1, keepdims=True) + st.qk_norm_eps)
    weight = grads.weight(norm, h)
    if weight is not None:
        grads.arrays[norm][h, 0] += (d * A * inv).sum(axis=0)
        d = d * weight
    return inv * d - A * inv**3 * (d * A).mean(axis=-1, keepdims=True)  # type: ignore[no-any-return]


def _project_back(
    s: Scenario,
    X: np.ndarray,
    d_A: np.ndarray,
    grads: _Inputs,
    d_X: np.ndarray,
    weight: str,
    bias: str,
    h: int,
) -> None:
    """A = X W[h] + b[h]: W's and b's gradients added to grads, X's to d_X."""
    W = np.asarray(getattr(s, weight)[h])
    grads.arrays[weight][h] += X.T @ d_A
    grads.arrays[bias][h, 0] += d_A.sum(axis=0)
    d_X += d_A @ W.T


@dataclass
class _Inputs:
    """The inputs' gradients as they are summed, and the weights of the norms."""

    arrays: dict[str, np.ndarray]
    norms: dict[str, np.ndarray | None]

    @staticmethod
    def zeros(s: Scenario) -> _Inputs:
        st = s.settings
        names: Sequence[str] = ("X", "X_kv") if s.cross else ("X",)
        if st.projections:
            names = (*names, "W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O")
            if st.qk_norm != "none":
                names = (*names, "q_norm", "k_norm")
        if st.positional == "relative-bias":
            names = (*names, "relative_bias")
        arrays = {name: np.zeros(np.shape(getattr(s, name))) for name in names}
        norms: dict[str, Any] = {
            name: (np.asarray(getattr(s, name)) if st.projections else None)
            for name in ("q_norm", "k_norm")
        }
        return _Inputs(arrays, norms)

    def weight(self, norm: str, h: int) -> np.ndarray | None:
        stack = self.norms[norm]
        return None if stack is None else stack[h, 0]

    def done(self) -> dict[str, np.ndarray]:
        for a in self.arrays.values():
            _frozen(a)
        return self.arrays


def _frozen(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a
