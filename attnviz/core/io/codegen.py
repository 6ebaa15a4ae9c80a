"""Export a scenario as a standalone NumPy or PyTorch script that reproduces its numbers.

``to_script(scenario, "numpy" | "torch", source=...)`` returns the text of a Python script
that needs only NumPy (or PyTorch, plus NumPy for the seeded dropout draw) and never
imports attnviz. It embeds the scenario's tokens, matrices (``repr`` of every float, so
they round-trip bit for bit) and settings as plain constants, then computes attention the
way ``attnviz.core.maths.forward.compute`` does, in float64, with the brief's symbols
(``Q``, ``K``, ``V``, ``S``). A learner can change any number or setting and run it again.

What current models add (shared key/value heads, biases, cross-attention, QK-norm, RoPE,
ALiBi, a given scale, soft-capping, sinks, a custom mask) appears as a few explicit lines
each, and only in the script of a scenario that uses it: the script of a plain scenario
holds the textbook steps alone. The torch script spells every step out as well (no
``F.scaled_dot_product_attention``), since it prints the weights, which that never returns.

The script's output, line by line::

    # tokens: ['she', 'saw', 'the', 'cat']
    head 1 weights
    [1.0, 0.0, 0.0, 0.0]
    ...                        (n rows of m numbers: query i against key j)
    head 2 weights
    ...
    output
    [0.0123, -0.456, ...]      (n rows of d_model numbers: the final output)

- A line starting with ``#`` is a comment for the reader (the token labels, and the key
  tokens' labels under cross-attention).
- A line starting with ``[`` is one matrix row: a JSON array of numbers (each written by
  Python's float ``repr``, so it reads back exactly) that belongs to the last title.
- Any other line is a title: ``head <h> weights`` (h from 1, one per query head; one head
  when projections are off) and, last, ``output``.

The "tiled" flavor is the NumPy script with each head computed as FlashAttention-2 does:
query blocks against key blocks, a running maximum and denominator per row, the output
rescaled, tiles the mask hides skipped, and the weights printed rebuilt from the rows'
log-sum-exp (the masks and dropout a kernel does not do are refused).

With ``backward=True`` the NumPy and torch scripts go on to the scenario's own loss and
its backward pass (by hand, or by autograd), printing every gradient that ``attnviz grad``
gives (``codegen_backward.py``).

The script text is pure ASCII (non-ASCII token labels appear as ``\\u`` escapes), so it
runs whatever encoding it is saved or printed in.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from attnviz import __version__
from attnviz.core.io import codegen_backward as grad
from attnviz.core.maths.head_stack import HeadStack
from attnviz.core.maths.scenario import MASKS, MINUS_INF_MASKS, Scenario, ScenarioError
from attnviz.core.maths.tiling import check_supported
from attnviz.core.maths.variants import visible

FLAVORS = ("numpy", "torch", "tiled")  # tiled: NumPy, FlashAttention-2's forward pass
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


@dataclass(frozen=True)
class _Uses:
    """Which optional parts of attention a scenario uses: its script holds those lines only."""

    cross: bool  # keys and values from X_kv (m tokens)
    grouped: bool  # fewer key/value heads than query heads (GQA, MQA)
    qkv_bias: bool  # b_Q, b_K or b_V not all 0
    out_bias: bool  # b_O not all 0
    qk_norm: bool
    whole_norm: bool  # QK-norm over every head's features of a token ("rms-whole")
    norm_weights: bool  # q_norm or k_norm not all 1
    rope_dims: int  # how many features RoPE turns (0: no RoPE, or nothing to pair)
    alibi: bool
    relative: bool  # T5's relative position bias (a table of buckets x heads)
    scale_value: bool
    softcap: bool
    sinks: bool
    custom: bool  # the custom mask (MASK_MATRIX)
    empty_rows: bool  # a query may have every key hidden: softmax must not give NaN

    @property
    def positions(self) -> bool:
        return self.rope_dims > 0 or self.alibi or self.relative


def _uses(s: Scenario) -> _Uses:
    st = s.settings
    width = s.d_k if st.projections else s.d_model  # what Q and K are wide
    even = width - width % 2
    rope_dims = min(st.rope_dims or even, even) if st.positional == "rope" else 0
    empty_rows = False
    if st.mask in MINUS_INF_MASKS and st.sinks is None:
        seen = visible(s.n, s.m, st.mask, st.window, st.causal_alignment, s.mask_matrix)
        # a custom mask is the user's to edit in the script: always guard it
        empty_rows = st.mask == "custom" or not seen.any(axis=1).all()
    return _Uses(
        cross=s.cross,
        grouped=s.kv_heads != s.n_heads,
        qkv_bias=any(getattr(s, name).any() for name in ("b_Q", "b_K", "b_V")),
        out_bias=bool(s.b_O.any()),
        qk_norm=st.qk_norm != "none",
        whole_norm=st.qk_norm == "rms-whole",
        norm_weights=st.qk_norm != "none"
        and not bool((s.q_norm == 1).all() and (s.k_norm == 1).all()),
        rope_dims=rope_dims,
        alibi=st.positional == "alibi",
        relative=st.positional == "relative-bias",
        scale_value=st.scale_value is not None,
        softcap=st.softcap is not None,
        sinks=st.sinks is not None,
        custom=st.mask == "custom",
        empty_rows=empty_rows,
    )


Pick = Callable[[str, str], str]  # (numpy text, torch text) -> the script's flavor's


def _lines(s: Scenario, flavor: str, u: _Uses) -> list[str]:
    """The computation, as the script's lines: the textbook steps, and each optional part
    only where the scenario uses it."""

    def pick(numpy_text: str, torch_text: str) -> str:
        return numpy_text if flavor != "torch" else torch_text

    heads = _tiled_head_lines(u, pick) if flavor == "tiled" else _head_lines(u, pick)
    return _setup_lines(s, u, pick) + heads + _mix_lines(u, pick)


def _tiled_head_lines(u: _Uses, pick: Pick) -> list[str]:
    """The head loop as FlashAttention-2 runs it: tiles of scores, the running maximum and
    denominator, the output rescaled; the weights rebuilt from the log-sum-exp at the end."""
    body = [
        line.replace("S = Q @ K.T  # S[i, j]: query i against key j", "S = Q[rows] @ K[cols].T")
        .replace("q_pos[:, None] - k_pos[None, :]", "q_pos[rows][:, None] - k_pos[cols][None, :]")
        .replace("np.where(future,", "np.where(future[rows, cols],")
        .replace("[BUCKET, h]", "[BUCKET[rows, cols], h]")
        for line in _score_lines(u, pick)
        if line.strip()
    ]
    body = [line for line in body if "causal-zero" not in line and "e^0 = 1" not in line]
    hiding = '"causal", "sliding-window", "custom"' if u.custom else '"causal", "sliding-window"'
    start = (
        ("np.full(r1 - r0, SINKS[h])", "np.ones(r1 - r0)")
        if u.sinks
        else (
            "np.full(r1 - r0, -np.inf)",
            "np.zeros(r1 - r0)",
        )
    )
    function = [
        "def tile_scores(h, Q, K, d_k, rows, cols):",
        '    """One tile of the scores softmax sees: these query rows against these keys."""',
        *body,
        "    return S",
        "",
        "",
    ]
    loop = [
        "",
        "    # FlashAttention-2: query blocks of BLOCK_Q rows; for each, key blocks of BLOCK_K",
        "    # columns. Per row it keeps a running maximum m, a running sum l of exp(S - m) and",
        "    # an unnormalised output O; a new tile's larger maximum rescales both by",
        "    # exp(m_old - m_new). The n x m matrix of scores or weights is never stored.",
        "    head_output = np.zeros((len(Q), V.shape[1]))",
        "    lse = np.zeros(len(Q))  # each row's log-sum-exp: all a kernel keeps of its softmax",
        "    for r0 in range(0, len(Q), BLOCK_Q):",
        "        r1 = min(len(Q), r0 + BLOCK_Q)",
        "        rows = slice(r0, r1)",
        f"        m_run = {start[0]}"
        + ("  # the sink: one more logit, of value 0" if u.sinks else ""),
        f"        l_run = {start[1]}",
        "        O = np.zeros((r1 - r0, V.shape[1]))",
        "        for c0 in range(0, len(K), BLOCK_K):",
        "            cols = slice(c0, min(len(K), c0 + BLOCK_K))",
        f"            if MASK in ({hiding}) and future[rows, cols].all():",
        "                continue  # the mask hides the whole tile: skipped, K and V not read",
        "            S = tile_scores(h, Q, K, d_k, rows, cols)",
        "            m_new = np.maximum(m_run, S.max(axis=1))",
        "            base = np.where(np.isneginf(m_new), 0.0, m_new)  # rows with no key seen yet",
        "            rescale = np.exp(m_run - base)  # exp(m_old - m_new)",
        "            P = np.exp(S - base[:, None])",
        "            l_run = rescale * l_run + P.sum(axis=1)",
        "            O = rescale[:, None] * O + P @ V[cols]",
        "            m_run = m_new",
        "        seen = l_run > 0  # a row that sees no key at all has output 0",
        "        head_output[rows] = O / np.where(seen, l_run, 1.0)[:, None]",
        "        lse[rows] = np.where(seen, m_run + np.log(np.where(seen, l_run, 1.0)), -np.inf)",
        "",
        "    # The weights were never stored; Q, K and the log-sum-exp give them back:",
        "    S = tile_scores(h, Q, K, d_k, slice(None), slice(None))",
        "    weights = np.where(np.isneginf(lse)[:, None], 0.0, np.exp(S - lse[:, None]))",
        '    print(f"head {h + 1} weights")',
        "    for row in weights:",
        "        print(row.tolist())",
        "    head_outputs.append(head_output)",
        "",
    ]
    return (
        function
        + _whole_norm_lines(u, pick)
        + _projection_lines(u)
        + _norm_rope_lines(u, pick)
        + loop
    )


def _setup_lines(s: Scenario, u: _Uses, pick: Pick) -> list[str]:
    """Before the head loop: sizes, sinusoidal positions, the mask, positions and RoPE or
    ALiBi, the dropout draw."""
    m = "m" if u.cross else "n"  # how many keys
    out = ["n, d_model = X.shape"]
    if u.cross:
        out.append("m = len(X_kv)  # cross-attention: m keys, the rows of X_kv")
    out += [
        "",
        "# Position information: sinusoidal encodings added to X.",
        'if POSITIONAL == "sinusoidal":',
        pick(
            """\
    pos = np.arange(n)[:, None]
    pair = np.arange(d_model) // 2  # columns 2i and 2i+1 share one angle
    angle = pos / np.power(10000.0, 2 * pair / d_model)
    PE = np.where(np.arange(d_model) % 2 == 0, np.sin(angle), np.cos(angle))""",
            """\
    pos = torch.arange(n)[:, None]
    pair = torch.arange(d_model) // 2  # columns 2i and 2i+1 share one angle
    angle = pos / torch.pow(10000.0, 2 * pair / d_model)
    PE = torch.where(torch.arange(d_model) % 2 == 0, torch.sin(angle), torch.cos(angle))""",
        ),
        "    X = X + PE",
        "",
        "n_heads = len(W_Q) if PROJECTIONS else 1",
    ]
    ones = pick(f"np.ones((n, {m}), dtype=bool)", f"torch.ones(n, {m}, dtype=torch.bool)")
    tri = pick("np.triu({}, k={})", "{}.triu({})")
    low = pick("np.tril({}, k={})", "{}.tril({})")
    if u.cross:
        out += [
            "# Query i sits at position i + OFFSET among the keys; bottom-right puts the last",
            "# query on the last key (as when decoding over a cache).",
            'OFFSET = m - n if CAUSAL_ALIGNMENT == "bottom-right" else 0',
            f"future = {tri.format(ones, 'OFFSET + 1')}  # key j after query i",
            'if MASK == "sliding-window":  # also hidden: keys WINDOW or more places back',
            f"    future |= {low.format(ones, 'OFFSET - WINDOW')}",
        ]
    else:
        out += [
            f"future = {tri.format(ones, '1')}  # future[i, j]: key j after query i",
            'if MASK == "sliding-window":  # also hidden: keys WINDOW or more places back',
            f"    future |= {low.format(ones, '-WINDOW')}",
        ]
    if u.custom:
        out += [
            'if MASK == "custom":  # hidden: the keys MASK_MATRIX marks 0, future or not',
            "    future = MASK_MATRIX == 0",
        ]
    if u.positions:
        arange = pick("np.arange", "torch.arange")
        out.append(
            f"q_pos, k_pos = {arange}(n) + OFFSET, {arange}(m)  # positions of queries, keys"
            if u.cross
            else f"q_pos = k_pos = {arange}(n)  # the tokens' positions"
        )
    if u.rope_dims:
        out += _rope_lines(s, pick)
    if u.alibi:
        out += [
            "",
            "if ALIBI_SLOPES is None:",
            "    # The ALiBi paper's slopes: 2^(-8/H), 2^(-16/H), ... for H a power of two;",
            "    # otherwise (BLOOM) those of the largest power of two p below H, then every",
            "    # other slope of 2p.",
            "    H = len(W_Q)",
            pick("    p = 2 ** int(np.log2(H))", "    p = 2 ** int(math.log2(H))"),
            "    ALIBI_SLOPES = [2 ** (-8 * k / p) for k in range(1, p + 1)]",
            "    ALIBI_SLOPES += [2 ** (-8 * k / (2 * p)) for k in range(1, 2 * (H - p), 2)]",
        ]
    if u.relative:
        out += _relative_lines(pick)
    out += [
        "",
        pick(
            f"""\
