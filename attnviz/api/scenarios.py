"""Scenarios from Python: load, save, compute, presets, and layers built from arrays.

Arrays may be NumPy arrays, nested lists or torch tensors (read as float64 on the CPU;
torch itself is never imported here). Matrices follow attnviz's row-vector convention:
``Q = X W_Q`` with ``W_Q`` of d_model × (heads · d_k), which is ``linear.weight.T`` for a
``torch.nn.Linear``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from attnviz.core.io.files import load_scenario, save_scenario
from attnviz.core.maths.forward import compute as _compute
from attnviz.core.maths.results import Result
from attnviz.core.maths.scenario import Scenario, ScenarioError, Settings, head_stack
from attnviz.core.presets import PRESETS, make_preset

PathLike = str | os.PathLike[str]


def load(path: PathLike) -> Scenario:
    """The scenario in an ``.attn.json`` or ``.attn.npz`` file (FileFormatError, a
    ValueError naming the problem, for a bad file)."""
    return load_scenario(path)


def save(scenario: Scenario, path: PathLike) -> Path:
    """Write the scenario as ``.attn.json`` (text) or ``.attn.npz`` (binary, for large
    layers), by the suffix; the write is atomic. Returns the path."""
    save_scenario(path, scenario)
    return Path(path)


def presets() -> tuple[str, ...]:
    """The names of the ready-made scenarios (as ``attnviz presets`` lists them)."""
    return tuple(PRESETS)


def preset(name: str = "worked-example", n: int | None = None, seed: int | None = None) -> Scenario:
    """A ready-made scenario by name; ``n`` and ``seed`` size the random ones."""
    return make_preset(name, n, seed)


@dataclass(frozen=True, eq=False)
class Computation:
    """Every intermediate of a scenario, computed by attnviz's reference pass (float64).

    Arrays are read-only; per-head ones have the head on axis 0 (head 1 is index 0).
    ``result`` is the core ``Result`` with every other intermediate (``Q``, ``scores``,
    ``row_sum``, ``entropy``, …). In a notebook it shows each head's weights.
    """

    scenario: Scenario
    result: Result

    @property
    def weights(self) -> np.ndarray:
        """Attention weights, (heads, n, m)."""
        weights = self.result.weights
        assert weights is not None
        return np.asarray(weights)

    @property
    def scores(self) -> np.ndarray:
        """Scores as the softmax sees them (scaled, masked), (heads, n, m)."""
        masked = self.result.masked
        assert masked is not None
        return np.asarray(masked)

    @property
    def head_outputs(self) -> np.ndarray:
        """Each head's output, weights · V, (heads, n, d_k)."""
        output = self.result.output
        assert output is not None
        return np.asarray(output)

    @property
    def output(self) -> np.ndarray:
        """The layer's output, concat · W_O + b_O, (n, d_model)."""
        return self.result.final

    @property
    def n_heads(self) -> int:
        return len(self.result.heads)

    def _repr_html_(self) -> str:
        from attnviz.api.figures import figure

        heads = "".join(
            f"<div>{figure(self, 'weights', h + 1).svg}</div>" for h in range(self.n_heads)
        )
        return f'<div style="display:flex;flex-wrap:wrap;gap:8px">{heads}</div>'


def compute(scenario: Scenario) -> Computation:
    """Compute every head and the mix of a scenario."""
    return Computation(scenario, _compute(scenario))


