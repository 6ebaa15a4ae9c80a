"""What attention costs: score counts, score memory, FLOPs, KV-cache size, and the
slow-memory traffic of dense and tiled (FlashAttention) attention."""

from __future__ import annotations

import math
from dataclasses import dataclass

from attnviz.core.maths.tiling import Traffic, blocks_for_memory
from attnviz.core.maths.tiling import traffic as slow_memory_traffic

BYTES_PER = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2}
# The fast memory a FlashAttention tile lives in: an H100/H200 SM's 192 KiB of shared
# memory (of 228), in bfloat16 numbers.
FAST_MEMORY = 192 * 1024 // 2


@dataclass(frozen=True)
class Cost:
    """Cost of one attention layer over n tokens (batch of 1).

    - ``scores``: n² per head, h·n² in all;
    - ``flops``: 4·n²·d_k per head (Q Kᵀ and weights·V, two FLOPs per multiply-add),
      half of it under a causal mask (FlashAttention's convention);
    - ``kv_cache``: 2·n·G·d_k numbers per layer (K and V for every key/value head; G =
      h unless heads share them), which is the brief's 2·n·d_model when h·d_k = d_model;
      with a sliding window, min(n, window) tokens instead of n.
    """

    n: int
    heads: int
    d_k: int
    causal: bool = False
    window: int | None = None  # a sliding window keeps only this many tokens' K and V
    kv_heads: int | None = None  # key/value heads, when groups of heads share them

    def __post_init__(self) -> None:
        for name in ("n", "heads", "d_k"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: expected a positive whole number, got {value!r}")

    @property
    def scores_per_head(self) -> int:
        return self.n * self.n

    @property
    def scores(self) -> int:
        return self.heads * self.n * self.n

    def score_bytes(self, dtype: str = "float32") -> int:
        """Memory to hold every head's n × n score matrix once."""
        return self.scores * BYTES_PER[dtype]

    @property
    def flops(self) -> int:
        full = 4 * self.n * self.n * self.d_k * self.heads
        return full // 2 if self.causal else full

    @property
    def kv_cache_numbers(self) -> int:
        kept = self.n if self.window is None else min(self.n, self.window)
        return 2 * kept * (self.kv_heads or self.heads) * self.d_k

    def kv_cache_bytes(self, dtype: str = "float32") -> int:
        return self.kv_cache_numbers * BYTES_PER[dtype]

    def traffic(self, fast_memory: int = FAST_MEMORY) -> tuple[Traffic, int, int]:
        """One head's slow-memory reads and writes (in numbers), dense against tiled with
        the paper's block sizes for ``fast_memory`` numbers (B_r, B_c, also returned);
        under a causal mask the tiles past the diagonal are skipped."""
        b_r, b_c = blocks_for_memory(fast_memory, self.d_k)
        columns = None
        if self.causal:
            columns = sum(
                min(self.n, math.ceil(min(self.n, r0 + b_r) / b_c) * b_c)
                for r0 in range(0, self.n, b_r)
            )
        return slow_memory_traffic(self.n, self.n, self.d_k, b_r, columns), b_r, b_c


def human_bytes(count: float) -> str:
    """1536 -> '1.5 KiB'."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(count) < 1024 or unit == "TiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    raise AssertionError("unreachable")


def human_count(count: float) -> str:
    """16_000_000_000 -> '16.0 billion'."""
    for size, word in ((1e12, "trillion"), (1e9, "billion"), (1e6, "million"), (1e3, "thousand")):
        if abs(count) >= size:
            return f"{count / size:.1f} {word}"
    return f"{count:g}"


@dataclass(frozen=True)
class KVShape:
    """What a model keeps per token in its KV cache: key/value heads of d_head numbers,
    for K and V, in every layer; a sliding window caps how many tokens are kept."""

    name: str
    heads: int  # query heads
    kv_heads: int  # key/value heads: = heads (MHA), 1 (MQA), a divisor between (GQA)
    d_head: int
    layers: int = 1
    window: int | None = None

    def __post_init__(self) -> None:
        if self.kv_heads < 1 or self.heads % self.kv_heads:
            raise ValueError(f"{self.kv_heads} key/value heads do not divide {self.heads} heads")

    @property
    def kind(self) -> str:
        if self.kv_heads == self.heads:
            return "MHA"
        return "MQA" if self.kv_heads == 1 else f"GQA, {self.heads // self.kv_heads} per group"

    def bytes_per_token(self, dtype: str = "bfloat16") -> int:
        """2 (K and V) · kv_heads · d_head · layers numbers."""
        return 2 * self.kv_heads * self.d_head * self.layers * BYTES_PER[dtype]

    def cache_bytes(self, n: int, dtype: str = "bfloat16") -> int:
        """The cache after n tokens: a sliding window keeps the last ``window`` only."""
        kept = n if self.window is None else min(n, self.window)
        return kept * self.bytes_per_token(dtype)


# Published shapes (config.json of each model).
REAL_MODELS = (
    KVShape("GPT-2 small", 12, 12, 64, 12),
    KVShape("Llama-3-8B", 32, 8, 128, 32),
    KVShape("Llama-3-70B", 64, 8, 128, 80),
    KVShape("Mistral-7B v0.1", 32, 8, 128, 32, window=4096),
    KVShape("Falcon-7B", 71, 1, 64, 32),
)


def sharing_options(heads: int, d_head: int) -> list[KVShape]:
    """One layer of heads × d_head as MHA, as GQA for every group size that divides the
    heads, and as MQA: what sharing keys and values would save at this shape."""
    counts = [g for g in range(heads, 0, -1) if heads % g == 0]
    return [KVShape("this scenario", heads, g, d_head) for g in counts]