# Dropout: one seeded draw for all heads, the same one attnviz makes.
keep = None
if DROPOUT > 0:
    keep = np.random.default_rng(DROPOUT_SEED).random((n_heads, n, {m})) >= DROPOUT""",
            f"""\
# Dropout: one seeded draw for all heads, the same one attnviz makes (with NumPy).
keep = None
if DROPOUT > 0:
    draw = np.random.default_rng(DROPOUT_SEED).random((n_heads, n, {m}))
    keep = torch.from_numpy(draw >= DROPOUT)""",
        ),
        "",
        'print("# tokens:", ascii(tokens))',
    ]
    if u.cross:
        out.append('print("# key tokens:", ascii(kv_tokens))')
    return out


def _head_lines(u: _Uses, pick: Pick) -> list[str]:
    """The loop over query heads: projections, QK-norm, RoPE, scores, scale, soft-cap,
    ALiBi, mask, softmax (with any sink), the wrong mask, dropout; prints the weights."""
    return (
        _whole_norm_lines(u, pick)
        + _projection_lines(u)
        + _norm_rope_lines(u, pick)
        + _score_lines(u, pick)
        + _weights_lines(u, pick)
    )


def _projection_lines(u: _Uses) -> list[str]:
    """The head loop's start: Q, K, V of query head h (and the key/value head it reads)."""
    kv = "g" if u.grouped else "h"  # which key/value head query head h reads
    X_kv = "X_kv" if u.cross else "X"
    out = ["head_outputs = []", "for h in range(n_heads):", "    if PROJECTIONS:"]
    if u.grouped:
        out.append("        g = h * len(W_K) // len(W_Q)  # the key/value head query head h shares")
    if u.whole_norm:  # Q and K were made before the loop, for the norm
        out.append(f"        V = {X_kv} @ W_V[{kv}]" + f" + b_V[{kv}]" * u.qkv_bias)
    elif u.qkv_bias:
        out += [
            "        Q = X @ W_Q[h] + b_Q[h]",
            f"        K = {X_kv} @ W_K[{kv}] + b_K[{kv}]",
            f"        V = {X_kv} @ W_V[{kv}] + b_V[{kv}]",
        ]
    else:
        out.append(f"        Q, K, V = X @ W_Q[h], {X_kv} @ W_K[{kv}], {X_kv} @ W_V[{kv}]")
    out += [
        "    else:",
        "        Q, K, V = X, X_kv, X_kv  # one head, no projections"
        if u.cross
        else "        Q = K = V = X  # simple self-attention: one head, no projections",
    ]
    if u.whole_norm:
        out.append("    Q, K = Q_all[h], K_all[h]  # made before the loop, for the norm")
    out.append("    d_k = Q.shape[1]")
    return out


