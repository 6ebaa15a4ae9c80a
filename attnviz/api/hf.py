"""A layer of a ``transformers`` model already loaded in Python (no second load).

The layer comes from the importer's own code (``import_layer``: the model runs once
with its attention in the model's precision, float32 steps lifted) and is checked as the
importer checks it: attnviz's weights and output against the model's own, refused beyond
the importer's tolerance.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from attnviz.api.scenarios import Computation, compute
from attnviz.core.maths.scenario import LIMITS, Scenario, ScenarioError
from attnviz.core.models.tokens import Tokenizer, Tokens, label_text, tokenize
from attnviz.core.provenance import Provenance


@dataclass(frozen=True, eq=False)
class ModelLayer:
    """An imported layer: the scenario (with its provenance), the tokens, how far
    attnviz's numbers are from the model's, and the model's own weights of every layer."""

    scenario: Scenario
    tokens: Tokens
    agreement_weights: float  # max |attnviz − model| over the layer's attention weights
    agreement_output: float  # … and over its attention output
    dtype: str  # the model's precision: float64 or float32
    every_layer: tuple[np.ndarray, ...]  # the model's weights (heads, n, n), each layer

    @property
    def computation(self) -> Computation:
        return compute(self.scenario)

    def _repr_html_(self) -> str:
        p = self.scenario.provenance
        assert p is not None
        head = (
            f"<p>{p.model_type} layer {p.layer} of {p.layers}, {len(self.tokens.ids)} tokens, "
            f"{self.dtype}: attnviz vs the model {self.agreement_weights:.2g} (weights), "
            f"{self.agreement_output:.2g} (output)</p>"
        )
        return head + self.computation._repr_html_()


def _tolerance(dtype: str) -> float:
    from attnviz.core.models.importer import TOLERANCE

    return TOLERANCE[dtype]


def _model_dtype(model: Any) -> str:
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    if dtype not in ("float64", "float32"):
        raise ScenarioError(
            f"the model is in {dtype}; attnviz compares a layer in float64 or float32: "
            "call model.to(torch.float64) (exact to ~1e-15) or model.float() first"
        )
    return dtype


def _backend_tokenizer(tokenizer: Any) -> Tokenizer:
    """attnviz's view of a transformers fast tokenizer or a ``tokenizers.Tokenizer``
    (copied: the caller's padding and truncation are left as they are)."""
    backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
    if not hasattr(backend, "to_str"):
        raise ScenarioError(
            f"{type(tokenizer).__name__}: expected a fast tokenizer (transformers' "
            "PreTrainedTokenizerFast or a tokenizers.Tokenizer), or pass the token ids"
        )
    from tokenizers import Tokenizer as Backend

    copy = Backend.from_str(backend.to_str())
    copy.no_padding()
    copy.no_truncation()
    described = json.loads(copy.to_str())
    prefix = ""
    if (described.get("model") or {}).get("type") == "WordPiece":
        prefix = described["model"].get("continuing_subword_prefix") or "##"
    parts = json.dumps(
        [described.get(k) for k in ("decoder", "pre_tokenizer", "normalizer")],
        ensure_ascii=False,
    )
    return Tokenizer(copy, "ByteLevel" in parts, prefix, "Metaspace" in parts or "▁" in parts)


def _tokens(tokenizer: Any, text: str | None, labels: Sequence[str] | None) -> Tokens:
    if text is not None:
        tokens = tokenize(_backend_tokenizer(tokenizer), text)
        if labels is not None:
            raise ScenarioError("labels: give them with token ids, not with a text")
        return tokens
    ids = (
        tokenizer.detach().to("cpu").reshape(-1).tolist()
        if hasattr(tokenizer, "detach")
        else tokenizer
    )
    ids = tuple(int(i) for i in np.asarray(ids).reshape(-1))
    if not 1 <= len(ids) <= LIMITS.tokens:
        raise ScenarioError(f"{len(ids)} token ids: expected 1 to {LIMITS.tokens}")
    shown = tuple(str(i) for i in ids) if labels is None else tuple(label_text(t) for t in labels)
    if len(shown) != len(ids):
        raise ScenarioError(f"labels: {len(shown)} for {len(ids)} token ids")
    return Tokens(ids, shown, (False,) * len(ids))


def _source(model: Any) -> tuple[str, str]:
    """What the model was loaded from, as the provenance names it."""
    name = str(getattr(model.config, "_name_or_path", "") or "")
    if not name:
        return f"{type(model).__name__} (in memory)", "folder"
    return name, "folder" if os.path.isdir(name) else "hub"


def from_transformers(
    model: Any,
    tokenizer: Any,
    text: str | None = None,
    layer: int = 0,
    *,
    labels: Sequence[str] | None = None,
) -> ModelLayer:
    """Layer ``layer`` (from 0) of a loaded ``transformers`` model on ``text``.

    ``tokenizer`` is the model's fast tokenizer (or a ``tokenizers.Tokenizer``); without
    ``text`` it is the token ids instead (a list or a tensor; ``labels`` names them). The
    model runs twice, its weights untouched (once with its float32 steps lifted, once
    unchanged); the layer is refused (ScenarioError) where attnviz's numbers differ from
    the model's beyond the importer's tolerance (1e-10 in float64, 1e-5 in float32), or
    the model's unchanged run from the lifted one beyond 1e-5, as ``attnviz import``
    refuses it. The supported model types are those of ``attnviz import``.
    """
    import torch

    from attnviz.core.models.hf_layer import import_layer
    from attnviz.core.models.importer import own_attentions, same_as_own

    dtype = _model_dtype(model)
    tokens = _tokens(tokenizer, text, labels)
    ids = torch.tensor([list(tokens.ids)], device=next(model.parameters()).device)
    was_training = model.training
    model.eval()  # dropout off: the model's own numbers are then the layer's
    try:
        imported = import_layer(model, ids, layer, tokens.labels)
        same_as_own(own_attentions(model, ids)[layer], imported.model_weights)
    except ScenarioError:
        raise
    except Exception as e:  # the model failed on this input: one line, naming why
        raise ScenarioError(f"the model failed on these tokens ({e})") from e
    finally:
        model.train(was_training)
    r = compute(imported.scenario).result
    weights = float(np.abs(r.weights - imported.model_weights).max())
    output = float(np.abs(r.final - imported.model_output).max())
    if not max(weights, output) <= _tolerance(dtype):
        raise ScenarioError(
            f"attnviz's numbers differ from the model's by {max(weights, output):.2g} "
            f"(expected at most {_tolerance(dtype):g} in {dtype}): this layer does something "
            "attnviz does not represent, so it is not shown as the model"
        )
    source, kind = _source(model)
    provenance = Provenance(
        source=source,
        kind=kind,
        model_type=imported.model_type,
        layer=layer,
        layers=imported.layers,
        text=text if text is not None else " ".join(tokens.labels),
        token_ids=tokens.ids,
        model_weights=imported.model_weights,
        model_output=imported.model_output,
    )
    scenario = dataclasses.replace(imported.scenario, provenance=provenance)
    return ModelLayer(scenario, tokens, weights, output, dtype, imported.every_layer)
