"""Capture one attention module of your own model during a forward pass.

``with capture(module) as captured: model(...)`` registers a forward pre-hook and a
forward hook on the module; its first call inside the block is read: the input(s), the
module's weights at that moment, its mask, and what it returned (its attention weights,
when it returns them per head). ``captured.scenario`` is then that call as a scenario.

Two kinds of module are read:

- ``torch.nn.MultiheadAttention``: packed ``in_proj_weight`` (or separate q/k/v weights
  of the same width), ``out_proj``, ``batch_first``, ``attn_mask`` (bool or 0/−∞, 2-D or
  one per head alike), ``key_padding_mask``, ``is_causal``; cross-attention when key and
  value (equal) differ from the query.
- a ``transformers`` attention module: its ``hidden_states`` input and its projections
  (``q_proj``/``k_proj``/``v_proj``/``o_proj``, BERT's ``query``/``key``/``value``
  (with ``output.dense`` on ``BertAttention``), GPT-2's ``c_attn``/``c_proj``,
  DistilBERT's ``q_lin``/…/``out_lin``), the attention mask the model passed it (causal,
  sliding window, padding; else its causal flag), its scaling, rotary base and QK-norm.
  For a whole layer checked against the model, use ``from_transformers``.

One batch element is read (``batch``, 0 by default).
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from attnviz.api.scenarios import Computation, compute, labels
from attnviz.core.maths.scenario import Scenario, ScenarioError, Settings, head_stack

MHA_ARGS = (
    "query",
    "key",
    "value",
    "key_padding_mask",
    "need_weights",
    "attn_mask",
    "average_attn_weights",
    "is_causal",
)


def _np(t: Any) -> np.ndarray:
    array: np.ndarray = t.detach().to("cpu").double().numpy().copy()
    return array


@dataclass(eq=False)
class Captured:
    """What one call of the module held and returned, once the forward pass has run."""

    tokens: Sequence[str] | None = None
    batch: int = 0
    calls: int = 0  # how many times the module ran inside the block (the first is read)
    module_weights: np.ndarray | None = None  # (heads, n, m), when the module returned them
    module_output: np.ndarray | None = None  # (n, d_model): the module's output
    _scenario: Scenario | None = field(default=None, repr=False)
    _problem: Exception | None = field(default=None, repr=False)

    @property
    def scenario(self) -> Scenario:
        """The call as a scenario (ScenarioError when the module did not run, or does
        something attnviz cannot represent)."""
        if self._problem is not None:
            raise self._problem
        if self._scenario is None:
            raise ScenarioError("the module did not run inside the capture block")
        return self._scenario

    @property
    def computation(self) -> Computation:
        return compute(self.scenario)

    def agreement(self) -> float | None:
        """max |attnviz − module| over the attention weights (None when the module did not
        return its weights per head)."""
        if self.module_weights is None:
            return None
        weights = self.computation.weights
        return float(np.abs(weights - self.module_weights).max())

    def _repr_html_(self) -> str:
        return self.computation._repr_html_()


@contextlib.contextmanager
def capture(
    module: Any, *, batch: int = 0, tokens: Sequence[str] | None = None
) -> Iterator[Captured]:
    """Capture the first call of ``module`` inside the ``with`` block (see the module's
    docstring); ``tokens`` labels the query rows."""
    captured = Captured(tokens, batch)
    read = _read_mha if _is_mha(module) else _read_transformers
    calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def before(_module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if not calls:  # the first call only: a generation loop's later calls hold nothing
            calls.append((args, kwargs))

    def after(_module: Any, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
        captured.calls += 1
        if captured.calls > 1:
            return
        try:
            scenario, weights, out = read(module, *calls[0], output, batch)
            if tokens is not None:
                scenario = dataclasses.replace(
                    scenario, tokens=labels(scenario.n, tokens, "tokens")
                )
            captured._scenario = scenario
            captured.module_weights, captured.module_output = weights, out
        except ScenarioError as e:  # kept for .scenario: the user's forward pass goes on
            captured._problem = e

    handles = [
        module.register_forward_pre_hook(before, with_kwargs=True),
        module.register_forward_hook(after, with_kwargs=True),
    ]
    try:
        yield captured
    finally:
        for h in handles:
            h.remove()


def _is_mha(module: Any) -> bool:
    import torch

    return isinstance(module, torch.nn.MultiheadAttention)


def _one(t: Any, batch: int, batch_first: bool) -> Any:
    """Batch element ``batch`` of a (B, L, E) or (L, B, E) input; an unbatched one as it is."""
    if t.dim() == 2:
        return t
    if not 0 <= batch < t.shape[0 if batch_first else 1]:
        raise ScenarioError(f"batch {batch}: the input holds {t.shape[0 if batch_first else 1]}")
    return t[batch] if batch_first else t[:, batch]


def _read_mha(
    module: Any, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any, batch: int
) -> tuple[Scenario, np.ndarray | None, np.ndarray]:
    import torch

    bound = {**dict(zip(MHA_ARGS, args, strict=False)), **kwargs}
    if module.bias_k is not None or module.add_zero_attn:
        raise ScenarioError(
            "nn.MultiheadAttention with add_bias_kv or add_zero_attn: not supported"
        )
    if module.training and module.dropout > 0:
        raise ScenarioError("the module ran in training mode with dropout: call .eval() first")
    E, H = module.embed_dim, module.num_heads
    if module._qkv_same_embed_dim:
        W = module.in_proj_weight
        weights = [W[:E], W[E : 2 * E], W[2 * E :]]
    elif module.kdim == E and module.vdim == E:
        weights = [module.q_proj_weight, module.k_proj_weight, module.v_proj_weight]
    else:
        raise ScenarioError("nn.MultiheadAttention with kdim or vdim ≠ embed_dim: not supported")
    b = module.in_proj_bias
    biases = [None] * 3 if b is None else [b[:E], b[E : 2 * E], b[2 * E :]]
    q, k, v = (_one(bound[name], batch, module.batch_first) for name in MHA_ARGS[:3])
    if not torch.equal(k, v):
        raise ScenarioError("key and value differ: attnviz reads keys and values from one input")
    cross = k.shape != q.shape or not torch.equal(q, k)
    n, m = q.shape[0], k.shape[0]
    allowed = _mha_allowed(bound, n, m, H, batch)
    mask, matrix = _mask_of(allowed)
    out_b = module.out_proj.bias
    scenario = Scenario(
        tokens=labels(n, None, "tokens"),
        X=_np(q),
        W_Q=head_stack("W_Q", _split(_np(weights[0]).T, H)),
        W_K=head_stack("W_K", _split(_np(weights[1]).T, H)),
        W_V=head_stack("W_V", _split(_np(weights[2]).T, H)),
        W_O=_np(module.out_proj.weight).T,
        settings=Settings(**mask),
        b_Q=None if biases[0] is None else _np(biases[0]).reshape(H, 1, -1),  # type: ignore[arg-type]
        b_K=None if biases[1] is None else _np(biases[1]).reshape(H, 1, -1),  # type: ignore[arg-type]
        b_V=None if biases[2] is None else _np(biases[2]).reshape(H, 1, -1),  # type: ignore[arg-type]
        b_O=None if out_b is None else _np(out_b)[None],  # type: ignore[arg-type]
        kv_tokens=labels(m, None, "keys") if cross else None,
        X_kv=_np(k) if cross else None,
        mask_matrix=matrix,
    )
    out, attn = output
    own = None
    if attn is not None and not bound.get("average_attn_weights", True):  # per head
        own = _np(attn[batch] if attn.dim() == 4 else attn)
    return scenario, own, _np(_one(out, batch, module.batch_first))


def _split(W: np.ndarray, heads: int) -> np.ndarray:
    """A d_model × (heads · d) weight as a (heads, d_model, d) stack."""
    d_model, width = W.shape
    return W.reshape(d_model, heads, width // heads).transpose(1, 0, 2)


def _hidden(mask: Any) -> np.ndarray:
    """A torch mask (bool: True = hidden; float: 0 or −∞ added) as bool, True = hidden."""
    import torch

    if mask.dtype == torch.bool:
        hidden: np.ndarray = mask.detach().to("cpu").numpy().copy()
        return hidden
    values = _np(mask)
    if not np.isin(values, (0.0, -np.inf)).all():
        raise ScenarioError(
            "attn_mask adds values other than 0 and −inf: attnviz has no additive score bias"
        )
    hidden = values == -np.inf
    return hidden


def _mha_allowed(bound: dict[str, Any], n: int, m: int, heads: int, batch: int) -> np.ndarray:
    """Which keys each query may see (n × m), from attn_mask, key_padding_mask, is_causal."""
    hidden = np.zeros((n, m), dtype=bool)
    attn_mask = bound.get("attn_mask")
    if attn_mask is not None:
        per = _hidden(attn_mask)
        if per.ndim == 3:  # (batch · heads, n, m): one mask per head, which must agree
            mine = per[batch * heads : (batch + 1) * heads] if len(per) > heads else per
            if not (mine == mine[0]).all():
                raise ScenarioError("attn_mask differs between heads: attnviz has one mask")
            per = mine[0]
        hidden |= per
    elif bound.get("is_causal"):
        hidden |= np.triu(np.ones((n, m), dtype=bool), k=1)
    padding = bound.get("key_padding_mask")
    if padding is not None:
        pad = _hidden(padding)
        hidden |= (pad[batch] if pad.ndim == 2 else pad)[None, :]
    allowed: np.ndarray = ~hidden
    return allowed


def _mask_of(allowed: np.ndarray) -> tuple[dict[str, Any], np.ndarray | None]:
    """The mask settings for an n × m allowed matrix: none, causal, a sliding window (the
    last ``window`` keys up to the query), or custom with the matrix."""
    if allowed.all():
        return {"mask": "none"}, None
    n, m = allowed.shape
    causal = np.tril(np.ones((n, m), dtype=bool))
    if n == m and np.array_equal(allowed, causal):
        return {"mask": "causal"}, None
    window = int(allowed[-1].sum())
    if (
        n == m
        and window
        and np.array_equal(allowed, causal & np.triu(np.ones((n, m), dtype=bool), k=1 - window))
    ):
        return {"mask": "sliding-window", "window": window}, None
    return {"mask": "custom"}, allowed.astype(np.float64)


def _linear(layer: Any) -> tuple[np.ndarray, np.ndarray | None]:
    """A torch Linear's weight in the row-vector convention (weight.T) and its bias."""
    bias = None if getattr(layer, "bias", None) is None else _np(layer.bias)
    return _np(layer.weight).T, bias