def _whole_norm_lines(u: _Uses, pick: Pick) -> list[str]:
    """Before the head loop, for QK-norm over the whole projection: every query head's Q
    and K (a copy per query head: a group's copies give the same mean square) and each
    token's root mean square over all of their features together."""
    if not u.whole_norm:
        return []
    X_kv = "X_kv" if u.cross else "X"
    plus = (" + b_Q[h]", " + b_K[g]") if u.qkv_bias else ("", "")
    copy = pick(".copy()", ".clone()")
    return [
        "# QK-norm over the whole projection (OLMo 2): each token's Q (and K) of every head",
        "# together, divided by one root mean square over all of those features.",
        "if PROJECTIONS:",
        f"    Q_all = [X @ W_Q[h]{plus[0]} for h in range(n_heads)]",
        f"    K_all = [{X_kv} @ W_K[g]{plus[1]}",
        "             for g in (h * len(W_K) // n_heads for h in range(n_heads))]",
        "else:",
        f"    Q_all, K_all = [X{copy}], [{X_kv}{copy}]",
        "Q_RMS = (sum((A**2).sum(axis=1) for A in Q_all) / (n_heads * Q_all[0].shape[1])",
        "         + QK_NORM_EPS) ** 0.5",
        "K_RMS = (sum((A**2).sum(axis=1) for A in K_all) / (n_heads * K_all[0].shape[1])",
        "         + QK_NORM_EPS) ** 0.5",
        "",
    ]


