"""Random and named scenarios for the engine's tests: every variant, alone and together."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
from hypothesis import strategies as st

from attnviz.core.maths.scenario import MASKS, Scenario, Settings


def make(
    n: int = 4,
    m: int | None = None,
    d_model: int = 5,
    H: int = 4,
    G: int = 2,
    d_k: int = 4,
    seed: int = 0,
    biases: bool = True,
    norms: bool = True,
    **settings_: Any,
) -> Scenario:
    """A random scenario; m keys of their own (cross-attention) when m is given."""
    rng = np.random.default_rng(seed)

    def r(*shape: int) -> np.ndarray:
        return rng.normal(size=shape)

    extra: dict[str, Any] = {}
    if m is not None:
        extra.update(kv_tokens=tuple(f"k{j}" for j in range(m)), X_kv=r(m, d_model))
    if biases:
        extra.update(b_Q=r(H, 1, d_k), b_K=r(G, 1, d_k), b_V=r(G, 1, d_k), b_O=r(1, d_model))
    if norms:
        extra.update(q_norm=1 + 0.3 * r(H, 1, d_k), k_norm=1 + 0.3 * r(G, 1, d_k))
    s = Scenario(
        tokens=tuple(f"t{i}" for i in range(n)),
        X=r(n, d_model),
        W_Q=r(H, d_model, d_k),
        W_K=r(G, d_model, d_k),
        W_V=r(G, d_model, d_k),
        W_O=r(H * d_k, d_model),
        settings=Settings(**settings_),
        **extra,
    )
    if s.settings.positional == "relative-bias":  # T5's learned table: every bucket counts
        s = dataclasses.replace(s, relative_bias=r(s.settings.relative_buckets, H))
    return s


VARIANTS: dict[str, dict[str, Any]] = {
    "plain": {},
    "no-scale": {"scale": False},
    "scale_value": {"scale_value": 0.3},
    "qk-norm": {"qk_norm": "rms"},
    "qk-norm-eps": {"qk_norm": "rms", "qk_norm_eps": 0.5},
    "qk-norm-whole": {"qk_norm": "rms-whole"},
    "qk-norm-whole-rope": {"qk_norm": "rms-whole", "positional": "rope", "qk_norm_eps": 0.5},
    "rope-half": {"positional": "rope"},
    "rope-interleaved": {"positional": "rope", "rope_style": "interleaved"},
    "rope-partial": {"positional": "rope", "rope_dims": 2, "rope_base": 50.0},
    # a model's own frequencies for d_k 4's two pairs, and an attention factor (YaRN)
    "rope-scaled": {"positional": "rope", "rope_frequencies": (0.9, 0.013), "rope_factor": 1.25},
    "alibi": {"positional": "alibi"},
    "alibi-own-slopes": {"positional": "alibi", "alibi_slopes": (0.5, -0.25, 1.0, 0.0)},
    "sinusoidal": {"positional": "sinusoidal"},
    # T5's: 4 buckets a direction, distances 0, 1 exact, 2 and 3 by their logarithm
    "relative-bias": {
        "positional": "relative-bias",
        "relative_buckets": 8,
        "relative_max_distance": 3,
        "scale": False,
    },
    "relative-bias-decoder": {
        "positional": "relative-bias",
        "relative_buckets": 5,
        "relative_max_distance": 3,
        "relative_bidirectional": False,
    },
    "softcap": {"softcap": 0.7},
    "sinks": {"sinks": (-1.0, 0.0, 2.0, 0.5)},
    "no-mask": {"mask": "none"},
    "causal-zero": {"mask": "causal-zero"},
    "drop-after-softmax": {"mask": "drop-after-softmax"},
    "window": {"mask": "sliding-window", "window": 2},
    "bottom-right": {"causal_alignment": "bottom-right"},
    "bottom-right-window": {
        "mask": "sliding-window",
        "window": 3,
        "causal_alignment": "bottom-right",
    },
    "custom": {"mask": "custom"},
    "ablated": {"ablated": (1, 3)},
    "dropout": {"dropout": 0.3, "dropout_seed": 5},
    "everything-rope": {
        "positional": "rope",
        "rope_style": "interleaved",
        "rope_dims": 2,
        "qk_norm": "rms",
        "softcap": 1.5,
        "sinks": (0.5, -2.0, 1.0, 0.0),
        "scale_value": 0.8,
        "mask": "sliding-window",
        "window": 2,
        "causal_alignment": "bottom-right",
    },
    "everything-alibi": {
        "positional": "alibi",
        "qk_norm": "rms",
        "softcap": 2.0,
        "sinks": (0.1, 0.2, -0.3, 3.0),
        "mask": "custom",
        "causal_alignment": "bottom-right",
    },
    "everything-relative-bias": {
        "positional": "relative-bias",
        "relative_buckets": 6,
        "relative_max_distance": 2,
        "qk_norm": "rms",
        "softcap": 2.0,
        "sinks": (0.1, 0.2, -0.3, 3.0),
        "mask": "custom",
        "causal_alignment": "bottom-right",
    },
    "no-projections": {"projections": False, "positional": "rope", "qk_norm": "rms"},
}
SHAPES = {
    "gqa": {"H": 4, "G": 2},
    "mqa": {"H": 4, "G": 1},
    "mha": {"H": 4, "G": 4},
    "cross-more-keys": {"H": 4, "G": 2, "n": 3, "m": 6},
    "cross-fewer-keys": {"H": 4, "G": 4, "n": 5, "m": 2},
}


@st.composite
def scenarios(draw: st.DrawFn, dropout: bool = True, tokens: tuple[int, int] = (1, 5)) -> Scenario:
    n = draw(st.integers(*tokens))
    cross = draw(st.booleans())
    m = draw(st.integers(*tokens)) if cross else n
    d_model = draw(st.integers(1, 5))
    H = draw(st.integers(1, 4))
    G = draw(st.sampled_from([g for g in range(1, H + 1) if H % g == 0]))
    d_k = draw(st.integers(1, 5))
    seed = draw(st.integers(0, 2**32 - 1))
    projections = draw(st.booleans() | st.just(True))
    width = d_k if projections else d_model
    positional = draw(st.sampled_from(("none", "sinusoidal", "rope", "alibi", "relative-bias")))
    mask = draw(st.sampled_from(MASKS))
    per_head = st.lists(st.floats(-4, 4), min_size=H, max_size=H).map(tuple)
    rope_dims = None
    if projections and width >= 2:
        rope_dims = draw(st.none() | st.integers(1, width // 2).map(lambda k: 2 * k))
    config = {
        "projections": projections,
        "scale": draw(st.booleans()),
        "scale_value": draw(st.none() | st.floats(0.05, 3.0)),
        "mask": mask,
        "window": draw(st.integers(1, 6)),
        "causal_alignment": draw(st.sampled_from(("top-left", "bottom-right"))),
        "positional": positional,
        "rope_base": draw(st.sampled_from((10000.0, 10.0, 1.5))),
        "rope_style": draw(st.sampled_from(("half", "interleaved"))),
        "rope_dims": rope_dims,
        "alibi_slopes": draw(st.none() | per_head),
        "qk_norm": draw(st.sampled_from(("none", "rms", "rms-whole"))),
        "qk_norm_eps": draw(st.sampled_from((1e-6, 0.1, 1.0))),
        "softcap": draw(st.none() | st.floats(0.1, 20.0)),
        "sinks": draw(st.none() | per_head),
        "ablated": tuple(sorted(draw(st.sets(st.integers(0, H - 1), max_size=H)))),
        "dropout": draw(st.sampled_from((0.0, 0.25))) if dropout else 0.0,
    }
    if positional == "relative-bias":  # T5's buckets: from the fewest to a lot
        bidirectional = draw(st.booleans())
        buckets = draw(st.integers(4 if bidirectional else 2, 40))
        exact = (buckets // 2 if bidirectional else buckets) // 2
        config["relative_bidirectional"] = bidirectional
        config["relative_buckets"] = buckets
        config["relative_max_distance"] = draw(st.integers(exact + 1, exact + 12))
    pairs = (rope_dims or width - width % 2) // 2
    if positional == "rope" and pairs and draw(st.booleans()):  # a model's own, scaled
        config["rope_frequencies"] = tuple(draw(st.floats(1e-3, 2.0)) for _ in range(pairs))
        config["rope_factor"] = draw(st.floats(0.5, 2.0))
    s = make(
        n=n,
        m=m if cross else None,
        d_model=d_model,
        H=H,
        G=G,
        d_k=d_k,
        seed=seed,
        biases=draw(st.booleans()),
        norms=draw(st.booleans()),
        **config,
    )
    if mask == "custom":
        rng = np.random.default_rng(seed + 1)
        s = dataclasses.replace(s, mask_matrix=(rng.random((n, m)) < 0.6).astype(float))
    return s
