"""attnviz: a desktop lab for transformer attention, and its API for Python and notebooks.

``import attnviz`` pulls in neither Qt nor torch nor transformers; the API's names
(``attnviz.compute``, ``attnviz.figure``, ``attnviz.capture``, … see ``attnviz.api`` and
docs/api.md) are imported from ``attnviz.api`` when first used, and the calls import
what they need. See ``attnviz.core`` for the maths.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from attnviz.api import (
        VIEWS,
        Captured,
        Computation,
        Figure,
        ModelLayer,
        Scenario,
        ScenarioError,
        Settings,
        capture,
        compute,
        figure,
        from_qkv,
        from_transformers,
        from_weights,
        load,
        preset,
        presets,
        save,
        show,
    )

__all__ = [
    "VIEWS",
    "Captured",
    "Computation",
    "Figure",
    "ModelLayer",
    "Scenario",
    "ScenarioError",
    "Settings",
    "__version__",
    "capture",
    "compute",
    "figure",
    "from_qkv",
    "from_transformers",
    "from_weights",
    "load",
    "preset",
    "presets",
    "save",
    "show",
]
API = frozenset(__all__) - {"__version__"}


def __getattr__(name: str) -> Any:
    if name in API:
        from attnviz import api

        return getattr(api, name)
    raise AttributeError(f"module 'attnviz' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *API})
