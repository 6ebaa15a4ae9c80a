"""The backward pass in an exported script (``to_script(..., backward=True)``): the
scenario's own loss over the output, then its gradient with respect to every input and
intermediate, as ``attnviz grad`` computes them.

The NumPy script does the backward pass by hand, a step of the chain rule per step of the
forward pass, last first (``maths/backward.py``, ``docs/maths.md#gradients``); the torch
script marks the inputs ``requires_grad``, keeps each intermediate's gradient
(``retain_grad``) and calls ``L.backward()``. After the forward pass's lines they print::

    loss
    [0.123]                     (the loss's value)
    dL/dQ head 1                (per query head: Q, K, V, Q_rot and K_rot where QK-norm
    [...]                        or RoPE turns them, scores, scaled, masked, weights, output)
    dL/dconcat
    dL/dfinal
    dL/dX                       (then X_kv, W_Q, ..., b_O, q_norm, k_norm as the scenario
    dL/dW_Q head 1               has them; a stack one matrix per head, from 1)

The forward pass is the one ``codegen.py`` writes, with a few lines added (here, by
anchor) to keep what the backward pass reads again; a script without it is unchanged.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import TYPE_CHECKING

from attnviz.core.maths.scenario import Scenario

if TYPE_CHECKING:
    from attnviz.core.io.codegen import _Uses


def torch_uses(s: Scenario, u: _Uses) -> _Uses:
    """Autograd gives a gradient to a tensor only: the torch script holds every bias and
    norm weight, even where they are 0 (or 1)."""
    if not s.settings.projections:
        return u
    return replace(u, qkv_bias=True, out_bias=True, norm_weights=u.qk_norm)


def inputs(s: Scenario) -> list[str]:
    """The inputs attnviz gives a gradient (``Gradients.inputs``), in its order."""
    names = ["X", "X_kv"] if s.cross else ["X"]
    if s.settings.projections:
        names += ["W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O"]
        if s.settings.qk_norm != "none":
            names += ["q_norm", "k_norm"]
    if s.settings.positional == "relative-bias":
        names.append("relative_bias")
    return names


def _edit(
    lines: list[str],
    anchor: str,
    before: tuple[str, ...] = (),
    after: tuple[str, ...] = (),
    instead: tuple[str, ...] | None = None,
) -> list[str]:
    """lines with new lines before and after each line that starts with anchor (or in its
    place)."""
    out: list[str] = []
    found = False
    for line in lines:
        if line.startswith(anchor):
            found = True
            out += [*before, *((line,) if instead is None else instead), *after]
        else:
            out.append(line)
    if not found:
        raise AssertionError(f"codegen: no line {anchor!r}")  # the forward's lines changed
    return out


def forward_edits(text: list[str], u: _Uses, flavor: str) -> list[str]:
    """The forward pass's lines, keeping what the backward pass needs: for NumPy Q, K, V,
    the softmax P and the weights (and the soft-capped scores); for torch each
    intermediate, by name."""
    lines = "\n".join(text).split("\n")
    lines = _edit(lines, "head_outputs = []", instead=("head_outputs, saved = [], []",))
    lines = _edit(
        lines,
        "# Position information:",
        before=("X_given = X  # X as given, before any position encoding: the loss reads it", ""),
    )
    if flavor == "torch":
        return _torch_edits(lines, u)
    lines = _edit(
        lines,
        '    if MASK == "drop-after-softmax":',
        before=("    P = weights  # the softmax itself, before any weight is dropped",),
    )
    keep = '"Q": Q, "K": K, "V": V, "P": P, "weights": weights'
    if u.qk_norm and not u.whole_norm:
        lines = _edit(lines, "    # QK-norm: each row", before=("    Q_in, K_in = Q, K",))
        keep += ', "Q_in": Q_in, "K_in": K_in'
    if u.softcap:
        lines = _edit(lines, "    S = SOFTCAP * ", after=("    capped = S",))
        keep += ', "capped": capped'
    return _edit(
        lines,
        "    head_outputs.append(weights @ V)",
        after=(f"    saved.append({{{keep}}})  # what the backward pass reads again",),
    )


def _torch_edits(lines: list[str], u: _Uses) -> list[str]:
    one_head = (
        ("Q, K, V = X, X_kv, X_kv", "X.clone(), X_kv.clone(), X_kv.clone()")
        if u.cross
        else ("Q = K = V = X", "X.clone(), X.clone(), X.clone()")
    )
    lines = _edit(
        lines,
        f"        {one_head[0]}  #",
        instead=(f"        Q, K, V = {one_head[1]}  # one head; copies: a gradient each",),
    )
    lines = _edit(
        lines,
        "    d_k = Q.shape[1]",
        after=('    got = {"Q": Q, "K": K, "V": V}  # the intermediates whose gradients print',),
    )
    turned = ("    got.update(Q_rot=Q, K_rot=K)  # after QK-norm and RoPE",)
    lines = _edit(
        lines,
        "    S = Q @ K.T",
        before=turned if u.rope_dims or u.qk_norm else (),
        after=('    got["scores"] = S',),
    )
    lines = _edit(lines, "    if MASK in (", before=('    got["scaled"] = S',))
    lines = _edit(lines, "        S = S.masked_fill(future, 0.0)", after=('    got["masked"] = S',))
    lines = _edit(
        lines, '    print(f"head {h + 1} weights")', before=('    got["weights"] = weights',)
    )
    return _edit(
        lines,
        "    head_outputs.append(weights @ V)",
        instead=(
            '    got["output"] = weights @ V',
            '    head_outputs.append(got["output"])',
            "    saved.append(got)",
        ),
    )


_SHOW = '''

def show(title, A):
    """Print a title, then the matrix A one row at a time."""
    print(title)
    for row in A:
        print(row.tolist())

'''


def _loss_lines(s: Scenario, flavor: str) -> list[str]:
    """The scenario's own loss L over the output; for NumPy also dL/doutput (d_final)."""
    st = s.settings
    np_ = flavor != "torch"
    if st.loss == "cell":
        i, j = st.loss_cell
        out = [
            f"LOSS_CELL = ({i}, {j})  # a row and a column of the output, from 0",
            "L = output[LOSS_CELL]  # the loss is one output number: what moves it?",
        ]
        if np_:
            out += ["d_final = np.zeros_like(output)", "d_final[LOSS_CELL] = 1.0"]
        return out
    if st.loss == "next-token":
        return _next_token_lines(np_)
    x0 = "X_given" if np_ else "X0"
    out = [] if np_ else ["X0 = X_given.detach()  # the target is a constant: no gradient"]
    out += [
        "# Half the squared distance from the output to a target T of its shape. T:",
        '# "previous-token" (row i is row i - 1 of X, row 0 its own), "copy-self" (X) or',
        '# "first-token" (every row is X\'s first).',
        f"LOSS_TARGET = {json.dumps(st.loss_target)}",
        'if LOSS_TARGET == "previous-token":',
        "    T = "
        + (
            f"np.concatenate([{x0}[:1], {x0}[:-1]])" if np_ else f"torch.cat([{x0}[:1], {x0}[:-1]])"
        ),
        'elif LOSS_TARGET == "copy-self":',
        f"    T = {x0}",
        "else:",
        "    T = " + (f"np.repeat({x0}[:1], n, axis=0)" if np_ else f"{x0}[:1].repeat(n, 1)"),
        "L = 0.5 * " + ("np.sum((output - T) ** 2)" if np_ else "((output - T) ** 2).sum()"),
    ]
    if np_:
        out.append("d_final = output - T  # dL/doutput")
    return out


