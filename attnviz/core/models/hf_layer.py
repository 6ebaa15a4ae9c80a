"""One attention layer of a Hugging Face transformers model, as an attnviz scenario.

``import_layer(model, input_ids, layer, tokens)`` runs the model once, takes the hidden
state that enters the layer's attention as X (the model's own, after any norm that
precedes attention), and the layer's weights in attnviz's row-vector convention
(``nn.Linear`` stores W transposed; GPT-2's ``Conv1D`` does not) with their biases. It
also returns the model's own attention weights for every layer and the attention output
for that layer, so that the scenario can be checked against the model itself.

Supported: GPT-2 (causal), the BERT family (BERT, RoBERTa, DistilBERT, and MiniLM, which
is a BERT; bidirectional), and Llama, Mistral, Qwen2 and Qwen3 (RoPE, key/value heads
shared by groups of query heads, Qwen2's biases, Mistral's sliding window, Qwen3's
QK-norm). Anything else is refused with a message naming it; nothing approximate is ever
returned as the model.

The model runs with a registered eager attention that keeps the softmax in the model's
own dtype (transformers' Llama code takes it, the rotary angles and the RMS norms in
float32 even in a float64 model); for the Llama family the angles (recomputed as
base^(−2i/d)) and the QK norms run in the model's dtype too. In float64 the model's
numbers are then exact to float64 rounding. torch and transformers are imported only
when a layer is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from attnviz.core.maths.scenario import Scenario, ScenarioError, Settings, from_heads, head_stack

LLAMA_FAMILY = ("llama", "mistral", "qwen2", "qwen3")
BERT_FAMILY = ("bert", "roberta", "distilbert")
SUPPORTED = ("gpt2", *BERT_FAMILY, *LLAMA_FAMILY)
EAGER64 = "attnviz_eager64"


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


def _attention_module(model: Any, model_type: str, layer: int) -> Any:
    if model_type in LLAMA_FAMILY:
        base = model.model if hasattr(model, "model") else model
        return base.layers[layer].self_attn
    if model_type == "gpt2":
        blocks = model.transformer.h if hasattr(model, "transformer") else model.h
        return blocks[layer].attn
    if model_type == "distilbert":
        body = model.transformer if hasattr(model, "transformer") else model.distilbert.transformer
        return body.layer[layer].attention
    encoder = model.encoder if hasattr(model, "encoder") else model.bert.encoder
    return encoder.layer[layer].attention


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
    config = model.config
    model_type = getattr(config, "model_type", "?")
    if model_type not in SUPPORTED:
        raise ScenarioError(
            f"model type {model_type!r}: not supported yet (supported: {', '.join(SUPPORTED)})"
        )
    layers = layer_count(config)
    if not 0 <= layer < layers:
        raise ScenarioError(f"layer {layer}: the model has layers 0 to {layers - 1}")
    if model_type in LLAMA_FAMILY:
        return _import_llama(model, input_ids, layer, tokens)
    heads = config.num_attention_heads
    module = _attention_module(model, model_type, layer)
    if model_type == "gpt2":
        inner, projection = module, module.c_proj
        linear = []
    elif model_type == "distilbert":
        inner, projection = module, module.out_lin
        linear = [module.q_lin, module.k_lin, module.v_lin]
    else:
        inner, projection = module.self, module.output.dense
        linear = [inner.query, inner.key, inner.value]
    X_t, attention_out, out = _run(model, input_ids, inner, projection)
    X = _numpy(X_t)
    if model_type == "gpt2":
        W = _numpy(module.c_attn.weight)  # Conv1D: (d_model, 3·d_model), rows are inputs
        b = _numpy(module.c_attn.bias)
        d_model = X.shape[1]
        parts = [
            _heads(W[:, k * d_model : (k + 1) * d_model], b[k * d_model : (k + 1) * d_model], heads)
            for k in range(3)
        ]
        W_O, b_O = _numpy(module.c_proj.weight), _numpy(module.c_proj.bias)
        mask = "causal"
    else:
        parts = [_heads(_numpy(p.weight).T, _numpy(p.bias), heads) for p in linear]
        W_O, b_O = _numpy(projection.weight).T, _numpy(projection.bias)
        mask = "none"
    (W_Q, b_Q), (W_K, b_K), (W_V, b_V) = parts
    heads_list = [
        {"W_Q": W_Q[h], "W_K": W_K[h], "W_V": W_V[h], "b_Q": b_Q[h], "b_K": b_K[h], "b_V": b_V[h]}
        for h in range(heads)
    ]
    scenario = from_heads(tokens, X, heads_list, W_O, Settings(mask=mask), b_O=b_O)
    return _imported(scenario, out, attention_out, model_type, layer)


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
    **_: Any,
) -> tuple[Any, Any]:
    """transformers' eager attention with the softmax in the tensors' own dtype."""
    import torch

    groups = query.shape[1] // key.shape[1]
    key = key.repeat_interleave(groups, dim=1)
    value = value.repeat_interleave(groups, dim=1)
    weights = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        weights = weights + attention_mask[:, :, :, : key.shape[-2]]
    weights = torch.softmax(weights, dim=-1)
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights


def _rope64(rotary: Any, base: float) -> Any:
    """A forward for a rotary embedding module that keeps its angles in float64."""
    import torch

    # transformers builds inv_freq in float32; recomputed here as base^(−2i/d) in float64
    dims = 2 * rotary.inv_freq.shape[0]
    inv_freq = torch.tensor(base ** (-np.arange(0, dims, 2, dtype=np.float64) / dims))

    def forward(x: Any, position_ids: Any) -> tuple[Any, Any]:
        freqs = position_ids[..., None].double() * inv_freq.to(x.device)
        emb = torch.cat((freqs, freqs), dim=-1)
        scale = getattr(rotary, "attention_scaling", 1.0)
        return (emb.cos() * scale).to(x.dtype), (emb.sin() * scale).to(x.dtype)

    return forward


def _norm64(norm: Any) -> Any:
    """A forward for an RMS norm module that stays in the tensor's own dtype."""
    import torch

    def forward(x: Any) -> Any:
        return norm.weight * (
            x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
        )

    return forward