def _norm_rope_lines(u: _Uses, pick: Pick) -> list[str]:
    """QK-norm and RoPE on Q and K, where the scenario uses them."""
    kv = "g" if u.grouped else "h"
    out: list[str] = []
    if u.whole_norm:
        out += [
            "",
            "    # QK-norm over the whole projection: each row divided by its token's RMS",
            "    # over every head (Q_RMS, K_RMS, made before the loop).",
            "    Q, K = Q / Q_RMS[:, None], K / K_RMS[:, None]",
        ]
    elif u.qk_norm:
        mean = pick(
            "np.sqrt(np.mean({0}**2, axis=1, keepdims=True)",
            "torch.sqrt(({0}**2).mean(dim=1, keepdim=True)",
        )
        out += [
            "",
            "    # QK-norm: each row of Q and K divided by its root mean square (RMSNorm).",
            f"    Q = Q / {mean.format('Q')} + QK_NORM_EPS)",
            f"    K = K / {mean.format('K')} + QK_NORM_EPS)",
        ]
    if u.norm_weights:
        out += [
            "    if PROJECTIONS:  # then times the norm's weights, one per feature",
            f"        Q, K = Q * q_norm[h], K * k_norm[{kv}]",
        ]
    if u.rope_dims:
        out += [
            '    if POSITIONAL == "rope":  # turned by their positions, so scores see distance',
            "        Q, K = rope(Q, q_pos), rope(K, k_pos)",
        ]
    return out


def _relative_lines(pick: Pick) -> list[str]:
    """T5's bucket of each score's relative position j - i, as T5 computes it (its
    logarithm in float32)."""
    return [
        "",
        "",
        "def relative_bucket(rel):",
        '    """T5\'s bucket of each relative position j - i (key minus query): distances',
        "    below half a direction's buckets get one each, larger ones share buckets that",
        "    grow logarithmically up to RELATIVE_MAX_DISTANCE (the log in float32, as T5's).",
        '    """',
        "    buckets = RELATIVE_BUCKETS",
        pick("    bucket = np.zeros_like(rel)", "    bucket = torch.zeros_like(rel)"),
        "    if RELATIVE_BIDIRECTIONAL:  # an encoder: keys after the query get half the buckets",
        "        buckets //= 2",
        pick("        bucket = np.where(rel > 0, buckets, 0)",
             "        bucket = (rel > 0).long() * buckets"),
        pick("        distance = np.abs(rel)", "        distance = rel.abs()"),
        "    else:  # a decoder: only keys at or before the query",
        pick("        distance = np.maximum(-rel, 0)", "        distance = (-rel).clamp(min=0)"),
        "    exact = buckets // 2",
        pick("    log = np.log(np.maximum(distance, 1).astype(np.float32) / np.float32(exact))",
             "    log = torch.log(distance.clamp(min=1).float() / exact)"),
        pick("    share = log / np.float32(np.log(RELATIVE_MAX_DISTANCE / exact))",
             "    share = log / math.log(RELATIVE_MAX_DISTANCE / exact)"),
        pick("    big = exact + (share * np.float32(buckets - exact)).astype(int)",
             "    big = exact + (share * (buckets - exact)).long()"),
        pick("    big = np.minimum(big, buckets - 1)", "    big = big.clamp(max=buckets - 1)"),
        pick("    return bucket + np.where(distance < exact, distance, big)",
             "    return bucket + torch.where(distance < exact, distance, big)"),
        "",
        "",
        "BUCKET = relative_bucket(k_pos[None, :] - q_pos[:, None])  # the table row of each score",
    ]  # fmt: skip


