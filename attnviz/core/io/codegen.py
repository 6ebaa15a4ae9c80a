"""Export a scenario as a standalone NumPy or PyTorch script that reproduces its numbers.

``to_script(scenario, "numpy" | "torch", source=...)`` returns the text of a Python script
that needs only NumPy (or PyTorch, plus NumPy for the seeded dropout draw) and never
imports attnviz. It embeds the scenario's tokens, matrices (``repr`` of every float, so
they round-trip bit for bit) and settings as plain constants, then computes attention the
way ``attnviz.core.maths.engine.compute`` does, in float64, with the brief's symbols
(``Q``, ``K``, ``V``, ``S``). A learner can change any number or setting and run it again.

The script's output, line by line::

    # tokens: ['she', 'saw', 'the', 'cat']
    head 1 weights
    [1.0, 0.0, 0.0, 0.0]
    ...                        (n rows of n numbers: query i against key j)
    head 2 weights
    ...
    output
    [0.0123, -0.456, ...]      (n rows of d_model numbers: the final output)

- A line starting with ``#`` is a comment for the reader (the token labels).
- A line starting with ``[`` is one matrix row: a JSON array of numbers (each written by
  Python's float ``repr``, so it reads back exactly) that belongs to the last title.
- Any other line is a title: ``head <h> weights`` (h from 1, one per head; one head when
  projections are off) and, last, ``output``.

The script text is pure ASCII (non-ASCII token labels appear as ``\\u`` escapes), so it
runs whatever encoding it is saved or printed in.
"""

from __future__ import annotations

import json

import numpy as np

from attnviz import __version__
from attnviz.core.maths.scenario import MASKS, Scenario

FLAVORS = ("numpy", "torch")
WIDTH = 88  # wrap long matrix rows so that the script stays readable

_NUMPY_HEAD = """\
import numpy as np
"""

_TORCH_HEAD = """\
import math

import numpy as np  # only to draw the dropout mask exactly as attnviz draws it
import torch

torch.set_default_dtype(torch.float64)  # float64 throughout, like attnviz's reference
"""

_NUMPY_BODY = """\
n, d_model = X.shape

# Position information: sinusoidal encodings added to X.
if POSITIONAL == "sinusoidal":
    pos = np.arange(n)[:, None]
    pair = np.arange(d_model) // 2  # columns 2i and 2i+1 share one angle
    angle = pos / np.power(10000.0, 2 * pair / d_model)
    PE = np.where(np.arange(d_model) % 2 == 0, np.sin(angle), np.cos(angle))
    X = X + PE

n_heads = len(W_Q) if PROJECTIONS else 1
future = np.triu(np.ones((n, n), dtype=bool), k=1)  # future[i, j]: key j after query i
if MASK == "sliding-window":  # also hidden: keys WINDOW or more places back
    future |= np.tril(np.ones((n, n), dtype=bool), k=-WINDOW)

# Dropout: one seeded draw for all heads, the same one attnviz makes.
keep = None
if DROPOUT > 0:
    keep = np.random.default_rng(DROPOUT_SEED).random((n_heads, n, n)) >= DROPOUT

print("# tokens:", ascii(tokens))
head_outputs = []
for h in range(n_heads):
    if PROJECTIONS:
        Q, K, V = X @ W_Q[h], X @ W_K[h], X @ W_V[h]
    else:
        Q = K = V = X  # simple self-attention: one head, no projections
    d_k = Q.shape[1]

    S = Q @ K.T  # S[i, j]: query i against key j
    if SCALE:
        S = S / np.sqrt(d_k)  # keeps the scores' variance near 1
    if MASK in ("causal", "sliding-window"):
        S = np.where(future, -np.inf, S)  # future keys get weight exactly 0
    elif MASK == "causal-zero":
        S = np.where(future, 0.0, S)  # wrong on purpose: e^0 = 1, so future keys leak

    # Softmax along the keys; subtracting the row maximum avoids overflow.
    E = np.exp(S - S.max(axis=1, keepdims=True))
    weights = E / E.sum(axis=1, keepdims=True)

    if MASK == "drop-after-softmax":
        weights = np.where(future, 0.0, weights)  # wrong on purpose: rows sum to < 1
    if keep is not None:
        weights = weights * keep[h] / (1 - DROPOUT)  # the kept weights are scaled up

    print(f"head {h + 1} weights")
    for row in weights:
        print(row.tolist())
    head_outputs.append(weights @ V)

# Concatenate the head outputs in head order, then mix them with W_O.
concat = np.concatenate(head_outputs, axis=1)
if PROJECTIONS:
    mixed = concat.copy()
    for h in ABLATED:
        mixed[:, (h - 1) * d_k : h * d_k] = 0.0  # this head contributes nothing
    output = mixed @ W_O
else:
    output = concat  # no projections: no W_O either

print("output")
for row in output:
    print(row.tolist())
"""