def _import_llama(model: Any, input_ids: Any, layer: int, tokens: tuple[str, ...]) -> ImportedLayer:
    config = model.config
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    rope_type = rope.get("rope_type", "default")
    if rope_type != "default":
        raise ScenarioError(f"RoPE scaling {rope_type!r}: not supported yet")
    theta = float(rope.get("rope_theta", getattr(config, "rope_theta", 10000.0)))
    heads, kv = config.num_attention_heads, config.num_key_value_heads
    module = _attention_module(model, config.model_type, layer)
    base = model.model if hasattr(model, "model") else model
    norms = [getattr(module, n) for n in ("q_norm", "k_norm") if hasattr(module, n)]
    norm_forwards = [n.forward for n in norms]
    rotary_forward = base.rotary_emb.forward
    try:
        base.rotary_emb.forward = _rope64(base.rotary_emb, theta)
        for norm in norms:
            norm.forward = _norm64(norm)
        X_t, attention_out, out = _run(model, input_ids, module, module.o_proj)
    finally:
        base.rotary_emb.forward = rotary_forward
        for norm, forward in zip(norms, norm_forwards, strict=True):
            norm.forward = forward
    X = _numpy(X_t)

    def part(linear: Any, count: int) -> tuple[np.ndarray, np.ndarray]:
        bias = None if linear.bias is None else _numpy(linear.bias)
        return _heads(_numpy(linear.weight).T, bias, count)

    W_Q, b_Q = part(module.q_proj, heads)
    W_K, b_K = part(module.k_proj, kv)
    W_V, b_V = part(module.v_proj, kv)
    o = module.o_proj
    b_O = np.zeros((1, X.shape[1])) if o.bias is None else _numpy(o.bias)[None]
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None)  # Qwen2/3 window only some layers
    if types is not None and layer < len(types):
        window = window if types[layer] == "sliding_attention" else None
    mask = {"mask": "sliding-window", "window": int(window)} if window else {"mask": "causal"}
    qk: dict[str, Any] = {}
    if norms:  # Qwen3: one weight per feature of d_k, shared by every head
        d = W_Q.shape[2]
        qk = {
            "q_norm": np.tile(_numpy(module.q_norm.weight).reshape(1, 1, d), (heads, 1, 1)),
            "k_norm": np.tile(_numpy(module.k_norm.weight).reshape(1, 1, d), (kv, 1, 1)),
        }
        mask = {**mask, "qk_norm": "rms", "qk_norm_eps": float(module.q_norm.variance_epsilon)}
    settings = Settings(positional="rope", rope_base=theta, **mask)
    scenario = Scenario(
        tokens=tokens,
        X=X,
        W_Q=head_stack("W_Q", W_Q),
        W_K=head_stack("W_K", W_K),
        W_V=head_stack("W_V", W_V),
        W_O=_numpy(o.weight).T,
        settings=settings,
        b_Q=head_stack("b_Q", b_Q),
        b_K=head_stack("b_K", b_K),
        b_V=head_stack("b_V", b_V),
        b_O=b_O,
        **qk,
    )
    return _imported(scenario, out, attention_out, config.model_type, layer)