def _next_token_lines(np_: bool) -> list[str]:
    out = [
        "# Next-token loss: the output times a tied unembedding E (each distinct token's",
        "# first row of X, as GPT-2 ties its embeddings) gives logits over the scenario's own",
        "# tokens; L is the mean cross-entropy against the next token, at every position but",
        "# the last. E is X, so X gets gradient through it as well.",
        "words = list(dict.fromkeys(tokens))  # the distinct tokens, in order",
        "rows = [tokens.index(w) for w in words]",
        "E = X_given[rows]",
        "answer = [words.index(t) for t in tokens[1:]]",
        "logits = output[:-1] @ E.T",
    ]
    if not np_:
        return [*out, "L = -torch.log_softmax(logits, dim=1)[torch.arange(n - 1), answer].mean()"]
    return [
        *out,
        "shifted = logits - logits.max(axis=1, keepdims=True)",
        "log_p = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))",
        "L = -log_p[np.arange(n - 1), answer].mean()",
        "d_logits = np.exp(log_p)  # softmax minus the one-hot answer, over n - 1 positions",
        "d_logits[np.arange(n - 1), answer] -= 1.0",
        "d_logits /= n - 1",
        "d_final = np.zeros_like(output)",
        "d_final[:-1] = d_logits @ E",
        "d_X_given = np.zeros_like(X_given)  # through the unembedding",
        "d_X_given[rows] = d_logits.T @ output[:-1]",
    ]


