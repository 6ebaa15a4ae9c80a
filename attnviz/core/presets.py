"""Ready-made scenarios: the worked example, one per lesson stage, what current models
change (RoPE and GQA, sinks, ALiBi, cross-attention, a sliding window), a GPT-2-sized one."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from attnviz.core.io.names import quoted
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


def small_model(
    tokens: tuple[str, ...],
    d_model: int,
    heads: int,
    d_k: int,
    seed: int,
    kv_heads: int | None = None,
    settings: Settings | None = None,
) -> Scenario:
    """A small scenario with seeded unit-variance weights (random_scenario's scaling),
    optionally with key/value heads shared by groups of query heads."""
    rng = np.random.default_rng(seed)
    kv = heads if kv_heads is None else kv_heads
    X = np.round(rng.standard_normal((len(tokens), d_model)), 2)
    fan_in = np.sqrt(d_model)
    W_Q = np.round(rng.standard_normal((heads, d_model, d_k)) / fan_in, 2)
    W_K, W_V = np.round(rng.standard_normal((2, kv, d_model, d_k)) / fan_in, 2)
    W_O = np.round(rng.standard_normal((heads * d_k, d_model)) / np.sqrt(heads * d_k), 2)
    return Scenario(
        tokens=tokens, X=X, W_Q=W_Q, W_K=W_K, W_V=W_V, W_O=W_O, settings=settings or Settings()
    )


def llama_style() -> Scenario:
    """RoPE and grouped-query attention: 4 query heads over 2 key/value heads."""
    tokens = ("the", "cat", "sat", "on", "the", "mat", "and", "slept")
    return small_model(tokens, 8, 4, 4, seed=7, kv_heads=2, settings=Settings(positional="rope"))


def with_sinks() -> Scenario:
    """The worked example with a sink logit per head: rows sum to less than 1."""
    return worked_example(Settings(sinks=(0.5, 2.0)))


def alibi_example() -> Scenario:
    """ALiBi on 4 heads: slopes 1/4, 1/16, 1/64, 1/256, a recency band for the first."""
    tokens = ("once", "upon", "a", "time", "there", "was", "a", "fox")
    return small_model(tokens, 8, 4, 2, seed=3, settings=Settings(positional="alibi"))


def cross_attention() -> Scenario:
    """3 queries (a decoder's English) over 5 keys (an encoder's French), no mask."""
    s = small_model(("the", "cat", "sat"), 4, 2, 2, seed=11, settings=Settings(mask="none"))
    rng = np.random.default_rng(12)
    X_kv = np.round(rng.standard_normal((5, 4)), 2)
    return dataclasses.replace(s, kv_tokens=("le", "chat", "est", "assis", "."), X_kv=X_kv)


def qk_norm_example() -> Scenario:
    """RMS-normalised queries and keys per head (Qwen3): X ten times larger changes no
    score."""
    tokens = ("the", "cat", "sat", "on", "the", "mat")
    s = small_model(tokens, 8, 2, 4, seed=5, settings=Settings(qk_norm="rms"))
    rng = np.random.default_rng(6)
    q_norm, k_norm = np.round(1 + 0.3 * rng.standard_normal((2, 2, 1, 4)), 2)
    return dataclasses.replace(s, X=s.X * 10, q_norm=q_norm, k_norm=k_norm)


def softcap_example() -> Scenario:
    """The worked example with X × 4: raw scores up to 32, capped at 2 by 2·tanh(s/2)."""
    s = worked_example(Settings(softcap=2.0))
    return dataclasses.replace(s, X=s.X * 4)


def _stage(**settings: object) -> Callable[..., Scenario]:
    return lambda **_: worked_example(Settings(**settings))  # type: ignore[arg-type]


SENTENCE = ("the", "cat", "sat", "on", "the", "mat", ".")
LETTERS = ("b", "i", "a", "k", "h", "g", "i", "h")


def leak_lesson(mask: str = "causal", dropout: float = 0.0) -> Scenario:
    """A sentence of the toy corpus, d_model 16, two heads of 8, RoPE, next-token loss."""
    st = Settings(mask=mask, positional="rope", loss="next-token", dropout=dropout)
    return small_model(SENTENCE, 16, 2, 8, seed=10, settings=st)


def saturation_lesson() -> Scenario:
    """Eight letters, one head of d_k 64 in d_model 64, RoPE, ÷√d_k off."""
    st = Settings(scale=False, positional="rope")
    return small_model(LETTERS, 64, 1, 64, seed=11, settings=st)


def specialise_lesson() -> Scenario:
    """Eight letters, d_model 16, two heads of 8, sinusoidal positions."""
    return small_model(LETTERS, 16, 2, 8, seed=12, settings=Settings(positional="sinusoidal"))


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
            "stage-8-current-models",
            "Lesson 8: what current models change",
            "the llama-style scenario: RoPE and 4 query heads sharing 2 key/value heads",
            llama_style,
        ),
        Preset(
            "stage-9-tiles",
            "Lesson 9: tiles instead of the n × n matrix",
            "the worked example, for stepping FlashAttention's tiles in the Tiling dock",
            _stage(),
        ),
        Preset(
            "stage-10-leak",
            "Lesson 10: the leak exploited",
            "a sentence of the toy corpus, d_model 16, two heads of 8, RoPE, the leaky zero "
            "mask: train it to predict the next word, against the same layer under −∞",
            lambda: leak_lesson(mask="causal-zero"),
        ),
        Preset(
            "stage-11-saturation",
            "Lesson 11: saturation stalls learning",
            "eight letters, one head of d_k 64, RoPE, ÷√d_k off: train it to name the "
            "previous letter, against the same head scaled",
            saturation_lesson,
        ),
        Preset(
            "stage-12-specialise",
            "Lesson 12: heads specialise",
            "eight letters, d_model 16, two heads of 8, sinusoidal positions: train it to "
            "name the previous letter and the first in capitals",
            specialise_lesson,
        ),
        Preset(
            "stage-13-dropout",
            "Lesson 13: dropout in training, not at inference",
            "lesson 10's layer with attention dropout 0.3 while training",
            lambda: leak_lesson(dropout=0.3),
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
            "llama-style",
            "Llama-style: RoPE and GQA",
            "8 tokens, d_model 8; RoPE turns Q and K by position; 4 query heads share 2 "
            "key/value heads of d_k 4 (grouped-query attention)",
            llama_style,
        ),
        Preset(
            "sinks",
            "Attention sinks (gpt-oss)",
            "the worked example with a learned sink logit per head (0.5 and 2): the sink "
            "takes a share of each row, so the weights sum to less than 1",
            with_sinks,
        ),
        Preset(
            "alibi",
            "ALiBi (BLOOM, MPT)",
            "8 tokens, 4 heads; no position encoding, but scores fall by slope × distance "
            "(slopes 1/4, 1/16, 1/64, 1/256)",
            alibi_example,
        ),
        Preset(
            "qk-norm",
            "QK-norm (Qwen3, Gemma 3)",
            "6 tokens, 2 heads of d_k 4, X ten times the usual size: each query and key row "
            "is RMS-normalised over d_k (times a learned weight per feature) before the "
            "scores, so they stay small (OLMo 2 normalises a token's whole projection, "
            "every head together: QK-norm rms-whole)",
            qk_norm_example,
        ),
        Preset(
            "softcap",
            "Soft-capped scores (Gemma 2, Grok)",
            "the worked example with X × 4: raw scores up to 32 would make rows one-hot; "
            "capping them with 2·tanh(s/2) keeps every score within ±2",
            softcap_example,
        ),
        Preset(
            "cross-attention",
            "Cross-attention (encoder-decoder)",
            "3 queries (the cat sat) over 5 keys and values of their own (le chat est "
            "assis .): scores are 3 × 5; no mask",
            cross_attention,
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
        raise ScenarioError(
            f"preset {quoted(name)} does not exist; try one of: {', '.join(PRESETS)}"
        )
    if not preset.sized:
        if n is not None or seed is not None:
            sized = " or ".join(p.name for p in PRESETS.values() if p.sized)
            raise ScenarioError(f"preset {quoted(name)} has a fixed size: n and seed need {sized}")
        return preset.make()
    kwargs = {k: v for k, v in (("n", n), ("seed", seed)) if v is not None}
    return preset.make(**kwargs)
