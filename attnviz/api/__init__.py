"""attnviz from Python and notebooks, without the window (docs/api.md).

Importing this module imports neither Qt nor torch nor transformers: they are imported
by the calls that need them (a PNG or the window: Qt; a capture or an import: torch).

- ``load``, ``save``, ``preset``, ``presets``: scenario files and ready-made scenarios.
- ``compute``: every intermediate (a ``Computation``; shown inline in a notebook).
- ``figure``: any view of any head as a ``Figure`` (SVG inline, ``.save`` as SVG/PNG).
- ``from_qkv``, ``from_weights``: a scenario from your own Q, K, V or weights.
- ``capture``: a context manager reading one attention module during a forward pass
  (``torch.nn.MultiheadAttention`` or a transformers attention module).
- ``from_transformers``: a layer of a loaded transformers model, checked against it.
- ``show``: the window on a scenario (blocks from a script; not under ``%gui qt``).
"""

from __future__ import annotations

from attnviz.api.capturing import Captured, capture
from attnviz.api.figures import Figure, figure
from attnviz.api.hf import ModelLayer, from_transformers
from attnviz.api.scenarios import (
    Computation,
    compute,
    from_qkv,
    from_weights,
    load,
    preset,
    presets,
    save,
)
from attnviz.api.window import show
from attnviz.core.figures.figure import VIEWS
from attnviz.core.maths.scenario import Scenario, ScenarioError, Settings

__all__ = [
    "VIEWS",
    "Captured",
    "Computation",
    "Figure",
    "ModelLayer",
    "Scenario",
    "ScenarioError",
    "Settings",
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