def backward_lines(s: Scenario, u: _Uses, flavor: str) -> list[str]:
    """After the forward pass: the loss, the backward pass and the gradients printed."""
    out = [
        "",
        "# The loss -------------------------------------------------------------------",
        "",
        *_loss_lines(s, flavor),
        'print("loss")',
        "print([L.item()])" if flavor == "torch" else "print([float(L)])",
        *_SHOW.split("\n"),
    ]
    if flavor == "torch":
        return out + _torch_lines(s)
    return out + _numpy_lines(s, u)


def _torch_lines(s: Scenario) -> list[str]:
    return [
        "# The backward pass: autograd ------------------------------------------------",
        "",
        "for got in saved:",
        "    for A in got.values():",
        "        A.retain_grad()  # keep an intermediate's gradient too, not only the inputs'",
        "concat.retain_grad()",
        "output.retain_grad()",
        "L.backward()",
        "",
        "for h, got in enumerate(saved):",
        "    for name, A in got.items():",
        '        show(f"dL/d{name} head {h + 1}", A.grad)',
        'show("dL/dconcat", concat.grad)',
        'show("dL/dfinal", output.grad)',
        "for name, A in gradients_of.items():",
        "    if A.grad is None:  # not used (PROJECTIONS changed to False)",
        "        continue",
        "    if A.dim() == 3:  # a stack: one matrix per head",
        "        for h, one in enumerate(A.grad):",
        '            show(f"dL/d{name} head {h + 1}", one)',
        "    else:",
        '        show(f"dL/d{name}", A.grad)',
    ]


def torch_leaves(s: Scenario) -> list[str]:
    """Before the torch forward pass: the inputs autograd follows."""
    return [
        "# Autograd follows every input, so that L.backward() gives each its gradient.",
        "gradients_of = {",
        *(f'    "{name}": {name},' for name in inputs(s)),
        "}",
        "for A in gradients_of.values():",
        "    A.requires_grad_()",
        "",
    ]


def _qk_norm_lines(u: _Uses, kv: str) -> list[str]:
    """Back through QK-norm: A / r (times the norm's weights), r = sqrt(mean(A^2) + eps)."""
    out = [
        "    # QK-norm: A / r times the weights w, r = sqrt(mean(A^2) + eps) row by row, so",
        "    # dA = d / r - A mean(d A) / r^3 for d the gradient of A / r",
        '    Q_in, K_in = saved[h]["Q_in"], saved[h]["K_in"]',
        "    r_Q = np.sqrt(np.mean(Q_in**2, axis=1, keepdims=True) + QK_NORM_EPS)",
        "    r_K = np.sqrt(np.mean(K_in**2, axis=1, keepdims=True) + QK_NORM_EPS)",
        "    if PROJECTIONS:",
        "        d_q_norm[h] += (d_Q * Q_in / r_Q).sum(axis=0, keepdims=True)",
        f"        d_k_norm[{kv}] += (d_K * K_in / r_K).sum(axis=0, keepdims=True)",
    ]
    if u.norm_weights:
        out.append(f"        d_Q, d_K = d_Q * q_norm[h], d_K * k_norm[{kv}]")
    return [
        *out,
        "    d_Q = d_Q / r_Q - Q_in * np.mean(d_Q * Q_in, axis=1, keepdims=True) / r_Q**3",
        "    d_K = d_K / r_K - K_in * np.mean(d_K * K_in, axis=1, keepdims=True) / r_K**3",
    ]


