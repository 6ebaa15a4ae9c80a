"""The model families attnviz imports, one module each, and the registry of them.

A family module defines ``FAMILY`` (a ``Family``: its model types, ``check_config`` over
config.json alone, and the import of one layer). Adding a family is one module here and
one line in ``FAMILIES``. Nothing here imports torch: configs are checked before any
weight is read.
"""

from __future__ import annotations

from attnviz.core.models.families import (
    bert,
    bloom,
    falcon,
    gemma,
    gpt2,
    gpt_neox,
    gptj,
    llama,
    modernbert,
    mpt,
    olmo2,
    opt,
    phi3,
    stablelm,
    t5,
)
from attnviz.core.models.families.base import Config, Family

FAMILIES: tuple[Family, ...] = (
    gpt2.FAMILY,
    bert.FAMILY,
    llama.FAMILY,
    modernbert.FAMILY,
    gemma.FAMILY,
    bloom.FAMILY,
    falcon.FAMILY,
    gpt_neox.FAMILY,
    opt.FAMILY,
    gptj.FAMILY,
    stablelm.FAMILY,
    phi3.FAMILY,
    t5.FAMILY,
    olmo2.FAMILY,
    mpt.FAMILY,
)
SUPPORTED = tuple(t for family in FAMILIES for t in family.model_types)
# model types refused by name: what their attention has that attnviz's does not
REFUSED: dict[str, str] = {
    "gemma3": "Gemma 3's multimodal model (a vision tower beside the text model) is not "
    "supported; its text model (model type gemma3_text) is",
}


def family_of(model_type: object) -> Family | None:
    """The family that handles ``model_type`` (None when none does)."""
    return next((f for f in FAMILIES if model_type in f.model_types), None)


def unsupported(config: Config) -> str:
    """Why attnviz cannot import the model config.json describes ('' when it can)."""
    model_type = config.get("model_type")
    if isinstance(model_type, str) and model_type in REFUSED:
        return f"model type {model_type!r}: {REFUSED[model_type]}"
    family = family_of(model_type)
    if family is None:
        return f"model type {model_type!r}: not supported yet (supported: {', '.join(SUPPORTED)})"
    problem = family.check_config(config)
    if not problem and family.causal and config.get("is_causal") is False:
        problem = (
            f"{family.name}: is_causal false (transformers' mask then lets every token see "
            "later ones) is not supported"
        )
    return problem