def _projections(module: Any) -> tuple[list[tuple[np.ndarray, np.ndarray | None]], Any]:
    """Q, K, V (weight, bias) in the row-vector convention, and the output projection."""
    for q, k, v, o in (
        ("q_proj", "k_proj", "v_proj", "o_proj"),
        ("q_lin", "k_lin", "v_lin", "out_lin"),
        ("query", "key", "value", None),
    ):
        if all(hasattr(module, name) for name in (q, k, v)):
            parts = [_linear(getattr(module, name)) for name in (q, k, v)]
            return parts, getattr(module, o) if o else None
    if hasattr(module, "c_attn") and hasattr(module, "c_proj"):  # GPT-2's Conv1D: x W + b
        W, b = _np(module.c_attn.weight), _np(module.c_attn.bias)
        d = W.shape[1] // 3
        return [
            (W[:, i * d : (i + 1) * d], b[i * d : (i + 1) * d]) for i in range(3)
        ], module.c_proj
    raise ScenarioError(
        f"{type(module).__name__}: no q/k/v projections found (q_proj…, query…, q_lin…, "
        "c_attn); capture the attention module itself"
    )


def _hf_allowed(module: Any, mask: Any, n: int, batch: int) -> np.ndarray:
    """Which keys each query may see, from the attention_mask the model passed (bool, or
    0 and the dtype's lowest value added); without one, from the module's causal flag."""
    import torch

    if mask is None:
        causal = getattr(module, "is_causal", False)
        allowed: np.ndarray = (
            np.tril(np.ones((n, n), dtype=bool)) if causal else np.ones((n, n), dtype=bool)
        )
        return allowed
    mine = mask[batch if len(mask) > 1 else 0]
    mine = mine[0] if mine.dim() == 3 else mine  # (1, n, m): one mask for every head
    if mine.dtype == torch.bool:
        allowed = mine.detach().to("cpu").numpy().copy()
    else:
        values = _np(mine)
        hidden = values <= torch.finfo(mine.dtype).min / 2
        if not (values[~hidden] == 0).all():
            raise ScenarioError(
                "the attention mask adds a bias to the scores: attnviz has no additive score bias"
            )
        allowed = ~hidden
    if allowed.shape != (n, n):
        raise ScenarioError(
            f"the attention mask is {allowed.shape[0]}×{allowed.shape[1]} for {n} tokens: "
            "a key/value cache from earlier calls is not read; capture a call without one"
        )
    return allowed