def _whole_norm_back_lines(u: _Uses, kv: str) -> list[str]:
    """Back through QK-norm over the whole projection, which couples the heads: the head
    loop stops after RoPE, all heads go through the norm at once, and a second loop over
    the heads goes on to the projections (its lines follow these)."""
    weights = (
        ["    d_Qn, d_Kn = d_Qn * np.stack(q_norm), d_Kn * np.stack([k_norm[g] for g in kv_of])"]
        if u.norm_weights
        else []
    )
    return [
        "    pending.append((d_Q, d_K, d_V, d_Q_rot, d_K_rot, d_scores, d_scaled, d_masked,",
        "                    d_weights, d_output))",
        "",
        "# QK-norm over the whole projection: A_h / r times w_h, r = sqrt(mean of every head's",
        "# A^2 + eps) per token, so dA_h = u_h / r - A_h (sum over heads of u A) / (H d_k) / r^3",
        "# for u = w d, d the gradient of the normalised A (K: each query head's copy)",
        "Q_in, K_in = np.stack(Q_all), np.stack(K_all)",
        "r_Q, r_K = Q_RMS[None, :, None], K_RMS[None, :, None]",
        "d_Qn = np.stack([p[0] for p in pending])",
        "d_Kn = np.stack([p[1] for p in pending])",
        "kv_of = [h * len(W_K) // n_heads for h in range(n_heads)] if PROJECTIONS else [0]",
        "if PROJECTIONS:",
        "    for h in range(n_heads):",
        "        d_q_norm[h] += (d_Qn[h] * Q_in[h] / r_Q[0]).sum(axis=0, keepdims=True)",
        "        d_k_norm[kv_of[h]] += (d_Kn[h] * K_in[h] / r_K[0]).sum(axis=0, keepdims=True)",
        *("    " + line.strip() for line in weights),
        "m_Q = (d_Qn * Q_in).sum(axis=(0, 2), keepdims=True) / Q_in.shape[2]",
        "m_K = (d_Kn * K_in).sum(axis=(0, 2), keepdims=True) / K_in.shape[2]",
        "d_Q_all = d_Qn / r_Q - Q_in * m_Q / len(Q_in) / r_Q**3",
        "d_K_all = d_Kn / r_K - K_in * m_K / len(K_in) / r_K**3",
        "",
        "for h in range(n_heads):",
        "    (d_Q, d_K, d_V, d_Q_rot, d_K_rot, d_scores, d_scaled, d_masked, d_weights,",
        "     d_output) = pending[h]",
        "    d_Q, d_K = d_Q_all[h], d_K_all[h]",
        *([f"    {kv} = h * len(W_K) // len(W_Q)"] if kv == "g" else []),
    ]