_TORCH_BODY = """\
n, d_model = X.shape

# Position information: sinusoidal encodings added to X.
if POSITIONAL == "sinusoidal":
    pos = torch.arange(n)[:, None]
    pair = torch.arange(d_model) // 2  # columns 2i and 2i+1 share one angle
    angle = pos / torch.pow(10000.0, 2 * pair / d_model)
    PE = torch.where(torch.arange(d_model) % 2 == 0, torch.sin(angle), torch.cos(angle))
    X = X + PE

n_heads = len(W_Q) if PROJECTIONS else 1
future = torch.ones(n, n, dtype=torch.bool).triu(1)  # future[i, j]: key j after query i
if MASK == "sliding-window":  # also hidden: keys WINDOW or more places back
    future |= torch.ones(n, n, dtype=torch.bool).tril(-WINDOW)

# Dropout: one seeded draw for all heads, the same one attnviz makes (with NumPy).
keep = None
if DROPOUT > 0:
    draw = np.random.default_rng(DROPOUT_SEED).random((n_heads, n, n))
    keep = torch.from_numpy(draw >= DROPOUT)

print("# tokens:", ascii(tokens))
head_outputs = []
for h in range(n_heads):
    if PROJECTIONS:
        Q, K, V = X @ W_Q[h], X @ W_K[h], X @ W_V[h]
    else:
        Q = K = V = X  # simple self-attention: one head, no projections
    d_k = Q.shape[1]

    S = Q @ K.T  # S[i, j]: query i against key j
    if SCALE:
        S = S / math.sqrt(d_k)  # keeps the scores' variance near 1
    if MASK in ("causal", "sliding-window"):
        S = S.masked_fill(future, -math.inf)  # future keys get weight exactly 0
    elif MASK == "causal-zero":
        S = S.masked_fill(future, 0.0)  # wrong on purpose: e^0 = 1, so future keys leak

    # Softmax along the keys (what torch.softmax(S, dim=1) does): subtracting the row
    # maximum avoids overflow.
    E = torch.exp(S - S.amax(dim=1, keepdim=True))
    weights = E / E.sum(dim=1, keepdim=True)

    if MASK == "drop-after-softmax":
        weights = weights.masked_fill(future, 0.0)  # wrong on purpose: rows sum to < 1
    if keep is not None:
        weights = weights * keep[h] / (1 - DROPOUT)  # the kept weights are scaled up

    print(f"head {h + 1} weights")
    for row in weights:
        print(row.tolist())
    head_outputs.append(weights @ V)

# Concatenate the head outputs in head order, then mix them with W_O.
concat = torch.cat(head_outputs, dim=1)
if PROJECTIONS:
    mixed = concat.clone()
    for h in ABLATED:
        mixed[:, (h - 1) * d_k : h * d_k] = 0.0  # this head contributes nothing
    output = mixed @ W_O
else:
    output = concat  # no projections: no W_O either

print("output")
for row in output:
    print(row.tolist())
"""


def _row(values: list[float], indent: str) -> str:
    """One matrix row as a list literal, wrapped over several lines when it is long."""
    numbers = [repr(v) for v in values]
    line = f"{indent}[{', '.join(numbers)}],"
    if len(line) <= WIDTH:
        return line
    lines, current = [], ""
    for number in numbers:
        if current and len(indent) + 4 + len(current) + len(number) + 1 > WIDTH:
            lines.append(current.rstrip())
            current = ""
        current += f"{number}, "
    lines.append(current.rstrip())
    inner = "".join(f"{indent}    {text}\n" for text in lines)
    return f"{indent}[\n{inner}{indent}],"


def _matrix(a: np.ndarray, indent: str = "    ") -> str:
    """A 2-D array as a nested list literal, one row per line."""
    rows = "\n".join(_row(r, indent) for r in a.tolist())
    return f"[\n{rows}\n]"


def _per_head(a: np.ndarray) -> str:
    """A (heads, rows, cols) stack as a nested list literal, one commented block per head."""
    blocks = []
    for h, m in enumerate(a):
        rows = "\n".join(_row(r, "        ") for r in m.tolist())
        blocks.append(f"    [  # head {h + 1}\n{rows}\n    ],")
    return "[\n" + "\n".join(blocks) + "\n]"


