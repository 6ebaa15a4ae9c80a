"""Causal generation with a KV cache: one new attention row per token (lesson stage 7).

``KVCache.start(scenario)`` then ``step()`` for token t = 0, 1, 2, …: project the token
to q, k, v for every head, append k and v to the cache, attend from q to every cached
key, and mix the heads with W_O. Each step is checked against row t of the full causal
computation (``engine.compute``), which it must match to rounding.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from attnviz.core.maths.cost import BYTES_PER
from attnviz.core.maths.engine import Result, compute, kept_columns, sinusoidal
from attnviz.core.maths.scenario import Scenario

CACHE_DTYPES = ("float64", "float32", "float16")


class EndOfSequence(IndexError):
    """step() was called after the last token: every token is already cached."""


@dataclass(frozen=True, eq=False)
class Step:
    """What step t computed; arrays are read-only float64 with the head on axis 0.

    - ``q``, ``k``, ``v``: (h, d_k), token t's query and the key and value rows it
      appended to the cache;
    - ``scores``: (h, t+1), q·k_j for every cached key j; ``scaled``: what softmax sees
      (scores / √d_k, or the scores themselves with scaling off);
    - ``weights``: (h, t+1) softmax of ``scaled``; ``output``: (h, d_k) weights · cached V;
    - ``final``: (d_model,) the heads' outputs concatenated in order, times W_O;
    - ``cache_numbers``: 2·(t+1)·h·d_k numbers held after the step; ``cache_bytes``:
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
    Projections, scaling, the positional encoding and head ablation follow the settings,
    as in the engine: with projections off there is one head with q = k = v = x and no
    W_O; an ablated head is computed (``output``) but left out of the W_O mix (``final``).
    Stepping past the last token raises ``EndOfSequence``.
    """

    def __init__(self, scenario: Scenario) -> None:
        st = scenario.settings
        self.scenario = scenario
        # What every step must reproduce, row by row.
        self.reference: Result = compute(scenario.with_settings(mask="causal", dropout=0.0))
        X = scenario.X
        if st.positional == "sinusoidal":
            X = X + sinusoidal(scenario.n, scenario.d_model)
        self._X = X
        heads, d_k = (scenario.n_heads, scenario.d_k) if st.projections else (1, scenario.d_model)
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
        x = self._X[t]
        if s.settings.projections:
            q, k, v = x @ s.W_Q, x @ s.W_K, x @ s.W_V  # (d_model,) @ (h, d_model, d_k)
        else:
            q = k = v = x[None]
        self._K[:, t] = k
        self._V[:, t] = v
        K, V = self._K[:, : t + 1], self._V[:, : t + 1]

        scores = np.einsum("hk,hjk->hj", q, K)
        scaled = scores / np.sqrt(self.d_k) if s.settings.scale else scores
        # Every cached key is at or before t: nothing to mask.
        e = np.exp(scaled - scaled.max(axis=1, keepdims=True))
        weights = e / e.sum(axis=1, keepdims=True)
        output = np.einsum("hj,hjk->hk", weights, V)
        concat = output.reshape(-1)  # head h fills columns [h·d_k, (h+1)·d_k)
        if not s.settings.projections:
            final = concat
        elif s.settings.ablated:
            final = concat[self._kept] @ s.W_O[self._kept]
        else:
            final = concat @ s.W_O
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
        worst = 0.0
        for mine, name in zip(qkv, ("Q", "K", "V"), strict=True):
            full = np.stack([getattr(h, name)[t] for h in heads])
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
