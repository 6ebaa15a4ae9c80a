"""The model families attnviz imports, one module each, and the registry of them.

A family module defines ``FAMILY`` (a ``Family``: its model types, ``check_config`` over
config.json alone, and the import of one layer). Adding a family is one module here and
one line in ``FAMILIES``. Nothing here imports torch: configs are checked before any
weight is read.
"""

from __future__ import annotations

from attnviz.core.models.families import bert, gpt2, llama, olmo2
from attnviz.core.models.families.base import Config, Family

FAMILIES: tuple[Family, ...] = (
    gpt2.FAMILY,
    bert.FAMILY,
    llama.FAMILY,
    olmo2.FAMILY,
)
SUPPORTED = tuple(t for family in FAMILIES for t in family.model_types)


def family_of(model_type: object) -> Family | None:
    """The family that handles ``model_type`` (None when none does)."""
    return next((f for f in FAMILIES if model_type in f.model_types), None)


def unsupported(config: Config) -> str:
    """Why attnviz cannot import the model config.json describes ('' when it can)."""
    model_type = config.get("model_type")
    family = family_of(model_type)
    if family is None:
        return f"model type {model_type!r}: not supported yet (supported: {', '.join(SUPPORTED)})"
    return family.check_config(config)