def _score_lines(u: _Uses, pick: Pick) -> list[str]:
    """From Q and K to the scores softmax sees: Q Kᵀ, scale, soft-cap, ALiBi, the mask."""
    out = ["", "    S = Q @ K.T  # S[i, j]: query i against key j", "    if SCALE:"]
    if u.scale_value:
        out.append("        S = S * SCALE_VALUE  # the given scale, in place of 1 / sqrt(d_k)")
    else:
        out.append(
            pick("        S = S / np.sqrt(d_k)", "        S = S / math.sqrt(d_k)")
            + "  # keeps the scores' variance near 1"
        )
    if u.softcap:
        tanh = pick("np.tanh", "torch.tanh")
        out.append(f"    S = SOFTCAP * {tanh}(S / SOFTCAP)  # soft-cap: squashed into +-SOFTCAP")
    if u.alibi:
        distance = pick(
            "np.abs(q_pos[:, None] - k_pos[None, :])", "(q_pos[:, None] - k_pos[None, :]).abs()"
        )
        out += [
            '    if POSITIONAL == "alibi":  # a penalty that grows with the distance to the key',
            f"        S = S - ALIBI_SLOPES[h] * {distance}",
        ]
    if u.relative:
        out += [
            '    if POSITIONAL == "relative-bias":  # T5: a learned number per bucket and head',
            "        S = S + relative_bias[BUCKET, h]",
        ]
    hiding = '"causal", "sliding-window", "custom"' if u.custom else '"causal", "sliding-window"'
    hidden = "hidden" if u.custom else "future"
    out += [
        f"    if MASK in ({hiding}):",
        pick(
            f"        S = np.where(future, -np.inf, S)  # {hidden} keys get weight exactly 0",
            f"        S = S.masked_fill(future, -math.inf)  # {hidden} keys get weight exactly 0",
        ),
        pick(
            """\
    elif MASK == "causal-zero":
        S = np.where(future, 0.0, S)  # wrong on purpose: e^0 = 1, so future keys leak
""",
            """\
    elif MASK == "causal-zero":
        S = S.masked_fill(future, 0.0)  # wrong on purpose: e^0 = 1, so future keys leak
""",
        ),
    ]
    return out


def _weights_lines(u: _Uses, pick: Pick) -> list[str]:
    """Softmax (with any sink), the wrong mask, dropout; prints the weights."""
    out = _softmax_lines(u, pick)
    out += [
        "",
        pick(
            """\
    if MASK == "drop-after-softmax":
        weights = np.where(future, 0.0, weights)  # wrong on purpose: rows sum to < 1""",
            """\
    if MASK == "drop-after-softmax":
        weights = weights.masked_fill(future, 0.0)  # wrong on purpose: rows sum to < 1""",
        ),
        "    if keep is not None:",
        "        weights = weights * keep[h] / (1 - DROPOUT)  # the kept weights are scaled up",
        "",
        '    print(f"head {h + 1} weights")',
        "    for row in weights:",
        "        print(row.tolist())",
        "    head_outputs.append(weights @ V)",
        "",
    ]
    return out


def _mix_lines(u: _Uses, pick: Pick) -> list[str]:
    """Concatenate the heads, mix them with W_O (and b_O), print the output."""
    return [
        "# Concatenate the head outputs in head order, then mix them with W_O.",
        pick(
            "concat = np.concatenate(head_outputs, axis=1)",
            "concat = torch.cat(head_outputs, dim=1)",
        ),
        "if PROJECTIONS:",
        pick("    mixed = concat.copy()", "    mixed = concat.clone()"),
        "    for h in ABLATED:",
        "        mixed[:, (h - 1) * d_k : h * d_k] = 0.0  # this head contributes nothing",
        "    output = mixed @ W_O + b_O  # plus the output bias"
        if u.out_bias
        else "    output = mixed @ W_O",
        "else:",
        "    output = concat  # no projections: no W_O either",
        "",
        'print("output")',
        "for row in output:",
        "    print(row.tolist())",
    ]


def _rope_lines(s: Scenario, pick: Pick) -> list[str]:
    """The RoPE frequencies and the function that turns Q or K (before the head loop)."""
    if s.settings.rope_style == "half":
        pairs = [
            '    # "half" (GPT-NeoX, Llama): feature i pairs with feature i + ROPE_DIMS / 2',
            "    first, second = slice(0, ROPE_DIMS // 2), slice(ROPE_DIMS // 2, ROPE_DIMS)",
        ]
    else:
        pairs = [
            '    # "interleaved" (GPT-J): feature 2i pairs with feature 2i + 1',
            "    first, second = slice(0, ROPE_DIMS, 2), slice(1, ROPE_DIMS, 2)",
        ]
    st = s.settings
    if st.rope_frequencies is None:
        freq = pick(
            "freq = ROPE_BASE ** (-np.arange(0, ROPE_DIMS, 2) / ROPE_DIMS)  # radians per step",
            "freq = ROPE_BASE ** (-torch.arange(0, ROPE_DIMS, 2) / ROPE_DIMS)  # radians per step",
        )
    else:
        freq = pick(
            "freq = np.array(ROPE_FREQUENCIES)  # radians per step: the model's own (scaled)",
            "freq = torch.tensor(ROPE_FREQUENCIES)  # radians per step: the model's own (scaled)",
        )
    factor = (
        [] if st.rope_factor == 1.0 else ["    cos, sin = cos * ROPE_FACTOR, sin * ROPE_FACTOR"]
    )
    return [
        "",
        "# RoPE: each pair of the first ROPE_DIMS features of Q and K turns by an angle that",
        "# grows with the token's position, at its own frequency.",
        freq,
        "",
        "",
        "def rope(A, pos):",
        '    """A with each pair (a, b) turned by pos * freq: (a cos - b sin, a sin + b cos)."""',
        *pairs,
        "    angle = pos[:, None] * freq  # one row per token, one column per pair",
        pick(
            "    cos, sin = np.cos(angle), np.sin(angle)",
            "    cos, sin = torch.cos(angle), torch.sin(angle)",
        ),
        *factor,
        "    a, b = A[:, first], A[:, second]",
        pick("    A = A.copy()", "    A = A.clone()"),
        "    A[:, first] = a * cos - b * sin",
        "    A[:, second] = a * sin + b * cos",
        "    return A",
        "",
    ]


