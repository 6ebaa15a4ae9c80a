"""Where an imported layer came from, and what the model itself computed for it.

A ``Provenance`` travels with the scenario (through edits, undo and files): the source
as the user named it, the weights files' SHA-256, the layer, the text and its token ids,
and the model's own attention weights and attention output for that layer, so that
``vs_model`` can say after any edit how far each head has moved from the model.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

SOURCE_KINDS = ("folder", "cache", "package", "hub")


class ProvenanceError(ValueError):
    """A provenance field is invalid; the message names the field."""


def _frozen(a: object) -> np.ndarray:
    array = np.array(a, dtype=np.float64)
    array.setflags(write=False)
    return array


@dataclass(frozen=True, eq=False)
class Provenance:
    """What an imported scenario was imported from."""

    source: str  # the model id or path as the user gave it
    kind: str  # one of SOURCE_KINDS
    model_type: str  # transformers' config.model_type, e.g. "bert"
    layer: int  # 0-based
    layers: int  # how many the model has
    text: str
    token_ids: tuple[int, ...]
    model_weights: np.ndarray  # (heads, n, n): the model's attention weights
    model_output: np.ndarray  # (n, d_model): the attention block's output, before the residual
    files: tuple[tuple[str, str], ...] = field(default=())  # (file name, sha256 hex)

    def __post_init__(self) -> None:
        object.__setattr__(self, "token_ids", tuple(int(t) for t in self.token_ids))
        object.__setattr__(self, "files", tuple((str(a), str(b)) for a, b in self.files))
        object.__setattr__(self, "model_weights", _frozen(self.model_weights))
        object.__setattr__(self, "model_output", _frozen(self.model_output))
        self._check()

    def _check(self) -> None:
        if self.kind not in SOURCE_KINDS:
            raise ProvenanceError(f"provenance.kind: {self.kind!r}; expected one of {SOURCE_KINDS}")
        if not 0 <= self.layer < self.layers:
            raise ProvenanceError(
                f"provenance.layer: {self.layer}; expected 0 to {self.layers - 1}"
            )
        w, out = self.model_weights, self.model_output
        if w.ndim != 3 or w.shape[1] != w.shape[2]:
            raise ProvenanceError(
                f"provenance.model_weights: expected heads × n × n, got shape {w.shape}"
            )
        n = w.shape[1]
        if out.ndim != 2 or out.shape[0] != n:
            raise ProvenanceError(
                f"provenance.model_output: expected {n} rows (one per token), got {out.shape}"
            )
        if len(self.token_ids) != n:
            raise ProvenanceError(f"provenance.token_ids: {len(self.token_ids)} ids for {n} tokens")
        if not (np.isfinite(w).all() and np.isfinite(out).all()):
            raise ProvenanceError("provenance: the model's numbers must be finite")
        if w.size and (w.min() < 0 or w.max() > 1):
            raise ProvenanceError("provenance.model_weights: attention weights lie in [0, 1]")
        for name, digest in self.files:
            if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
                raise ProvenanceError(f"provenance.files[{name!r}]: not a SHA-256 in hex")

    @property
    def heads(self) -> int:
        return int(self.model_weights.shape[0])

    @property
    def n(self) -> int:
        return int(self.model_weights.shape[1])


@dataclass(frozen=True)
class VsModel:
    """How far a computed layer lies from the model's own numbers."""

    per_head: np.ndarray  # (heads,): max |Δ weight| in each head
    per_row: np.ndarray  # (heads, n): max |Δ weight| in each query row
    output: float  # max |Δ| of the attention output

    @property
    def weights(self) -> float:
        return float(self.per_head.max()) if self.per_head.size else 0.0


def vs_model(p: Provenance, weights: np.ndarray, output: np.ndarray) -> VsModel | str:
    """Compare computed ``weights`` (heads, n, m) and attention ``output`` (n, d_model)
    with the model's; a sentence saying why not when their shapes no longer match."""
    if weights.shape != p.model_weights.shape:
        return (
            f"not comparable: the model's weights are {_dims(p.model_weights.shape)} "
            f"(heads × queries × keys), this scenario's {_dims(weights.shape)}"
        )
    delta = np.abs(weights - p.model_weights)
    per_row = delta.max(axis=2) if delta.size else np.zeros(delta.shape[:2])
    per_head = per_row.max(axis=1) if per_row.size else np.zeros(delta.shape[0])
    out = (
        float(np.abs(output - p.model_output).max())
        if output.shape == p.model_output.shape
        else float("nan")
    )
    return VsModel(per_head=per_head, per_row=per_row, output=out)


def _dims(shape: tuple[int, ...]) -> str:
    return "×".join(map(str, shape))