def _describe(s: Scenario) -> str:
    """The scenario's shape and settings in a sentence or two (for the docstring)."""
    st = s.settings
    mask = {
        "none": "no mask",
        "causal": "causal mask (-inf before softmax)",
        "causal-zero": "causal mask done wrong (0 before softmax)",
        "drop-after-softmax": "causal mask done wrong (weights dropped after softmax)",
        "sliding-window": f"sliding window of {st.window} keys (-inf outside it)",
    }[st.mask]
    parts = [
        f"{s.n} tokens, d_model {s.d_model}, {s.n_heads} head{'s' * (s.n_heads != 1)} of d_k "
        f"{s.d_k}; projections {'on' if st.projections else 'off'}",
        "scaled by sqrt(d_k)" if st.scale else "not scaled",
        mask,
        "sinusoidal positions" if st.positional == "sinusoidal" else "no position encoding",
        f"dropout {st.dropout!r} (seed {st.dropout_seed})" if st.dropout > 0 else "no dropout",
    ]
    ablated = getattr(st, "ablated", ())
    if ablated:
        parts.append(
            f"head{'s' * (len(ablated) > 1)} {', '.join(str(h + 1) for h in ablated)} ablated"
        )
    return ", ".join(parts) + "."


def _header(s: Scenario, flavor: str, source: str | None) -> str:
    library = "NumPy" if flavor == "numpy" else "PyTorch (float64, CPU)"
    needs = "NumPy" if flavor == "numpy" else "PyTorch and NumPy"
    lines = [
        f'"""Attention over one attnviz scenario, step by step in {library}.',
        "",
        f"Exported by attnviz {__version__}. The scenario: {_describe(s)}",
        "",
        f"Standalone: it needs only {needs}, not attnviz. Run it with `python <this file>`.",
        "It prints each head's attention weights (rows: queries, columns: keys), then the",
        "final output (one row per token); each matrix row is a list of floats that reads",
        "back exactly. Change any number or setting below and run it again.",
        '"""',
    ]
    text = "\n".join(_wrap_docstring(lines)) + "\n"
    if source is not None:
        # ascii() escapes newlines and quotes, so no file name can end the comment.
        text += f"# Exported from: {source!a}\n"
    return text


def _wrap_docstring(lines: list[str]) -> list[str]:
    """Docstring lines wrapped at WIDTH (the scenario sentence can be long)."""
    out = []
    for line in lines:
        while len(line) > WIDTH and " " in line[:WIDTH]:
            cut = line.rfind(" ", 0, WIDTH)
            out.append(line[:cut])
            line = line[cut + 1 :]
        out.append(line)
    return out


def _data(s: Scenario, flavor: str) -> str:
    """The scenario's tokens, matrices and settings as Python constants."""

    def array(literal: str) -> str:
        if flavor == "numpy":
            return f"np.array({literal})"
        return f"torch.tensor({literal}, dtype=torch.float64)"

    st = s.settings
    ablated = tuple(h + 1 for h in getattr(st, "ablated", ()))
    return "\n".join(
        [
            "# The scenario ---------------------------------------------------------------",
            "",
            "tokens = " + ascii(list(s.tokens)),
            "",
            "# X: one row per token (n x d_model).",
            "X = " + array(_matrix(s.X)),
            "",
            "# W_Q, W_K, W_V: one d_model x d_k matrix per head.",
            "W_Q = " + array(_per_head(s.W_Q)),
            "W_K = " + array(_per_head(s.W_K)),
            "W_V = " + array(_per_head(s.W_V)),
            "",
            "# W_O: (heads * d_k) x d_model; rows [h * d_k, (h + 1) * d_k) mix head h + 1.",
            "W_O = " + array(_matrix(s.W_O)),
            "",
            "# The settings ---------------------------------------------------------------",
            "",
            f"PROJECTIONS = {st.projections!r}  # False: one head with Q = K = V = X, no W_O",
            f"SCALE = {st.scale!r}  # divide the scores by sqrt(d_k)",
            f"MASK = {json.dumps(st.mask)}  # {', '.join(MASKS)}",
            f"WINDOW = {int(st.window)!r}  # sliding-window: query i sees keys i - WINDOW < j <= i",
            f"POSITIONAL = {json.dumps(st.positional)}  # none or sinusoidal",
            f"DROPOUT = {float(st.dropout)!r}  # attention dropout probability (training only)",
            f"DROPOUT_SEED = {int(st.dropout_seed)!r}",
            f"ABLATED = {ablated!r}  # heads (from 1) left out of the W_O mix",
            "",
            "# The computation ------------------------------------------------------------",
            "",
        ]
    )


def to_script(s: Scenario, flavor: str = "numpy", *, source: str | None = None) -> str:
    """A standalone NumPy or PyTorch script that recomputes and prints the scenario's numbers.

    source (a file name or preset name) is recorded in the script's opening comment.
    """
    if flavor not in FLAVORS:
        raise ValueError(f"flavor: {flavor!r} is not one of {', '.join(FLAVORS)}")
    imports, body = (_NUMPY_HEAD, _NUMPY_BODY) if flavor == "numpy" else (_TORCH_HEAD, _TORCH_BODY)
    return "\n".join([_header(s, flavor, source), imports, _data(s, flavor), body])
