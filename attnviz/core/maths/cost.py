"""What attention costs: score counts, score memory, FLOPs and KV-cache size."""

from __future__ import annotations

from dataclasses import dataclass

BYTES_PER = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2}


@dataclass(frozen=True)
class Cost:
    """Cost of one attention layer over n tokens (batch of 1).

    - ``scores``: n² per head, h·n² in all;
    - ``flops``: 4·n²·d_k per head (Q Kᵀ and weights·V, two FLOPs per multiply-add),
      half of it under a causal mask (FlashAttention's convention);
    - ``kv_cache``: 2·n·h·d_k numbers per layer (K and V for every head), which is the
      brief's 2·n·d_model when h·d_k = d_model.
    """

    n: int
    heads: int
    d_k: int
    causal: bool = False

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
        return 2 * self.n * self.heads * self.d_k

    def kv_cache_bytes(self, dtype: str = "float32") -> int:
        return self.kv_cache_numbers * BYTES_PER[dtype]


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
