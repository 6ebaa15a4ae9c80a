"""Ready-made scenarios: the worked example, one per lesson stage, a GPT-2-sized one."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from attnviz.core.maths.scenario import LIMITS, Scenario, ScenarioError, Settings, from_heads

WORKED_TOKENS = ("she", "saw", "the", "cat")
WORKED_X = [
    [0.90, 0.10, -0.30, 0.20],
    [0.20, 0.80, 0.40, -0.50],
    [-0.40, 0.10, 0.90, 0.30],
    [0.30, -0.60, 0.20, 0.80],
]
WORKED_HEADS = [
    {
        "W_Q": [[0.1, 0.3], [0.7, -0.9], [0.3, -0.7], [-0.9, 0.7]],
        "W_K": [[0.9, -0.9], [0.6, -0.3], [-0.9, 0.7], [0.2, -0.4]],
        "W_V": [[0.5, -0.2], [0.1, 0.6], [-0.3, 0.4], [0.7, 0.1]],
    },
    {
        "W_Q": [[-0.6, -0.2], [-0.2, -0.8], [0.8, 0.6], [0.9, 0.8]],
        "W_K": [[0.9, -0.7], [0.8, 0.3], [0.4, 0.0], [-0.9, -0.9]],
        "W_V": [[0.2, 0.4], [-0.5, 0.3], [0.6, -0.1], [0.1, -0.6]],
    },
]
WORKED_W_O = [
    [0.5, -0.1, 0.3, 0.2],
    [0.1, 0.6, -0.2, 0.4],
    [-0.3, 0.2, 0.5, 0.1],
    [0.2, 0.3, 0.1, -0.4],
]


def worked_example(settings: Settings | None = None) -> Scenario:
    """The worked example: 4 tokens, d_model 4, two heads of d_k 2 (causal, scaled)."""
    return from_heads(WORKED_TOKENS, WORKED_X, WORKED_HEADS, WORKED_W_O, settings)


def random_scenario(
    n: int = 64, d_model: int = 768, heads: int = 12, d_k: int = 64, seed: int = 0
) -> Scenario:
    """Standard-normal X; weights scaled by 1/√fan-in so Q, K, V entries have unit variance."""
    if not 1 <= n <= LIMITS.tokens:
        raise ScenarioError(f"n: {n}; expected 1 to {LIMITS.tokens}")
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d_model))
    W = rng.standard_normal((3, heads, d_model, d_k)) / np.sqrt(d_model)
    W_O = rng.standard_normal((heads * d_k, d_model)) / np.sqrt(heads * d_k)
    tokens = tuple(f"t{i + 1}" for i in range(n))
    return Scenario(tokens=tokens, X=X, W_Q=W[0], W_K=W[1], W_V=W[2], W_O=W_O)


def _stage(**settings: object) -> Callable[..., Scenario]:
    return lambda **_: worked_example(Settings(**settings))  # type: ignore[arg-type]


@dataclass(frozen=True)
class Preset:
    """A ready-made scenario: ``name`` for the command line, ``title`` for menus."""

    name: str
    title: str
    summary: str
    make: Callable[..., Scenario]
    sized: bool = False  # takes n and seed


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in [
        Preset(
            "worked-example",
            "Worked example",
            "4 tokens (she saw the cat), d_model 4, two heads of d_k 2; causal mask, scaled",
            _stage(),
        ),
        Preset(
            "stage-1-simple",
            "Lesson 1: simple self-attention",
            "softmax(X Xᵀ) X on the worked example: no projections, no scaling, no mask",
            _stage(projections=False, scale=False, mask="none"),
        ),
        Preset(
            "stage-2-softmax",
            "Lesson 2: softmax",
            "softmax turns the scores X Xᵀ into weights that sum to 1 in each row",
            _stage(projections=False, scale=False, mask="none"),
        ),
        Preset(
            "stage-3-projections",
            "Lesson 3: projections",
            "Q = X W_Q, K = X W_K, V = X W_V; no scaling, no mask",
            _stage(scale=False, mask="none"),
        ),
        Preset(
            "stage-4-scaling",
            "Lesson 4: scaling by √d_k",
            "scores divided by √d_k before softmax; no mask",
            _stage(scale=True, mask="none"),
        ),
        Preset(
            "stage-5-causal-mask",
            "Lesson 5: the causal mask",
            "each token attends only to itself and earlier tokens (later keys set to −∞)",
            _stage(),
        ),
        Preset(
            "stage-6-multi-head",
            "Lesson 6: multi-head attention",
            "two heads side by side, concatenated and mixed by W_O",
            _stage(),
        ),
        Preset(
            "stage-7-cost",
            "Lesson 7: the cost of attention",
            "GPT-2-small sizes with random weights, n tokens (default 64): the n² cost",
            lambda n=64, seed=0: random_scenario(n=n, seed=seed),
            sized=True,
        ),
        Preset(
            "sliding-window",
            "Sliding window (Mistral, Gemma)",
            "GPT-2-small sizes, n tokens (default 16), each query sees itself and the 3 "
            "keys before it: a band of weights instead of a triangle",
            lambda n=16, seed=0: random_scenario(n=n, seed=seed).with_settings(
                mask="sliding-window", window=4
            ),
            sized=True,
        ),
        Preset(
            "gpt2-small",
            "GPT-2 small (random weights)",
            "d_model 768, 12 heads of d_k 64, random weights, n tokens (default 64)",
            lambda n=64, seed=0: random_scenario(n=n, seed=seed),
            sized=True,
        ),
    ]
}


def make_preset(name: str, n: int | None = None, seed: int | None = None) -> Scenario:
    """The named preset; n and seed apply to the sized (random) presets only."""
    preset = PRESETS.get(name)
    if preset is None:
        raise ScenarioError(f"preset {name!r} does not exist; try one of: {', '.join(PRESETS)}")
    if not preset.sized:
        if n is not None or seed is not None:
            sized = " or ".join(p.name for p in PRESETS.values() if p.sized)
            raise ScenarioError(f"preset {name!r} has a fixed size: n and seed need {sized}")
        return preset.make()
    kwargs = {k: v for k, v in (("n", n), ("seed", seed)) if v is not None}
    return preset.make(**kwargs)
