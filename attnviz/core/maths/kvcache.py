"""Causal generation with a KV cache: one new attention row per token (lesson stage 7).

``KVCache.start(scenario)`` then ``step()`` for token t = 0, 1, 2, …: project the token
to q for every query head and k, v for every key/value head, append k and v to the
cache, attend from q to every cached key, and mix the heads with W_O. What current
models add follows the scenario: biases, QK-norm, RoPE (the cache keeps keys already
rotated, as real caches do), ALiBi, the scale, soft-cap and sinks; with key/value heads
shared by groups of query heads (GQA, MQA) the cache holds only G heads. Each step is
checked against row t of the full causal computation (``engine.compute``), which it
must match to rounding.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from attnviz.core.maths.cost import BYTES_PER
from attnviz.core.maths.forward import compute, kept_columns
from attnviz.core.maths.positions import rope_width, sinusoidal
from attnviz.core.maths.results import Result
from attnviz.core.maths.scenario import Scenario, ScenarioError
from attnviz.core.maths.variants import (
    alibi_slopes,
    relative_bucket,
    rms_norm,
    rope,
    softcap,
    softmax_with_sink,
)

CACHE_DTYPES = ("float64", "float32", "float16")


class EndOfSequence(IndexError):
    """step() was called after the last token: every token is already cached."""


@dataclass(frozen=True, eq=False)
class Step:
    """What step t computed; arrays are read-only float64 with the head on axis 0.

    - ``q``: (h, d_k), token t's query per query head; ``k``, ``v``: (G, d_k), the key
      and value rows it appended to the cache per key/value head (before QK-norm and
      RoPE; the cache keeps k as scored);
    - ``scores``: (h, t+1), q·k_j for every cached key j; ``scaled``: what softmax sees
      (scores / √d_k, or the scores themselves with scaling off);
    - ``weights``: (h, t+1) softmax of ``scaled``; ``output``: (h, d_k) weights · cached V;
    - ``final``: (d_model,) the heads' outputs concatenated in order, times W_O;
    - ``cache_numbers``: 2·(t+1)·G·d_k numbers held after the step; ``cache_bytes``:
      that in bytes per dtype (float64, float32, float16);
    - ``max_diff``: largest |difference| of q, k, v, weights, output and final from row t
      of full causal attention (future weights there count against 0).
    """

    t: int
    token: str
    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    scores: np.ndarray
    scaled: np.ndarray
    weights: np.ndarray
    output: np.ndarray
    final: np.ndarray
    cache_numbers: int
    cache_bytes: Mapping[str, int]
    max_diff: float


class KVCache:
    """A per-head K/V cache stepping causally through a scenario's tokens.

    Generation is causal, so ``settings.mask`` is ignored (every step sees exactly the
    keys cached so far, which is the causal −∞ mask) and so is dropout (inference).
    Cross-attention has no cache to grow (its keys are the encoder's, fixed): refused.
    Projections, scaling, the positional encoding and head ablation follow the settings,
    as in the engine: with projections off there is one head with q = k = v = x and no
    W_O; an ablated head is computed (``output``) but left out of the W_O mix (``final``).
    Stepping past the last token raises ``EndOfSequence``.
    """

    def __init__(self, scenario: Scenario, reference: Result | None = None) -> None:
        """``reference``: compute() of the scenario under the causal mask without dropout,
        if made already."""
        st = scenario.settings
        if scenario.cross:
            raise ScenarioError(
                "KV cache: generation runs over one sequence; under cross-attention the keys "
                "are X_kv's, fixed. Switch cross-attention off to step a cache."
            )
        self.scenario = scenario
        # What every step must reproduce, row by row.
        if reference is None:
            reference = compute(scenario.with_settings(mask="causal", dropout=0.0))
        self.reference = reference
        X = scenario.X
        if st.positional == "sinusoidal":
            X = X + sinusoidal(scenario.n, scenario.d_model)
        self._X = X
        heads, d_k = (scenario.kv_heads, scenario.d_k) if st.projections else (1, scenario.d_model)
        # Preallocated so that a step writes one row instead of copying the whole cache.
        self._K = np.zeros((heads, scenario.n, d_k))
        self._V = np.zeros((heads, scenario.n, d_k))
        self._t = 0
        # Columns of concat (rows of W_O) that belong to heads not ablated.
        self._kept = kept_columns(st, scenario.n_heads, scenario.d_k)

    @classmethod
    def start(cls, scenario: Scenario) -> KVCache:
        """An empty cache before token 0 of scenario."""
        return cls(scenario)

    @property
    def n(self) -> int:
        """Tokens in the scenario."""
        return self.scenario.n

    @property
    def t(self) -> int:
        """Tokens cached so far, which is also the index of the next step's token."""
        return self._t

    @property
    def done(self) -> bool:
        return self._t == self.n

    @property
    def n_heads(self) -> int:
        return self._K.shape[0]

    @property
    def d_k(self) -> int:
        return self._K.shape[2]

    @property
    def keys(self) -> np.ndarray:
        """The cached keys, (h, t, d_k), read-only."""
        return _readonly(self._K[:, : self._t])

    @property
    def values(self) -> np.ndarray:
        """The cached values, (h, t, d_k), read-only."""
        return _readonly(self._V[:, : self._t])

    def step(self) -> Step:
        """Process the next token: extend the cache by one row per head and attend."""
        t, s = self._t, self.scenario
        if t >= self.n:
            raise EndOfSequence(f"step: all {self.n} tokens are already cached; start again")
        st = s.settings
        x = self._X[t]
        q_norm: np.ndarray | None = None
        k_norm: np.ndarray | None = None
        if st.projections:
            # (d_model,) @ (heads, d_model, d_k), plus each head's bias
            q = x @ s.W_Q + s.b_Q[:, 0]
            k, v = x @ s.W_K + s.b_K[:, 0], x @ s.W_V + s.b_V[:, 0]
            q_norm, k_norm = s.q_norm[:, 0], s.k_norm[:, 0]
        else:
            q = k = v = x[None]
        self._K[:, t] = self._turn(k, k_norm, t)
        self._V[:, t] = v
        group = [h * self.n_heads // len(q) for h in range(len(q))]  # each query's KV head
        K, V = self._K[group, : t + 1], self._V[group, : t + 1]

        scores = np.einsum("hk,hjk->hj", self._turn(q, q_norm, t), K)
        scaled = scores
        if st.scale:
            scaled = scores * st.scale_value if st.scale_value else scores / np.sqrt(self.d_k)
        if st.softcap is not None:
            scaled = softcap(scaled, st.softcap)
        if st.positional == "alibi":
            slopes = np.asarray(st.alibi_slopes or alibi_slopes(s.n_heads))[: len(q)]
            scaled = scaled - slopes[:, None] * (t - np.arange(t + 1))
        if st.positional == "relative-bias":  # T5's table by the bucket of j − t
            buckets = relative_bucket(np.arange(t + 1) - t, st.relative_bidirectional,
                                      st.relative_buckets, st.relative_max_distance)  # fmt: skip
            scaled = scaled + np.asarray(s.relative_bias)[buckets, : len(q)].T
        # Every cached key is at or before t: nothing to mask.
        if st.sinks is not None:
            weights, _ = softmax_with_sink(scaled, np.asarray(st.sinks)[: len(q)])
        else:
            e = np.exp(scaled - scaled.max(axis=1, keepdims=True))
            weights = e / e.sum(axis=1, keepdims=True)
        output = np.einsum("hj,hjk->hk", weights, V)
        concat = output.reshape(-1)  # head h fills columns [h·d_k, (h+1)·d_k)
        if not st.projections:
            final = concat
        elif st.ablated:
            final = concat[self._kept] @ s.W_O[self._kept] + s.b_O[0]
        else:
            final = concat @ s.W_O + s.b_O[0]
        self._t = t + 1

        numbers = 2 * (t + 1) * self.n_heads * self.d_k
        return Step(
            t=t,
            token=s.tokens[t],
            q=_readonly(np.array(q)),
            k=_readonly(np.array(k)),
            v=_readonly(np.array(v)),
            scores=_readonly(scores),
            scaled=_readonly(np.array(scaled)),
            weights=_readonly(weights),
            output=_readonly(output),
            final=_readonly(final),
            cache_numbers=numbers,
            cache_bytes=MappingProxyType({d: numbers * BYTES_PER[d] for d in CACHE_DTYPES}),
            max_diff=self._difference(t, (q, k, v), weights, output, final),
        )

    def _turn(self, a: np.ndarray, norm: np.ndarray | None, t: int) -> np.ndarray:
        """Rows (heads, d_k) of token t as the scores see them: QK-norm, then RoPE."""
        st = self.scenario.settings
        if st.qk_norm == "rms":
            a = rms_norm(a, norm, st.qk_norm_eps)
        elif st.qk_norm == "rms-whole":  # every head's features of the token together
            a = a / np.sqrt(np.mean(a * a) + st.qk_norm_eps)
            a = a if norm is None else a * norm
        dims = min(rope_width(st, a.shape[-1]), a.shape[-1] - a.shape[-1] % 2)
        if st.positional == "rope" and dims:
            at = np.array([t])
            a = rope(a[:, None], at, st.rope_base, st.rope_style, dims, st.rope_frequencies,
                     st.rope_factor)[:, 0]  # fmt: skip
        return a

    def __iter__(self) -> Iterator[Step]:
        """The remaining steps, up to the last token."""
        while not self.done:
            yield self.step()

    def _difference(
        self,
        t: int,
        qkv: tuple[np.ndarray, np.ndarray, np.ndarray],
        weights: np.ndarray,
        output: np.ndarray,
        final: np.ndarray,
    ) -> float:
        """Largest |difference| of step t from row t of the full causal computation."""
        heads = self.reference.heads
        # the first query head of each key/value head holds that head's K and V
        readers = [g * len(heads) // self.n_heads for g in range(self.n_heads)]
        worst = 0.0
        for mine, name in zip(qkv, ("Q", "K", "V"), strict=True):
            rows = heads if name == "Q" else [heads[h] for h in readers]
            full = np.stack([getattr(h, name)[t] for h in rows])
            worst = max(worst, float(np.abs(mine - full).max()))
        full_w = np.stack([h.weights[t] for h in heads])
        padded = np.zeros_like(full_w)
        padded[:, : t + 1] = weights
        full_out = np.stack([h.output[t] for h in heads])
        return max(
            worst,
            float(np.abs(padded - full_w).max()),
            float(np.abs(output - full_out).max()),
            float(np.abs(final - self.reference.final[t]).max()),
        )


def _readonly(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False
    return array
