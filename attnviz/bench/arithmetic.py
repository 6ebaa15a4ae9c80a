"""The sweep's arithmetic: FLOPs, bytes read, and the memory each case should need.

Standard library only. Shapes: Q is b × h × r × d (r = n in the prefill phase, 1 in the
decode phase), K and V are b × G × n × d with G key/value heads (``Config.groups``).

FLOPs follow FlashAttention's convention: 4·d FLOPs for every (query, key) pair a head
computes, 4·b·h·n²·d for full attention, half of it with a plain causal mask, and 2.5
times the forward for the backward pass. A sliding window or documents count the pairs
their mask lets through, exactly.
"""

from __future__ import annotations

from attnviz.bench.config import Config

BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}
CHECK_N = 128  # the size at which every implementation is compared with float64
DENSE = ("naive", "math", "flex-eager")  # implementations that hold the n × n scores
SDPA_FAMILY = ("sdpa", "flash", "efficient", "cudnn", "math")


def query_rows(c: Config, n: int) -> int:
    """Query rows per head: n when prefilling, one new token when decoding."""
    return 1 if c.phase == "decode" else n


def has_mask(c: Config) -> bool:
    """Whether a mask beyond plain causal applies (a window or documents)."""
    return c.phase == "prefill" and bool(c.window or c.documents)


def visible_pairs(c: Config, n: int) -> float:
    """The (query, key) pairs one head computes: n² (n²/2 causal, by the convention),
    n when decoding, and for a window or documents the pairs their mask keeps."""
    if c.phase == "decode":
        return float(n)
    if not has_mask(c):
        return n * n / (2 if c.causal else 1)
    docs = c.documents or 1
    length = n // docs
    if c.window:
        w = min(c.window, length)
        per_doc = length * w - w * (w - 1) // 2
    elif c.causal:
        per_doc = length * (length + 1) // 2
    else:
        per_doc = length * length
    return float(docs * per_doc)


def attention_flops(c: Config, n: int) -> float:
    """4·d FLOPs per visible pair per query head and batch; backward adds 2.5× that."""
    forward = 4 * c.batch * c.heads * c.d_head * visible_pairs(c, n)
    return forward * (3.5 if c.backward else 1.0)


def kv_bytes(c: Config, n: int, dtype: str | None = None) -> int:
    """Bytes of K and V: 2·b·G·n·d values (what a decode step must read)."""
    return 2 * c.batch * c.groups * n * c.d_head * BYTES[dtype or c.dtype]


def input_bytes(c: Config, impl: str, n: int) -> int:
    """Q, K and V in the sweep's dtype, and the dense boolean mask (one byte a pair) that
    naive and SDPA are given for a window or documents."""
    size = BYTES[c.dtype]
    q = c.batch * c.heads * query_rows(c, n) * c.d_head * size
    mask = n * n if has_mask(c) and impl not in ("flex", "flex-eager") else 0
    return q + kv_bytes(c, n) + mask


def predicted_bytes(c: Config, impl: str, n: int) -> int:
    """Memory above the inputs that the implementation needs, by formula.

    Dense attention (naive, the math backend) holds the b·h·r·n scores and their softmax
    at once (two matrices), plus the output; flex without the compiler holds three (the
    scores, the masked scores, the weights) and a boolean one. With backward, autograd
    keeps them and the gradient of each, and the input gradients (Q's, and K's and V's
    at G heads) join the output. Naive and the math backend under GQA also copy K and V
    to all h heads (and, with backward, their gradients). Fused kernels hold the output
    and one float32 statistic per row (b·h·r), plus the input gradients with backward;
    their small per-thread scratch buffers are not counted. ``sdpa`` and ``flex`` are
    predicted as fused. SDPA given a dense boolean mask (a window or documents) first
    turns it into an additive one in the sweep's dtype: r·n values more.
    """
    size = BYTES[c.dtype]
    rows = c.batch * c.heads * query_rows(c, n)
    out = rows * c.d_head * size
    twice = 2 if c.backward else 1
    grads = out + kv_bytes(c, n) if c.backward else 0
    additive = query_rows(c, n) * n * size if has_mask(c) and impl in SDPA_FAMILY else 0
    if impl in DENSE:
        squares = (3 * size + 1 if impl == "flex-eager" else 2 * size) * rows * n * twice
        repeated = 0
        if impl in ("naive", "math") and c.groups != c.heads:
            repeated = 2 * c.batch * c.heads * n * c.d_head * size * twice
        return squares + out + grads + repeated + additive
    return out + grads + rows * 4 + additive


def reference_bytes(c: Config, impl: str, device: str) -> dict[str, int]:
    """Memory the float64 check at n = CHECK_N may need, per device ("cpu", and "cuda").

    An upper bound (everything it allocates, as if held at once; the measured peak is
    about half): on the CPU, the float32 draws and float64 copies of Q, K, V (12 bytes a
    value), K and V repeated to every head in float64 under GQA, the reference's scores
    and softmax (two b·h·r·n float64 matrices), the mask as booleans and as float64,
    its output, the checked output and their difference; on the device, Q, K, V in the
    sweep's dtype and what the implementation itself needs at CHECK_N.
    """
    n = CHECK_N
    q_values = c.batch * c.heads * query_rows(c, n) * c.d_head
    kv_values = 2 * c.batch * c.groups * n * c.d_head
    cpu = 12 * (q_values + kv_values) + 5 * 8 * q_values
    cpu += 2 * c.batch * c.heads * query_rows(c, n) * n * 8
    if c.groups != c.heads:
        cpu += 2 * c.batch * c.heads * n * c.d_head * 8
    if has_mask(c):
        cpu += n * n * (1 + 8)
    here = input_bytes(c, impl, n) + predicted_bytes(c, impl, n)
    if device == "cpu":
        return {"cpu": cpu + here}
    return {"cpu": cpu, device: here}
