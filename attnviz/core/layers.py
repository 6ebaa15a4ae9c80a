"""Several layers of one model run on one text: what ``attnviz import --layer all`` writes.

A ``Layers`` holds the run (the model, its text and tokens), the stored layer numbers,
each stored layer's scenario with its ``Provenance`` (none when the import kept the
attention weights only), the model's attention weights of each stored layer, the
overview of every layer × head of the run, and, when the model ran in its own precision
(bfloat16, float16), the attention weights it computed there beside the float64 ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from attnviz.core.maths.scenario import Scenario
from attnviz.core.provenance import SOURCE_KINDS, Provenance

NATIVE_DTYPES = ("bfloat16", "float16", "float32")  # a checkpoint's own precision


class LayersError(ValueError):
    """A stack of layers whose parts do not belong together; the message says why."""


@dataclass(frozen=True)
class Run:
    """What every stored layer shares: the model and the text it ran on."""

    source: str
    kind: str  # one of SOURCE_KINDS
    model_type: str
    layers: int  # how many the model has
    text: str
    token_ids: tuple[int, ...]
    tokens: tuple[str, ...]  # the token labels
    files: tuple[tuple[str, str], ...] = ()  # (file name, sha256 hex)

    @classmethod
    def of(cls, p: Provenance, tokens: tuple[str, ...]) -> Run:
        return cls(p.source, p.kind, p.model_type, p.layers, p.text, p.token_ids, tokens, p.files)


def _frozen(a: np.ndarray, dtype: type) -> np.ndarray:
    array: np.ndarray = np.array(a, dtype=dtype)
    array.setflags(write=False)
    return array


@dataclass(frozen=True, eq=False)
class Layers:
    """Stored layers of one run; ``scenarios`` is empty when only the weights were kept."""

    run: Run
    stored: tuple[int, ...]  # layer numbers, increasing
    weights: tuple[np.ndarray, ...]  # (heads, n, n): the model's attention weights, per stored
    scenarios: tuple[Scenario, ...] = ()  # per stored layer, with its provenance
    overview: np.ndarray | None = None  # (run.layers, heads, n, n) float32: every layer
    dtype: str = "float64"  # the precision the layers were imported and checked in
    native: str = ""  # the checkpoint's own precision when the model also ran in it
    native_weights: tuple[np.ndarray, ...] = field(default=())  # per stored layer, float32

    def __post_init__(self) -> None:
        object.__setattr__(self, "stored", tuple(int(k) for k in self.stored))
        weights_dtype = np.float32 if self.weights_only else np.float64
        object.__setattr__(self, "weights", tuple(_frozen(w, weights_dtype) for w in self.weights))
        natives = tuple(_frozen(w, np.float32) for w in self.native_weights)
        object.__setattr__(self, "native_weights", natives)
        if self.overview is not None:
            object.__setattr__(self, "overview", _frozen(self.overview, np.float32))
        self._check()

    def _check(self) -> None:
        run, stored = self.run, self.stored
        if run.kind not in SOURCE_KINDS:
            raise LayersError(f"run.kind: {run.kind!r}; expected one of {', '.join(SOURCE_KINDS)}")
        if not stored or list(stored) != sorted(set(stored)):
            raise LayersError(f"stored layers {list(stored)}: expected increasing layer numbers")
        if stored[0] < 0 or stored[-1] >= run.layers:
            raise LayersError(f"stored layers: the model has layers 0 to {run.layers - 1}")
        n = len(run.tokens)
        if len(run.token_ids) != n:
            raise LayersError(f"token_ids: {len(run.token_ids)} ids for {n} tokens")
        if len(self.weights) != len(stored):
            raise LayersError(f"{len(self.weights)} weight stacks for {len(stored)} layers")
        shapes = {w.shape for w in self.weights}
        if len(shapes) != 1 or len(next(iter(shapes))) != 3 or self.weights[0].shape[1:] != (n, n):
            raise LayersError(f"weights: expected heads × {n} × {n} in every layer, got {shapes}")
        if self.scenarios and len(self.scenarios) != len(stored):
            raise LayersError(f"{len(self.scenarios)} scenarios for {len(stored)} layers")
        for k, s in zip(stored, self.scenarios, strict=False):
            p = s.provenance
            if p is None or p.layer != k or p.layers != run.layers or s.tokens != run.tokens:
                raise LayersError(f"layer {k}: its scenario is not that layer of this run")
        if self.native_weights and len(self.native_weights) != len(stored):
            raise LayersError(f"{len(self.native_weights)} native stacks for {len(stored)} layers")
        if any(w.shape != self.weights[0].shape for w in self.native_weights):
            raise LayersError("native_weights: expected the shape of the weights")
        if self.native and self.native not in NATIVE_DTYPES:
            raise LayersError(f"native: {self.native!r}; expected one of {NATIVE_DTYPES}")
        o = self.overview
        if o is not None and o.shape != (run.layers, *self.weights[0].shape):
            raise LayersError(f"overview: expected {run.layers} layers of {self.weights[0].shape}")

    @property
    def weights_only(self) -> bool:
        return not self.scenarios

    @property
    def covers_the_model(self) -> bool:
        return self.stored == tuple(range(self.run.layers))

    def index(self, layer: int) -> int:
        """Where layer is among the stored ones; LayersError when it is not stored."""
        try:
            return self.stored.index(layer)
        except ValueError:
            raise LayersError(
                f"layer {layer} is not stored (stored: {spans(self.stored)})"
            ) from None

    def every_layer(self) -> np.ndarray | None:
        """The overview (layers, heads, n, n) in float32: stored, or the stored layers'
        own weights when they are every layer of the model."""
        if self.overview is not None:
            return self.overview
        if self.covers_the_model:
            return np.stack([w.astype(np.float32) for w in self.weights])
        return None

    def native_gap(self, i: int) -> float | None:
        """max |the model in its own precision − the float64 run| over stored layer i."""
        if not self.native_weights:
            return None
        return float(np.abs(self.native_weights[i] - self.weights[i]).max())


def spans(layers: tuple[int, ...] | list[int]) -> str:
    """'0-5', '2, 4-7': layer numbers (increasing) as short ranges."""
    runs: list[list[int]] = []
    for k in layers:
        if runs and k == runs[-1][-1] + 1:
            runs[-1].append(k)
        else:
            runs.append([k])
    return ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


def parse_layers(text: str, layers: int) -> tuple[int, ...]:
    """'all', '3', '0-5' or '1,3-4' as layer numbers of a model of ``layers`` layers;
    LayersError naming what is wrong."""
    text = text.strip()
    if text == "all":
        return tuple(range(layers))
    chosen: set[int] = set()
    for part in text.split(","):
        low, dash, high = part.strip().partition("-")
        if not (low.isdigit() and (high.isdigit() if dash else True)) or len(part) > 20:
            raise LayersError(
                f"--layer {text[:40]!r}: expected all, a layer (3), a range (0-5) or a list (1,3-4)"
            )
        a, b = int(low), int(high) if dash else int(low)
        if a > b:
            raise LayersError(f"--layer {part.strip()}: the range runs backwards")
        if b >= layers:
            raise LayersError(f"layer {b}: the model has layers 0 to {layers - 1}")
        chosen.update(range(a, b + 1))
    return tuple(sorted(chosen))