def _settings(module: Any, config: Any, d_k: int, kwargs: dict[str, Any]) -> dict[str, Any]:
    """Scale, rotary and QK-norm of a transformers attention module."""
    options: dict[str, Any] = {}
    scaling = getattr(module, "scaling", None)
    if scaling is not None and abs(float(scaling) - d_k**-0.5) > 1e-15:
        options["scale_value"] = float(scaling)
    if kwargs.get("position_embeddings") is not None:
        rope = getattr(config, "rope_parameters", None) or {}
        if rope.get("rope_type", "default") != "default":
            raise ScenarioError(f"RoPE scaling {rope.get('rope_type')!r}: not supported")
        options.update(positional="rope", rope_base=float(rope.get("rope_theta", 10000.0)))
        factor = float(getattr(config, "partial_rotary_factor", 1.0) or 1.0)
        if factor != 1.0:
            options["rope_dims"] = int(d_k * factor)
    norm = getattr(module, "q_norm", None)
    if norm is not None:
        eps: Any = getattr(norm, "variance_epsilon", None) or getattr(norm, "eps", None) or 1e-6
        # a weight per head feature (Qwen3): per head; one per feature of the whole
        # projection (OLMo 2: heads·d_k): the norm is over every head together
        whole = int(norm.weight.numel()) != d_k
        options.update(qk_norm="rms-whole" if whole else "rms", qk_norm_eps=float(eps))
    return options