def array(values: Any, where: str) -> np.ndarray:
    """values as a float64 NumPy array: a torch tensor is detached and copied to the CPU."""
    if hasattr(values, "detach"):
        values = values.detach().to("cpu").double().numpy()
    try:
        return np.array(values, dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise ScenarioError(f"{where}: not an array of numbers ({e})") from None


def labels(count: int, given: Sequence[str] | None, where: str) -> tuple[str, ...]:
    """The given labels (count of them), or t1 … t<count>."""
    if given is None:
        return tuple(f"t{i + 1}" for i in range(count))
    if len(given) != count:
        raise ScenarioError(f"{where}: {len(given)} labels for {count} rows")
    return tuple(str(g) for g in given)


def _heads_of(a: np.ndarray, where: str) -> np.ndarray:
    """(n, d) as one head, (heads, n, d) as it is."""
    if a.ndim == 2:
        return a[None]
    if a.ndim != 3:
        raise ScenarioError(f"{where}: expected (n, d_k) or (heads, n, d_k), got {a.ndim}-D")
    return a


def mask_settings(mask: Any, n: int, m: int) -> tuple[dict[str, Any], np.ndarray | None]:
    """Settings and mask matrix for mask: "none", "causal", or an n × m 0/1 array (1 = may
    attend)."""
    if isinstance(mask, str):
        if mask not in ("none", "causal"):
            raise ScenarioError(f"mask {mask!r}: expected 'none', 'causal' or an n × m 0/1 array")
        return {"mask": mask}, None
    allowed = array(mask, "mask")
    if allowed.shape != (n, m):
        raise ScenarioError(f"mask: expected {n}×{m} (queries × keys), got {allowed.shape}")
    if not np.isin(allowed, (0.0, 1.0)).all():
        raise ScenarioError("mask: expected 0 (hidden) or 1 (may attend) in every cell")
    return {"mask": "custom"}, allowed


def from_qkv(
    Q: Any,
    K: Any,
    V: Any,
    *,
    tokens: Sequence[str] | None = None,
    keys: Sequence[str] | None = None,
    mask: Any = "none",
    scale: float | None = None,
) -> Scenario:
    """A scenario whose heads attend with exactly these Q, K and V.

    ``Q`` is (heads, n, d_k) or (n, d_k); ``K`` and ``V`` (heads or key/value heads, m,
    d_k). ``mask``: "none", "causal" or an n × m 0/1 array; ``scale`` replaces 1/√d_k.
    ``keys`` labels the keys and makes it cross-attention (so does m ≠ n).
    X is an identity and ``W_Q`` holds Q itself (``W_K``, ``W_V`` hold K and V, over a
    second identity ``X_kv`` under cross-attention), so Q = X W_Q is exact and an edit of
    a ``W_Q`` cell in the window is an edit of Q. W_O puts the heads' outputs side by side
    into the output's first columns.
    """
    q, k, v = (_heads_of(array(a, name), name) for a, name in ((Q, "Q"), (K, "K"), (V, "V")))
    if k.shape != v.shape:
        raise ScenarioError(f"K and V: expected one shape, got {k.shape} and {v.shape}")
    (h, n, d_k), (g, m, _) = q.shape, k.shape
    if k.shape[2] != d_k:
        raise ScenarioError(f"Q and K: d_k {d_k} and {k.shape[2]} differ")
    cross = m != n or keys is not None
    offset = n if cross else 0  # the keys' own columns of the identity, under cross-attention
    d_model = max(offset + m, h * d_k)
    W_Q = np.zeros((h, d_model, d_k))
    W_Q[:, :n] = q
    W_K, W_V = np.zeros((g, d_model, d_k)), np.zeros((g, d_model, d_k))
    W_K[:, offset : offset + m], W_V[:, offset : offset + m] = k, v
    options, allowed = mask_settings(mask, n, m)
    if options["mask"] == "causal" and m != n:
        options["causal_alignment"] = "bottom-right"  # the last query sees every key
    if scale is not None:
        options["scale_value"] = float(scale)
    return Scenario(
        tokens=labels(n, tokens, "tokens"),
        X=np.eye(n, d_model),
        W_Q=head_stack("W_Q", W_Q),
        W_K=head_stack("W_K", W_K),
        W_V=head_stack("W_V", W_V),
        W_O=np.eye(h * d_k, d_model),
        settings=Settings(**options),
        kv_tokens=labels(m, keys, "keys") if cross else None,
        X_kv=np.eye(m, d_model, k=offset) if cross else None,
        mask_matrix=allowed,
    )


def _per_head(W: Any, heads: int, where: str) -> np.ndarray:
    """A d_model × (heads · d_k) weight (or a (heads, d_model, d_k) stack) as a stack."""
    a = array(W, where)
    if a.ndim == 3:
        return a
    if a.ndim != 2 or a.shape[1] % heads:
        raise ScenarioError(
            f"{where}: expected d_model × (heads · d_k) with {heads} heads, got {a.shape}"
        )
    d_model, width = a.shape
    return a.reshape(d_model, heads, width // heads).transpose(1, 0, 2)


def _bias(b: Any, heads: int, where: str) -> np.ndarray | None:
    """A bias of heads · d_k as (heads, 1, d_k); None stays None."""
    if b is None:
        return None
    return array(b, where).reshape(heads, 1, -1)


def from_weights(
    X: Any,
    W_Q: Any,
    W_K: Any,
    W_V: Any,
    W_O: Any,
    *,
    heads: int,
    kv_heads: int | None = None,
    tokens: Sequence[str] | None = None,
    biases: dict[str, Any] | None = None,
    mask: Any = "none",
    scale: float | None = None,
    settings: Settings | None = None,
) -> Scenario:
    """A scenario from an input X (n × d_model) and a layer's weights.

    ``W_Q`` is d_model × (heads · d_k) (``q_proj.weight.T`` of a ``torch.nn.Linear``) or a
    (heads, d_model, d_k) stack; ``W_K`` and ``W_V`` have ``kv_heads`` heads (default:
    ``heads``); ``W_O`` is (heads · d_k) × d_model (``o_proj.weight.T``). ``biases``: any
    of "b_Q", "b_K", "b_V", "b_O" as flat vectors. ``mask`` and ``scale`` as in
    ``from_qkv``; ``settings`` instead sets every option (RoPE, ALiBi, soft-cap, …).
    """
    x = array(X, "X")
    if x.ndim != 2:
        raise ScenarioError(f"X: expected n × d_model, got {x.ndim}-D")
    g = kv_heads or heads
    given = dict(biases or {})
    unknown = sorted(set(given) - {"b_Q", "b_K", "b_V", "b_O"})
    if unknown:
        raise ScenarioError(f"biases: {', '.join(unknown)}; expected b_Q, b_K, b_V, b_O")
    if settings is None:
        options, allowed = mask_settings(mask, len(x), len(x))
        if scale is not None:
            options["scale_value"] = float(scale)
        settings = Settings(**options)
    else:
        allowed = None
    b_O = given.get("b_O")
    return Scenario(
        tokens=labels(len(x), tokens, "tokens"),
        X=x,
        W_Q=head_stack("W_Q", _per_head(W_Q, heads, "W_Q")),
        W_K=head_stack("W_K", _per_head(W_K, g, "W_K")),
        W_V=head_stack("W_V", _per_head(W_V, g, "W_V")),
        W_O=array(W_O, "W_O"),
        settings=settings,
        b_Q=_bias(given.get("b_Q"), heads, "b_Q"),  # type: ignore[arg-type]
        b_K=_bias(given.get("b_K"), g, "b_K"),  # type: ignore[arg-type]
        b_V=_bias(given.get("b_V"), g, "b_V"),  # type: ignore[arg-type]
        b_O=None if b_O is None else array(b_O, "b_O").reshape(1, -1),  # type: ignore[arg-type]
        mask_matrix=allowed,
    )
