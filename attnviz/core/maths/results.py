"""What a computation gives: a ``Head`` per query head, and a ``Result`` of the whole
layer or a ``HeadResult`` of one head (which cannot pass for the whole)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from attnviz.core.maths.scenario import Settings
from attnviz.core.maths.scoring import Rule, row_entropy

HEAD_MATRICES = ("Q", "K", "V", "scores", "scaled", "masked", "weights", "output")
TURNED_MATRICES = ("Q_rot", "K_rot")  # Q and K as the scores see them: after QK-norm and RoPE
LAYER_MATRICES = ("X", "concat", "final")


@dataclass(frozen=True, eq=False)
class Stages:
    """What one head's softmax was made from, n × m each: the raw scores Q' K'ᵀ, scaled
    (times the scale, soft-capped, plus ALiBi) and masked (what softmax sees)."""

    scores: np.ndarray
    scaled: np.ndarray
    masked: np.ndarray


@dataclass(frozen=True, eq=False)
class RowStats:
    """Per query row of one head: weight on the hidden keys, the row's total weight,
    and the entropy (nats) of its softmax distribution."""

    leak: np.ndarray
    row_sum: np.ndarray
    entropy: np.ndarray


@dataclass(frozen=True, eq=False)
class Head:
    """One head's intermediates; all arrays read-only float64 (empty_rows and keep bool).

    ``Q`` and ``output`` are n × d_k, ``K`` and ``V`` m × d_k (the key/value head this
    query head reads): the projections with their biases. ``Q_rot`` and ``K_rot`` are Q
    and K as the scores see them (after QK-norm and RoPE; Q and K themselves otherwise).
    ``weights`` is n × m. Per row: ``m`` and ``Z``, the softmax's offset (the row's
    maximum) and denominator Σ exp(s − m) with the sink's term; ``sink``, the share of
    the row's softmax the sink took (0 without sinks); ``empty_rows``, True where every
    score is −∞ and there is no sink (weights, output and entropy 0, never NaN).
    ``keep`` is the n × m dropout mask (True = kept), or None.

    ``stages`` (scores, scaled, masked) are kept for the heads a computation was asked to
    keep them for (the shown head); for any other they are made again when asked for,
    never stored afterwards. ``rows`` likewise (leak, row_sum, entropy).
    """

    Q: np.ndarray
    K: np.ndarray
    V: np.ndarray
    Q_rot: np.ndarray
    K_rot: np.ndarray
    weights: np.ndarray
    output: np.ndarray
    m: np.ndarray
    Z: np.ndarray
    empty_rows: np.ndarray
    sink: np.ndarray
    keep: np.ndarray | None
    index: int  # which query head of the scenario (its ALiBi slope, its sink)
    rule: Rule | None  # None: stages and rows were given (the torch engine)
    stages: Stages | None = None
    rows: RowStats | None = None

    def made_stages(self) -> Stages:
        """The head's stages: kept, or made again from Q' and K'."""
        if self.stages is not None:
            return self.stages
        assert self.rule is not None, "a head without a rule was given its stages"
        scores = self.Q_rot @ np.ascontiguousarray(self.K_rot.T)
        scaled = scores.copy()
        self.rule.scale(scaled[None], [self.index])
        masked = scaled
        if self.rule.masks:
            masked = scaled.copy()
            self.rule.mask(masked)
        return Stages(_frozen(scores), _frozen(scaled), _frozen(masked))

    @property
    def scores(self) -> np.ndarray:
        return self.made_stages().scores

    @property
    def scaled(self) -> np.ndarray:
        return self.made_stages().scaled

    @property
    def masked(self) -> np.ndarray:
        return self.made_stages().masked

    def row_stats(self) -> RowStats:
        """leak, row_sum and entropy: given, or made from the weights and the stages."""
        if self.rows is not None:
            return self.rows
        return RowStats(self.leak, self.row_sum, self.entropy)

    @property
    def leak(self) -> np.ndarray:
        if self.rows is not None:
            return self.rows.leak
        assert self.rule is not None
        future = self.rule.future.astype(np.float64)
        return _frozen(np.einsum("ij,ij->i", self.weights, future))

    @property
    def row_sum(self) -> np.ndarray:
        return self.rows.row_sum if self.rows is not None else _frozen(self.weights.sum(axis=-1))

    @property
    def entropy(self) -> np.ndarray:
        if self.rows is not None:
            return self.rows.entropy
        assert self.rule is not None
        rule, masked = self.rule, self.masked
        p = self.weights
        if rule.reweighted:  # the softmax before the weights were changed
            p = np.exp(masked - self.m[:, None])
            p /= np.where(self.empty_rows, 1.0, self.Z)[:, None]
        entropy = row_entropy(masked, p, self.m, self.Z, self.empty_rows)
        if rule.settings.sinks is not None:
            entropy += self.sink * (self.m - rule.settings.sinks[self.index])
        return _frozen(entropy)