def _read_transformers(
    module: Any, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any, batch: int
) -> tuple[Scenario, np.ndarray | None, np.ndarray | None]:
    inner = getattr(module, "self", module)  # BertAttention: .self attends, .output.dense mixes
    config = getattr(inner, "config", None) or getattr(module, "config", None)
    try:  # the call's arguments by name, however the model passed them
        kwargs = inspect.signature(module.forward).bind_partial(*args, **kwargs).arguments
    except TypeError:
        kwargs = dict(kwargs)
    X_t = kwargs.get("hidden_states", args[0] if args else None)
    if X_t is None or config is None:
        raise ScenarioError(
            f"{type(module).__name__}: not a transformers attention module (no hidden_states "
            "input or config); nn.MultiheadAttention is read too"
        )
    if getattr(inner, "training", False) and getattr(config, "attention_dropout", 0) > 0:
        raise ScenarioError("the module ran in training mode with dropout: call .eval() first")
    X = _np(_one(X_t, batch, True))
    [(q, bq), (k, bk), (v, bv)], out_layer = _projections(inner)
    if inner is not module:
        out_layer = module.output.dense
    heads = int(config.num_attention_heads)
    kv = int(getattr(config, "num_key_value_heads", None) or heads)
    d_k = q.shape[1] // heads
    stacks: dict[str, Any] = {
        name: _split(w, count)
        for name, w, count in zip(("W_Q", "W_K", "W_V"), (q, k, v), (heads, kv, kv), strict=True)
    }
    for name, b, count in (("b_Q", bq, heads), ("b_K", bk, kv), ("b_V", bv, kv)):
        if b is not None:
            stacks[name] = b.reshape(count, 1, d_k)
    if getattr(inner, "q_norm", None) is not None:
        for name, count in (("q_norm", heads), ("k_norm", kv)):
            w = _np(getattr(inner, name).weight)
            whole = w.size == count * d_k and w.size != d_k  # OLMo 2: (heads·d_k,)
            stacks[name] = (
                w.reshape(count, 1, d_k) if whole else np.tile(w.reshape(1, 1, -1), (count, 1, 1))
            )
    if out_layer is None:  # BertSelfAttention alone: the output is the heads' concat
        W_O, b_O = np.eye(heads * d_k, X.shape[1]), None
    elif hasattr(out_layer, "nf"):  # Conv1D
        W_O, b_O = _np(out_layer.weight), _np(out_layer.bias)
    else:
        W_O, b_O = _linear(out_layer)
    options = _settings(inner, config, d_k, kwargs)
    mask, matrix = _mask_of(_hf_allowed(inner, kwargs.get("attention_mask"), len(X), batch))
    scenario = Scenario(
        tokens=labels(len(X), None, "tokens"),
        X=X,
        W_O=W_O,
        b_O=None if b_O is None else b_O[None],  # type: ignore[arg-type]
        settings=Settings(**options, **mask),
        mask_matrix=matrix,
        **stacks,
    )
    result = output if isinstance(output, tuple) else (output,)
    own = result[1] if len(result) > 1 else None
    weights = _np(own[batch]) if own is not None and own.dim() == 4 else None
    out = _np(_one(result[0], batch, True)) if inner is module else None  # BertAttention: normed
    return scenario, weights, out