def _softmax_lines(u: _Uses, pick: Pick) -> list[str]:
    """Softmax along the keys: the textbook form, with a sink, or safe for empty rows."""
    if u.sinks:
        return [
            "    # Softmax with a sink: exp(SINKS[h]) joins each row's sum only, so the weights",
            "    # sum to less than 1. Subtracting the larger of the row maximum and the sink",
            "    # avoids overflow.",
            pick(
                "    top = np.maximum(S.max(axis=1, keepdims=True), SINKS[h])",
                "    top = S.amax(dim=1, keepdim=True).clamp(min=SINKS[h])",
            ),
            pick("    E = np.exp(S - top)", "    E = torch.exp(S - top)"),
            pick(
                "    weights = E / (E.sum(axis=1, keepdims=True) + np.exp(SINKS[h] - top))",
                "    weights = E / (E.sum(dim=1, keepdim=True) + torch.exp(SINKS[h] - top))",
            ),
        ]
    if u.empty_rows:
        return [
            "    # Softmax along the keys; subtracting the row maximum avoids overflow. A row",
            "    # whose every key is hidden (maximum -inf) has no distribution: weights 0.",
            pick("    top = S.max(axis=1, keepdims=True)", "    top = S.amax(dim=1, keepdim=True)"),
            pick(
                "    top = np.where(np.isneginf(top), 0.0, top)",
                "    top = top.masked_fill(top == -math.inf, 0.0)",
            ),
            pick("    E = np.exp(S - top)", "    E = torch.exp(S - top)"),
            pick(
                "    total = E.sum(axis=1, keepdims=True)", "    total = E.sum(dim=1, keepdim=True)"
            ),
            pick(
                "    weights = E / np.where(total == 0, 1.0, total)",
                "    weights = E / total.masked_fill(total == 0, 1.0)",
            ),
        ]
    return pick(
        """\
    # Softmax along the keys; subtracting the row maximum avoids overflow.
    E = np.exp(S - S.max(axis=1, keepdims=True))
    weights = E / E.sum(axis=1, keepdims=True)""",
        """\
    # Softmax along the keys (what torch.softmax(S, dim=1) does): subtracting the row
    # maximum avoids overflow.
    E = torch.exp(S - S.amax(dim=1, keepdim=True))
    weights = E / E.sum(dim=1, keepdim=True)""",
    ).split("\n")


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


def _per_head(a: HeadStack) -> str:
    """A (heads, rows, cols) stack as a nested list literal, one commented block per head."""
    blocks = []
    for h, m in enumerate(a):
        rows = "\n".join(_row(r, "        ") for r in m.tolist())
        blocks.append(f"    [  # head {h + 1}\n{rows}\n    ],")
    return "[\n" + "\n".join(blocks) + "\n]"


def _numbers(values: tuple[float, ...]) -> str:
    """Per-head settings (sinks, ALiBi slopes) as a list literal of exact floats."""
    return "[" + ", ".join(repr(float(v)) for v in values) + "]"


def _describe(s: Scenario) -> str:
    """The scenario's shape and settings in a sentence or two (for the docstring)."""
    st = s.settings
    u = _uses(s)
    mask = {
        "none": "no mask",
        "causal": "causal mask (-inf before softmax)",
        "causal-zero": "causal mask done wrong (0 before softmax)",
        "drop-after-softmax": "causal mask done wrong (weights dropped after softmax)",
        "sliding-window": f"sliding window of {st.window} keys (-inf outside it)",
        "custom": "custom mask (-inf where MASK_MATRIX is 0)",
    }[st.mask]
    heads = f"{s.n_heads} head{'s' * (s.n_heads != 1)} of d_k {s.d_k}"
    if u.grouped:
        kind = "MQA" if s.kv_heads == 1 else "GQA"
        heads = (
            f"{s.n_heads} query heads of d_k {s.d_k} sharing {s.kv_heads} key/value "
            f"head{'s' * (s.kv_heads != 1)} ({kind})"
        )
    parts = [
        f"{s.n} tokens, d_model {s.d_model}, {heads}; projections "
        f"{'on' if st.projections else 'off'}"
    ]
    if u.cross:
        parts.append(
            f"cross-attention over {s.m} key token{'s' * (s.m != 1)} "
            f"({st.causal_alignment} alignment)"
        )
    if u.qkv_bias:
        parts.append("biases on Q, K and V")
    if u.out_bias:
        parts.append("output bias b_O")
    if u.qk_norm:
        over = ", over all heads together" * u.whole_norm
        parts.append(
            f"QK-norm (RMS{over}, eps {st.qk_norm_eps!r}{', with weights' * u.norm_weights})"
        )
    if not st.scale:
        parts.append("not scaled")
    elif u.scale_value:
        parts.append(f"scaled by {st.scale_value!r}")
    else:
        parts.append("scaled by sqrt(d_k)")
    if u.softcap:
        parts.append(f"scores soft-capped at {st.softcap!r}")
    parts.append(mask)
    if st.positional == "sinusoidal":
        parts.append("sinusoidal positions")
    elif st.positional == "rope":
        base = "the model's own frequencies" if st.rope_frequencies else f"base {st.rope_base!r}"
        factor = "" if st.rope_factor == 1.0 else f", factor {st.rope_factor!r}"
        parts.append(f"RoPE ({st.rope_style} pairs, {base}{factor}, {u.rope_dims} features turned)")
    elif u.alibi:
        given = "given" if st.alibi_slopes is not None else "the paper's"
        parts.append(f"ALiBi ({given} slopes)")
    elif u.relative:
        direction = "bidirectional" if st.relative_bidirectional else "unidirectional"
        parts.append(
            f"T5's relative position bias ({st.relative_buckets} {direction} buckets, "
            f"max distance {st.relative_max_distance})"
        )
    else:
        parts.append("no position encoding")
    if u.sinks:
        parts.append("a sink logit per head")
    parts.append(
        f"dropout {st.dropout!r} (seed {st.dropout_seed})" if st.dropout > 0 else "no dropout"
    )
    if st.ablated:
        parts.append(
            f"head{'s' * (len(st.ablated) > 1)} {', '.join(str(h + 1) for h in st.ablated)} ablated"
        )
    return ", ".join(parts) + "."