@dataclass(frozen=True, eq=False)
class Computed:
    """What every result of one scenario holds beside its heads: the tokens, settings,
    the input actually used (X plus the positional encoding, if any) and the mask."""

    tokens: tuple[str, ...]
    settings: Settings
    X: np.ndarray
    future: np.ndarray  # (n, m) bool: the mask hides key j from query i (hidden_keys)
    key_tokens: tuple[str, ...] | None  # the keys' labels under cross-attention
    X_kv: np.ndarray | None  # the keys' input under cross-attention
    biases: tuple[str, ...]  # the biases in use (not all zero): of b_Q, b_K, b_V, b_O
    n_heads: int
    d_k: int

    @property
    def keys(self) -> tuple[str, ...]:
        """The labels of the keys (the columns of scores and weights)."""
        return self.tokens if self.key_tokens is None else self.key_tokens

    @property
    def scale_factor(self) -> float:
        """What raw scores are divided by: √d_k, 1/scale_value, or 1 with scaling off."""
        st = self.settings
        if not st.scale:
            return 1.0
        if st.scale_value is not None:
            return 1.0 / st.scale_value
        return float(np.sqrt(self.d_k))

    def head(self, h: int) -> Head:
        """Query head h (0-based); KeyError when this result does not hold it."""
        raise KeyError(f"head {h + 1}: this result holds no heads")

    def matrix(self, name: str, head: int | None = None) -> np.ndarray:
        """One intermediate as a 2-D array; head (0-based) for the per-head ones."""
        if name in HEAD_MATRICES or name in TURNED_MATRICES:
            if head is None:
                raise KeyError(f"{name}: which head?")
            return getattr(self.head(head), name)  # type: ignore[no-any-return]
        if name in LAYER_MATRICES:
            return self._layer_matrix(name)
        raise KeyError(f"unknown matrix {name!r}")

    def _layer_matrix(self, name: str) -> np.ndarray:
        if name == "X":
            return self.X
        raise KeyError(f"{name}: this result holds one head, not the mix")


@dataclass(frozen=True, eq=False)
class HeadResult(Computed):
    """One query head of a scenario, computed before (or without) the others: what a
    view of that head draws first. It holds no mix, and no other head."""

    index: int
    one: Head

    def head(self, h: int) -> Head:
        if h != self.index:
            raise KeyError(f"head {h + 1}: this result holds head {self.index + 1} alone")
        return self.one


@dataclass(frozen=True, eq=False)
class Result(Computed):
    """Every intermediate of one scenario; all arrays are read-only.

    ``heads`` holds one ``Head`` per query head, in order; each head field is also
    available stacked with the head on axis 0 (``result.weights[h, i, j]``, made on
    each use). With projections off there is one head with Q = K = V = X (K = V = X_kv
    under cross-attention) and ``final`` equals ``concat`` (no W_O). A result of
    ``layer()`` (streaming) holds concat and final but no heads.
    """

    heads: tuple[Head, ...]
    concat: np.ndarray
    final: np.ndarray

    def head(self, h: int) -> Head:
        if not 0 <= h < len(self.heads):
            raise KeyError(f"head {h + 1} does not exist ({len(self.heads)} heads)")
        return self.heads[h]

    def _layer_matrix(self, name: str) -> np.ndarray:
        return self.X if name == "X" else self.concat if name == "concat" else self.final

    def stacked(self, name: str) -> np.ndarray | None:
        """One field of every head stacked on axis 0 (None for a field heads lack)."""
        parts = [getattr(h, name) for h in self.heads]
        if not parts or parts[0] is None:
            return None
        return _frozen(np.stack(parts))

    Q = property(lambda self: self.stacked("Q"))
    K = property(lambda self: self.stacked("K"))
    V = property(lambda self: self.stacked("V"))
    Q_rot = property(lambda self: self.stacked("Q_rot"))
    K_rot = property(lambda self: self.stacked("K_rot"))
    scores = property(lambda self: self.stacked("scores"))
    scaled = property(lambda self: self.stacked("scaled"))
    masked = property(lambda self: self.stacked("masked"))
    weights = property(lambda self: self.stacked("weights"))
    output = property(lambda self: self.stacked("output"))
    leak = property(lambda self: self.stacked("leak"))
    row_sum = property(lambda self: self.stacked("row_sum"))
    sink = property(lambda self: self.stacked("sink"))
    entropy = property(lambda self: self.stacked("entropy"))
    empty_rows = property(lambda self: self.stacked("empty_rows"))
    keep = property(lambda self: self.stacked("keep"))


def _frozen(*arrays: np.ndarray) -> np.ndarray:
    """Make the arrays read-only; returns the first."""
    for a in arrays:
        a.flags.writeable = False
    return arrays[0]
