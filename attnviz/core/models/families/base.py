"""What a model family gives the importer: the model types it handles, the check of
config.json that refuses what it does not model (before any weight is read), and the
import of one layer of a loaded model."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from attnviz.core.models.hf_layer import ImportedLayer

Config = dict[str, Any]  # config.json as read
ROPE_KEYS = ("rope_parameters", "rope_scaling")  # config.json's names for RoPE's settings
ImportLayer = Callable[[Any, Any, int, tuple[str, ...]], "ImportedLayer"]


def _nothing(model: Any) -> None:
    """A loaded model needs nothing changed."""


def _auto(model_type: str) -> str:
    """The class transformers' AutoModel picks for the config."""
    return "AutoModel"


def positions(config: Config) -> int | None:
    """The most positions config.json gives the model (None when it names none)."""
    value = (
        config.get("max_position_embeddings")
        or config.get("n_positions")
        or config.get("max_seq_len")  # MPT's
    )
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class Family:
    """One family of transformers architectures that attnviz imports exactly."""

    name: str  # as messages name it: "GPT-2", "the BERT family"
    model_types: tuple[str, ...]  # config.json's model_type values it handles
    check_config: Callable[[Config], str]  # '' or why the config is refused, by name
    import_layer: ImportLayer  # (model, input_ids 1 × n, layer, token labels)
    prepare: Callable[[Any], None] = _nothing  # once, on the loaded model
    # buffers that older checkpoints saved inside the layers, which are no weights
    # (a causal mask, a constant): not refused as unexpected
    stale_buffers: tuple[str, ...] = ()  # regular expressions, searched in the names
    # the transformers class (a name) that loads a model of this type: a family whose
    # attention is one part of a larger model loads that part alone (T5's encoder)
    model_class: Callable[[str], str] = _auto
    # checkpoint weights that class never loads (T5's decoder): neither counted among
    # the layers nor refused as unexpected (regular expressions, searched in the names)
    not_loaded: tuple[str, ...] = ()
    # a decoder: transformers' causal mask turns bidirectional under config is_causal false
    causal: bool = True
    # the most tokens a text may have (None: no limit of the model's own)
    max_positions: Callable[[Config], int | None] = positions


def flag(config: Config, key: str, default: bool = False) -> bool:
    """A config.json switch (absent or null: ``default``)."""
    value = config.get(key)
    return default if value is None else bool(value)


def rope_problem(config: Config, supported: tuple[str, ...]) -> str:
    """Why the config's RoPE is refused ('' when its types are among ``supported``)."""
    for key in ROPE_KEYS:
        rope = config.get(key)
        if rope is None:
            continue
        if not isinstance(rope, dict):
            return f"config.json: {key} is {type(rope).__name__}; expected an object"
        # one set of parameters, or one per kind of layer ({"full_attention": {...}, …})
        sets = (
            list(rope.values())
            if rope and all(isinstance(v, dict) for v in rope.values())
            else [rope]
        )
        for parameters in sets:
            kind = parameters.get("rope_type", parameters.get("type", "default"))
            if kind not in supported:
                return f"{key} type {kind!r} is not supported (supported: {', '.join(supported)})"
    return ""