def _header(s: Scenario, flavor: str, source: str | None, backward: bool = False) -> str:
    library = {
        "numpy": "NumPy",
        "torch": "PyTorch (float64, CPU)",
        "tiled": "NumPy, tile by tile as FlashAttention-2 computes it",
    }[flavor]
    needs = "PyTorch and NumPy" if flavor == "torch" else "NumPy"
    lines = [
        f'"""Attention over one attnviz scenario, step by step in {library}.',
        "",
        f"Exported by attnviz {__version__}. The scenario: {_describe(s)}",
        "",
        f"Standalone: it needs only {needs}, not attnviz. Run it with `python <this file>`.",
        "It prints each head's attention weights (rows: queries, columns: keys), then the",
        "final output (one row per token); each matrix row is a list of floats that reads",
        "back exactly. Change any number or setting below and run it again.",
    ]
    if backward:
        how = "by autograd" if flavor == "torch" else "by hand, step by step"
        st = s.settings
        loss = {"target": f"target, {st.loss_target}", "next-token": "next-token"}.get(
            st.loss, f"cell {st.loss_cell[0] + 1},{st.loss_cell[1] + 1}"
        )
        lines += [
            "",
            f"Then the scenario's loss ({loss}) and the backward pass, {how}: the loss (a "
            "title 'loss', its value), then dL/d each intermediate of each head, of concat "
            "and final, and of each input (titles 'dL/d<name>' or 'dL/d<name> head <h>').",
        ]
    lines.append('"""')
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


def _data(s: Scenario, flavor: str, u: _Uses) -> str:
    """The scenario's tokens, matrices and settings as Python constants (the optional ones
    only when the scenario uses them)."""

    def array(literal: str) -> str:
        if flavor != "torch":
            return f"np.array({literal})"
        return f"torch.tensor({literal}, dtype=torch.float64)"

    lines = [
        "# The scenario ---------------------------------------------------------------",
        "",
        "tokens = " + ascii(list(s.tokens)),
        "",
        "# X: one row per token (n x d_model).",
        "X = " + array(_matrix(s.X)),
        "",
    ]
    if u.cross and s.kv_tokens is not None and s.X_kv is not None:
        lines += [
            "# Cross-attention: the keys and values come from these m tokens (m x d_model),",
            "# e.g. an encoder's output, which carries its own positions.",
            "kv_tokens = " + ascii(list(s.kv_tokens)),
            "X_kv = " + array(_matrix(s.X_kv)),
            "",
        ]
    if u.grouped:
        lines += [
            "# W_Q: one d_model x d_k matrix per query head (H of them).",
            "# W_K, W_V: one d_model x d_k matrix per key/value head (G of them, G divides H);",
            "# query head h shares key/value head h * G // H.",
        ]
    else:
        lines.append("# W_Q, W_K, W_V: one d_model x d_k matrix per head.")
    lines += [
        "W_Q = " + array(_per_head(s.W_Q)),
        "W_K = " + array(_per_head(s.W_K)),
        "W_V = " + array(_per_head(s.W_V)),
        "",
    ]
    if u.qkv_bias:
        lines += [
            "# b_Q: a 1 x d_k bias row per query head; b_K, b_V: one per key/value head.",
            "b_Q = " + array(_per_head(s.b_Q)),
            "b_K = " + array(_per_head(s.b_K)),
            "b_V = " + array(_per_head(s.b_V)),
            "",
        ]
    if u.norm_weights:
        lines += [
            "# q_norm, k_norm: QK-norm's weights, 1 x d_k per query head and key/value head.",
            "q_norm = " + array(_per_head(s.q_norm)),
            "k_norm = " + array(_per_head(s.k_norm)),
            "",
        ]
    lines += [
        "# W_O: (heads * d_k) x d_model; rows [h * d_k, (h + 1) * d_k) mix head h + 1.",
        "W_O = " + array(_matrix(s.W_O)),
        "",
    ]
    if u.out_bias:
        lines += ["# b_O: 1 x d_model, added to the output.", "b_O = " + array(_matrix(s.b_O)), ""]
    if u.custom and s.mask_matrix is not None:
        literal = _matrix(s.mask_matrix.astype(int))
        lines += [
            f"# MASK_MATRIX (the custom mask): n x {'m' if u.cross else 'n'}, 1 where query i "
            "may attend key j, else 0.",
            "MASK_MATRIX = "
            + (f"np.array({literal})" if flavor != "torch" else f"torch.tensor({literal})"),
            "",
        ]
    if u.relative and s.relative_bias is not None:
        lines += [
            "# relative_bias (T5): buckets x heads, added to head h's score of query i and",
            "# key j at the row of the bucket of j - i.",
            "relative_bias = " + array(_matrix(s.relative_bias)),
            "",
        ]
    return "\n".join([*lines, *_settings_lines(s, u)])


