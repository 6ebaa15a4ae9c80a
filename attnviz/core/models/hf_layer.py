"""One attention layer of a Hugging Face transformers model, as an attnviz scenario: the
machinery every family shares.

``import_layer(model, input_ids, layer, tokens)`` finds the model's family
(``attnviz.core.models.families``, one module per family), checks its config, and
lets the family run the model once: X is the hidden state that enters the layer's
attention (the model's own, after any norm that precedes attention), the
layer's weights come in attnviz's row-vector convention with their biases, and the
model's own attention weights for every layer and the attention output for that layer
come with them, so that the scenario can be checked against the model itself. Anything
a family does not model is refused with a message naming it; nothing approximate is
ever returned as the model.

The model runs with a registered eager attention that keeps the softmax in the model's
own dtype (transformers takes it in float32 for some families even in a float64 model);
families swap in forwards of their own for the other float32 steps (``_rope64``,
``_norm64``), so that in float64 the model's numbers are exact to float64 rounding.
torch and transformers are imported only when a layer is.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from attnviz.core.maths.scenario import Scenario, ScenarioError, Settings, head_stack

Part = tuple[np.ndarray, np.ndarray]  # heads' weights (h, d_model, d) and biases (h, 1, d)

EAGER64 = "attnviz_eager64"
# held while a family runs a model: its swapped forwards and module names, and the
# model's attention implementation, are seen by every thread
_importing = threading.RLock()


@dataclass(frozen=True, eq=False)
class ImportedLayer:
    """A layer as a scenario, with what the model itself computed for it."""

    scenario: Scenario
    model_weights: np.ndarray  # (heads, n, n): the model's attention weights
    model_output: np.ndarray  # (n, d_model): the attention block's output before the residual
    model_type: str
    layer: int
    every_layer: tuple[np.ndarray, ...]  # the model's weights (heads, n, n) in each layer,
    # in float32 (for the overview) but for this layer's own, which is model_weights

    @property
    def layers(self) -> int:
        return len(self.every_layer)


def layer_count(config: Any) -> int:
    """How many attention layers a transformers config describes (GPT-2's n_layer and
    DistilBERT's n_layers are aliases of num_hidden_layers)."""
    return int(config.num_hidden_layers)


def _numpy(t: Any) -> np.ndarray:
    array: np.ndarray = t.detach().to("cpu").double().numpy().copy()
    return array


def _heads(W: np.ndarray, b: np.ndarray | None, heads: int) -> tuple[np.ndarray, np.ndarray]:
    """A (d_model, heads·d) row-vector weight and its bias as per-head stacks."""
    d_model, width = W.shape
    d = width // heads
    stack = W.reshape(d_model, heads, d).transpose(1, 0, 2)
    bias = np.zeros((heads, 1, d)) if b is None else b.reshape(heads, 1, d)
    return stack, bias


def linear_heads(linear: Any, count: int) -> Part:
    """An ``nn.Linear`` (weight out × in, a bias or none) as ``count`` heads, in attnviz's
    row-vector convention."""
    bias = None if linear.bias is None else _numpy(linear.bias)
    return _heads(_numpy(linear.weight).T, bias, count)


def separate_qkv(attention: Any, heads: int, kv: int) -> tuple[Part, Part, Part]:
    """An attention module's separate ``q_proj``, ``k_proj`` and ``v_proj`` as heads."""
    return (
        linear_heads(attention.q_proj, heads),
        linear_heads(attention.k_proj, kv),
        linear_heads(attention.v_proj, kv),
    )


def shared_norm(weight: Any, heads: int, shift: float = 0.0) -> np.ndarray:
    """A QK-norm weight of d_k features that every head shares, as (heads, 1, d_k); plus
    ``shift`` (Gemma's norms multiply by 1 + weight)."""
    row = shift + _numpy(weight).reshape(1, 1, -1)
    tiled: np.ndarray = np.tile(row, (heads, 1, 1))
    return tiled


def layer_scenario(
    tokens: tuple[str, ...],
    X: np.ndarray,
    qkv: tuple[Part, Part, Part],
    out: Any,
    settings: Settings,
    **extra: Any,
) -> Scenario:
    """A layer's scenario: the heads' Q, K and V parts, the output projection ``out`` (an
    ``nn.Linear``, a bias or none) and the settings; ``extra`` any other field of the
    scenario (QK-norm weights, a custom mask)."""
    (W_Q, b_Q), (W_K, b_K), (W_V, b_V) = qkv
    b_O = np.zeros((1, X.shape[1])) if out.bias is None else _numpy(out.bias)[None]
    return Scenario(
        tokens=tokens,
        X=X,
        W_Q=head_stack("W_Q", W_Q),
        W_K=head_stack("W_K", W_K),
        W_V=head_stack("W_V", W_V),
        W_O=_numpy(out.weight).T,
        settings=settings,
        b_Q=head_stack("b_Q", b_Q),
        b_K=head_stack("b_K", b_K),
        b_V=head_stack("b_V", b_V),
        b_O=b_O,
        **extra,
    )


def _run(model: Any, input_ids: Any, entry: Any, projection: Any) -> tuple[Any, Any, Any]:
    """Run the model once; return the input of module ``entry`` (the attention's X), the
    output of ``projection`` (the attention block's output) and the model's outputs."""
    import torch

    captured: dict[str, Any] = {}

    def grab_input(_module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        captured["X"] = args[0] if args else kwargs["hidden_states"]

    def grab_output(_module: Any, _args: tuple[Any, ...], output: Any) -> None:
        captured["out"] = output[0] if isinstance(output, tuple) else output

    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    AttentionInterface.register(EAGER64, _eager64)
    AttentionMaskInterface.register(EAGER64, eager_mask)  # the masks eager attention gets
    config = model.config
    was = config._attn_implementation
    handles = [
        entry.register_forward_pre_hook(grab_input, with_kwargs=True),
        projection.register_forward_hook(grab_output),
    ]
    try:
        config._attn_implementation = EAGER64
        with torch.no_grad():
            out = model(input_ids=input_ids, output_attentions=True)
    finally:
        config._attn_implementation = was
        for h in handles:
            h.remove()
    return captured["X"][0], captured["out"][0], out


def import_layer(model: Any, input_ids: Any, layer: int, tokens: tuple[str, ...]) -> ImportedLayer:
    """Layer ``layer`` (from 0) of the model on ``input_ids`` (1 × n), as a scenario whose
    token labels are ``tokens``."""
    from attnviz.core.models.families import family_of, unsupported

    config = model.config
    model_type = getattr(config, "model_type", "?")
    family = family_of(model_type)
    problem = unsupported({**config.to_dict(), "model_type": model_type})
    if family is None or problem:
        raise ScenarioError(problem)
    layers = layer_count(config)
    if not 0 <= layer < layers:
        raise ScenarioError(f"layer {layer}: the model has layers 0 to {layers - 1}")
    with _importing:  # the swaps below are process-wide: one import at a time
        return family.import_layer(model, input_ids, layer, tokens)


@contextmanager
def swapped_names(module: Any, names: dict[str, Any]) -> Iterator[None]:
    """A Python module's global names replaced while inside (transformers' float32 steps
    that are module functions, not modules)."""
    own = {name: getattr(module, name) for name in names}
    try:
        for name, value in names.items():
            setattr(module, name, value)
        yield
    finally:
        for name, value in own.items():
            setattr(module, name, value)


@contextmanager
def swapped_forwards(forwards: dict[Any, Callable[..., Any]]) -> Iterator[None]:
    """Modules run the given forwards (float64 versions of their steps) while inside."""
    own = {module: module.__dict__.get("forward") for module in forwards}
    try:
        for module, forward in forwards.items():
            module.forward = forward  # an instance attribute, over the class's method
        yield
    finally:
        for module, forward in own.items():
            if forward is None:
                del module.forward
            else:
                module.forward = forward


def _imported(
    scenario: Scenario, out: Any, attention_out: Any, model_type: str, layer: int
) -> ImportedLayer:
    own = _numpy(out.attentions[layer][0])
    every = tuple(
        own if k == layer else a[0].detach().to("cpu").float().numpy()
        for k, a in enumerate(out.attentions)
    )
    return ImportedLayer(scenario, own, _numpy(attention_out), model_type, layer, every)


def _eager64(
    module: Any,
    query: Any,
    key: Any,
    value: Any,
    attention_mask: Any,
    scaling: float,
    dropout: float = 0.0,
    softcap: float | None = None,
    position_bias: Any = None,
    **_: Any,
) -> tuple[Any, Any]:
    """transformers' eager attention with the softmax in the tensors' own dtype; scores
    soft-capped after the scale (c·tanh(s/c)) when the family passes ``softcap``, as its
    eager attention does (Gemma 2), and T5's ``position_bias`` added before the mask, as
    T5's eager attention adds it."""
    import torch

    groups = query.shape[1] // key.shape[1]
    key = key.repeat_interleave(groups, dim=1)
    value = value.repeat_interleave(groups, dim=1)
    weights = torch.matmul(query, key.transpose(2, 3)) * scaling
    if softcap is not None:
        weights = torch.tanh(weights / softcap) * softcap
    if position_bias is not None:
        weights = weights + position_bias
    if attention_mask is not None:
        weights = weights + attention_mask[:, :, :, : key.shape[-2]]
    weights = torch.softmax(weights, dim=-1)
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights


def _rope64(rotary: Any, frequencies: np.ndarray, factor: float | None = None) -> Any:
    """A forward for a rotary embedding module that keeps its angles in float64, with
    these frequencies (transformers builds them in float32: the family recomputes them,
    e.g. base^(−2i/d), in float64) and this factor on cos and sin (None: the module's
    own ``attention_scaling``)."""
    import torch

    inv_freq = torch.tensor(np.asarray(frequencies, dtype=np.float64))

    def forward(x: Any, position_ids: Any) -> tuple[Any, Any]:
        freqs = position_ids[..., None].double() * inv_freq.to(x.device)
        emb = torch.cat((freqs, freqs), dim=-1)
        scale = getattr(rotary, "attention_scaling", 1.0) if factor is None else factor
        return (emb.cos() * scale).to(x.dtype), (emb.sin() * scale).to(x.dtype)

    return forward


def _norm64(norm: Any, shift: float = 0.0) -> Any:
    """A forward for an RMS norm module that stays in the tensor's own dtype; the norm
    multiplies by ``shift`` + its weight (Gemma's norms: 1 + weight)."""
    import torch

    eps = norm.variance_epsilon if hasattr(norm, "variance_epsilon") else norm.eps

    def forward(x: Any) -> Any:
        weight = norm.weight + shift if shift else norm.weight
        return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

    return forward