def _numpy_lines(s: Scenario, u: _Uses) -> list[str]:
    kv = "g" if u.grouped else "h"
    X_kv = "X_kv" if u.cross else "X"
    d_X_kv = "d_X_kv" if u.cross else "d_X"
    start = "d_X_given.copy()" if s.settings.loss == "next-token" else "np.zeros_like(X)"
    out = [
        "# The backward pass, by hand -------------------------------------------------",
        "# The chain rule through each step of the forward pass, the last step first; d_A",
        "# is dL/dA, the shape of A.",
        "",
        "if PROJECTIONS:  # output = mixed W_O + b_O",
        "    d_W_O = mixed.T @ d_final",
        "    d_b_O = d_final.sum(axis=0, keepdims=True)",
        "    d_concat = d_final @ W_O.T",
        "    for h in ABLATED:",
        "        d_concat[:, (h - 1) * d_k : h * d_k] = 0.0  # an ablated head reaches nothing",
        "    d_W_Q, d_W_K, d_W_V = np.zeros_like(W_Q), np.zeros_like(W_K), np.zeros_like(W_V)",
        "    d_b_Q = np.zeros((len(W_Q), 1, W_Q.shape[2]))",
        "    d_b_K = np.zeros((len(W_K), 1, W_K.shape[2]))",
        "    d_b_V = np.zeros((len(W_V), 1, W_V.shape[2]))",
        *(
            [
                "    d_q_norm = np.zeros((len(W_Q), 1, W_Q.shape[2]))",
                "    d_k_norm = np.zeros((len(W_K), 1, W_K.shape[2]))",
            ]
            if u.qk_norm
            else []
        ),
        "else:",
        "    d_concat = d_final",
        f"d_X = {start}  # the sinusoidal encoding is a constant: X's gradient is X + PE's",
        *(["d_X_kv = np.zeros_like(X_kv)"] if u.cross else []),
        *(["d_relative_bias = np.zeros_like(relative_bias)"] if u.relative else []),
        "",
        *(
            ["pending = []  # each head's gradients, until the norm couples the heads"]
            if u.whole_norm
            else []
        ),
        "for h in range(n_heads):",
        '    Q, K, V, P, weights = (saved[h][name] for name in ("Q", "K", "V", "P", "weights"))',
        "    d_k = Q.shape[1]",
        *(
            ["    g = h * len(W_K) // len(W_Q)  # a group's query heads add up"]
            if u.grouped
            else []
        ),
        "    d_output = d_concat[:, h * d_k : (h + 1) * d_k]",
        "    d_weights = d_output @ V.T  # head output = weights V",
        "    d_V = weights.T @ d_output",
        "    d_P = d_weights  # weights = P, then the wrong mask's zeros, then dropout",
        '    if MASK == "drop-after-softmax":',
        "        d_P = np.where(future, 0.0, d_P)",
        "    if keep is not None:",
        "        d_P = d_P * keep[h] / (1 - DROPOUT)",
        "    # softmax: dS_ij = P_ij (dP_ij - sum_k dP_ik P_ik) (a sink changes P, not the rule)",
        "    d_masked = P * (d_P - (d_P * P).sum(axis=1, keepdims=True))",
        "    d_scaled = d_masked  # the mask wrote a constant (-inf, or 0) on the hidden keys:",
        '    if MASK not in ("none", "drop-after-softmax"):  # no gradient reaches their scores',
        "        d_scaled = np.where(future, 0.0, d_masked)",
        "    d_scores = d_scaled"
        + ("  # ALiBi subtracts a constant: the gradient passes unchanged" if u.alibi else ""),
    ]
    if u.relative:
        out += [
            "    # T5's bias: each score adds its bucket's entry, so the entry's gradient is the",
            "    # sum of d_scaled over the scores of that bucket",
            "    np.add.at(d_relative_bias[:, h], BUCKET, d_scaled)",
        ]
    if u.softcap:
        out.append('    d_scores = d_scores * (1 - (saved[h]["capped"] / SOFTCAP) ** 2)  # tanh\'')
    out += [
        "    if SCALE:",
        "        d_scores = d_scores * SCALE_VALUE"
        if u.scale_value
        else "        d_scores = d_scores / np.sqrt(d_k)",
        "    d_Q, d_K = d_scores @ K, d_scores.T @ Q  # scores = Q K^T",
    ]
    if u.rope_dims or u.qk_norm:
        out.append("    d_Q_rot, d_K_rot = d_Q, d_K")
    if u.rope_dims:
        out += [
            '    if POSITIONAL == "rope":  # a turn by an angle is undone by the opposite angle',
            "        d_Q, d_K = rope(d_Q_rot, -q_pos), rope(d_K_rot, -k_pos)",
        ]
    if u.whole_norm:
        out += _whole_norm_back_lines(u, kv)
    elif u.qk_norm:
        out += _qk_norm_lines(u, kv)
    out += ["    if PROJECTIONS:  # Q = X W_Q[h] + b_Q[h], K and V likewise"]
    out += [
        "        d_W_Q[h] += X.T @ d_Q",
        "        d_b_Q[h] += d_Q.sum(axis=0, keepdims=True)",
        "        d_X += d_Q @ W_Q[h].T",
        f"        d_W_K[{kv}] += {X_kv}.T @ d_K",
        f"        d_b_K[{kv}] += d_K.sum(axis=0, keepdims=True)",
        f"        {d_X_kv} += d_K @ W_K[{kv}].T",
        f"        d_W_V[{kv}] += {X_kv}.T @ d_V",
        f"        d_b_V[{kv}] += d_V.sum(axis=0, keepdims=True)",
        f"        {d_X_kv} += d_V @ W_V[{kv}].T",
        "    else:  # Q = X, K = V = X_kv" if u.cross else "    else:  # Q = K = V = X",
        "        d_X += d_Q",
        f"        {d_X_kv} += d_K + d_V",
        '    got = {"Q": d_Q, "K": d_K, "V": d_V,'
        + (' "Q_rot": d_Q_rot, "K_rot": d_K_rot,' if u.rope_dims or u.qk_norm else ""),
        '           "scores": d_scores, "scaled": d_scaled, "masked": d_masked,',
        '           "weights": d_weights, "output": d_output}',
        "    for name, A in got.items():",
        '        show(f"dL/d{name} head {h + 1}", A)',
        'show("dL/dconcat", d_concat)',
        'show("dL/dfinal", d_final)',
    ]
    weights = ["W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O"]
    weights += ["q_norm", "k_norm"] if u.qk_norm else []
    given = ", ".join(f'"{x}": d_{x}' for x in ("X", "X_kv")[: 1 + s.cross])
    return [
        *out,
        f"d_inputs = {{{given}}}",
        "if PROJECTIONS:",
        "    d_inputs.update(",
        *(f"        {name}=d_{name}," for name in weights),
        "    )",
        *(['d_inputs["relative_bias"] = d_relative_bias'] if u.relative else []),
        "for name, A in d_inputs.items():",
        "    if A.ndim == 3:  # a stack: one matrix per head",
        "        for h, one in enumerate(A):",
        '            show(f"dL/d{name} head {h + 1}", one)',
        "    else:",
        '        show(f"dL/d{name}", A)',
    ]