def _settings_lines(s: Scenario, u: _Uses) -> list[str]:
    """The settings as Python constants (the optional ones only when used)."""
    st = s.settings
    ablated = tuple(h + 1 for h in st.ablated)
    masks = [mask for mask in MASKS if mask != "custom" or u.custom]
    positionals = ["none", "sinusoidal"] + (
        [st.positional] if st.positional in ("rope", "alibi", "relative-bias") else []
    )
    lines = [
        "# The settings ---------------------------------------------------------------",
        "",
        f"PROJECTIONS = {st.projections!r}  # False: one head with Q = K = V = X, no W_O",
    ]
    if u.scale_value:
        lines += [
            f"SCALE = {st.scale!r}  # multiply the scores by SCALE_VALUE",
            f"SCALE_VALUE = {st.scale_value!r}  # in place of 1 / sqrt(d_k)",
        ]
    else:
        lines.append(f"SCALE = {st.scale!r}  # divide the scores by sqrt(d_k)")
    if u.softcap:
        lines.append(f"SOFTCAP = {st.softcap!r}  # scores become SOFTCAP * tanh(S / SOFTCAP)")
    lines += [
        f"MASK = {json.dumps(st.mask)}  # {', '.join(masks)}",
        f"WINDOW = {int(st.window)!r}  # sliding-window: "
        + (
            "each query sees the WINDOW keys up to its position"
            if u.cross
            else "query i sees keys i - WINDOW < j <= i"
        ),
    ]
    if u.cross:
        lines.append(
            f"CAUSAL_ALIGNMENT = {json.dumps(st.causal_alignment)}  # or "
            f"{'top-left' if st.causal_alignment == 'bottom-right' else 'bottom-right'}: "
            "where queries sit among keys"
        )
    choices = f"{', '.join(positionals[:-1])} or {positionals[-1]}"
    lines.append(f"POSITIONAL = {json.dumps(st.positional)}  # {choices}")
    if u.rope_dims:
        lines += [
            f"ROPE_BASE = {float(st.rope_base)!r}  # RoPE's frequencies: ROPE_BASE^(-2i/ROPE_DIMS)",
            f"ROPE_DIMS = {u.rope_dims!r}  # how many leading features of Q and K turn (even)",
        ]
        if st.rope_frequencies is not None:
            lines.append(
                f"ROPE_FREQUENCIES = {_numbers(st.rope_frequencies)}  # the model's, one per pair"
            )
        if st.rope_factor != 1.0:
            lines.append(f"ROPE_FACTOR = {float(st.rope_factor)!r}  # multiplies cos and sin")
    if u.alibi:
        slopes = "None" if st.alibi_slopes is None else _numbers(st.alibi_slopes)
        lines.append(f"ALIBI_SLOPES = {slopes}  # one per query head; None: the paper's slopes")
    if u.relative:
        lines += [
            f"RELATIVE_BUCKETS = {int(st.relative_buckets)!r}  # the rows of relative_bias",
            f"RELATIVE_MAX_DISTANCE = {int(st.relative_max_distance)!r}  # the last bucket's "
            "distance",
            f"RELATIVE_BIDIRECTIONAL = {bool(st.relative_bidirectional)!r}  # False: a decoder's",
        ]
    if u.qk_norm:
        lines.append(
            f"QK_NORM_EPS = {float(st.qk_norm_eps)!r}  # QK-norm: added to the mean square"
        )
    if u.sinks and st.sinks is not None:
        lines.append(f"SINKS = {_numbers(st.sinks)}  # one sink logit per query head")
    lines += [
        f"DROPOUT = {float(st.dropout)!r}  # attention dropout probability (training only)",
        f"DROPOUT_SEED = {int(st.dropout_seed)!r}",
        f"ABLATED = {ablated!r}  # heads (from 1) left out of the W_O mix",
        "",
        "# The computation ------------------------------------------------------------",
        "",
    ]
    return lines


def to_script(
    s: Scenario,
    flavor: str = "numpy",
    *,
    source: str | None = None,
    blocks: tuple[int, int] = (2, 2),
    backward: bool = False,
) -> str:
    """A standalone NumPy or PyTorch script that recomputes and prints the scenario's numbers.

    source (a file name or preset name) is recorded in the script's opening comment. The
    "tiled" flavor computes each head FlashAttention-2's way, in blocks of ``blocks``
    (query rows, key columns), and prints the same lines. backward: then the scenario's
    own loss and every gradient, by hand (NumPy) or by autograd (torch); see
    ``codegen_backward``.
    """
    if flavor not in FLAVORS:
        raise ValueError(f"flavor: {flavor!r} is not one of {', '.join(FLAVORS)}")
    if flavor == "tiled":
        if backward:
            raise ScenarioError("--backward: the tiled flavor is a forward pass only; use "
                                "--flavor numpy or torch")  # fmt: skip
        check_supported(s)
    u = _uses(s)
    if backward and flavor == "torch":
        u = grad.torch_uses(s, u)
    imports = _TORCH_HEAD if flavor == "torch" else _NUMPY_HEAD
    lines = _lines(s, flavor, u)
    if backward:
        lines = grad.forward_edits(lines, u, flavor) + grad.backward_lines(s, u, flavor)
        if flavor == "torch":
            lines = grad.torch_leaves(s) + lines
    body = "\n".join(lines) + "\n"
    data = _data(s, flavor, u)
    if flavor == "tiled":
        block_q, block_k = (max(1, int(b)) for b in blocks)
        sizes = (
            f"BLOCK_Q = {block_q}  # query rows a tile\nBLOCK_K = {block_k}  # key columns a tile\n"
        )
        data = data.replace("# The computation ---", sizes + "\n# The computation ---", 1)
    return "\n".join([_header(s, flavor, source, backward), imports, data, body])
