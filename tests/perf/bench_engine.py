"""Time compute() against a bare NumPy einsum of the same maths (a script, not a test).

    python tests/perf/bench_engine.py [--n 1024] [--repeats 7]

Both run in this process, interleaved, on two GPT-2-small-sized scenarios (d_model 768,
12 heads of 64, causal, scaled): plain at n (default 1024), and with RoPE and 4
key/value heads shared by the 12 query heads (GQA) at n = 512. Each prints both medians
and the ratio. Target: compute() within 1.3× of the bare baseline.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np

from attnviz.core.maths.engine import compute
from attnviz.core.maths.scenario import Scenario, with_kv_heads
from attnviz.core.presets import random_scenario


def bare(s: Scenario) -> np.ndarray:
    """The same layer as plain einsums: Q, K, V, scaled scores, −∞ mask, softmax, W_O."""
    X = s.X
    Q = np.einsum("nd,hdk->hnk", X, s.W_Q, optimize=True)
    K = np.einsum("nd,hdk->hnk", X, s.W_K, optimize=True)
    V = np.einsum("nd,hdk->hnk", X, s.W_V, optimize=True)
    S = np.einsum("hik,hjk->hij", Q, K, optimize=True) / np.sqrt(Q.shape[2])
    S[:, np.triu(np.ones((s.n, s.n), dtype=bool), 1)] = -np.inf
    S -= S.max(axis=-1, keepdims=True)
    np.exp(S, out=S)
    S /= S.sum(axis=-1, keepdims=True)
    out = np.einsum("hij,hjk->hik", S, V, optimize=True)
    return out.transpose(1, 0, 2).reshape(s.n, -1) @ s.W_O


def bare_rope_gqa(s: Scenario) -> np.ndarray:
    """The same layer with RoPE (half pairs, base 10000) and GQA, as plain einsums."""
    X, H, G = s.X, s.n_heads, s.kv_heads
    Q = np.einsum("nd,hdk->hnk", X, s.W_Q, optimize=True)
    K = np.einsum("nd,gdk->gnk", X, s.W_K, optimize=True)
    V = np.einsum("nd,gdk->gnk", X, s.W_V, optimize=True)
    half = Q.shape[2] // 2
    theta = np.arange(s.n)[:, None] * 10000.0 ** (-np.arange(half) * 2.0 / Q.shape[2])
    cos, sin = np.cos(theta), np.sin(theta)

    def turn(A: np.ndarray) -> np.ndarray:
        a, b = A[..., :half], A[..., half:]
        return np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)

    Q, K = turn(Q), turn(K)
    group = np.arange(H) * G // H
    S = np.einsum("hik,hjk->hij", Q, K[group], optimize=True) / np.sqrt(Q.shape[2])
    S[:, np.triu(np.ones((s.n, s.n), dtype=bool), 1)] = -np.inf
    S -= S.max(axis=-1, keepdims=True)
    np.exp(S, out=S)
    S /= S.sum(axis=-1, keepdims=True)
    out = np.einsum("hij,hjk->hik", S, V[group], optimize=True)
    return out.transpose(1, 0, 2).reshape(s.n, -1) @ s.W_O


def time_case(
    label: str, s: Scenario, baseline: Callable[[Scenario], np.ndarray], repeats: int
) -> None:
    np.testing.assert_allclose(compute(s).final, baseline(s), atol=1e-10)  # same maths
    times: dict[str, list[float]] = {"compute": [], "bare": []}
    for _ in range(repeats):
        for name, fn in (("compute", compute), ("bare", baseline)):
            t0 = time.perf_counter()
            fn(s)
            times[name].append(time.perf_counter() - t0)
    c, b = statistics.median(times["compute"]), statistics.median(times["bare"])
    print(f"{label}, repeats={repeats}")
    print(
        f"compute() median {c * 1e3:.1f} ms; bare einsum median {b * 1e3:.1f} ms; ratio {c / b:.2f}"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=1024)
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args()
    plain = random_scenario(n=args.n, seed=0)
    time_case(f"n={args.n} d_model=768 heads=12 d_k=64", plain, bare, args.repeats)
    gqa = with_kv_heads(random_scenario(n=512, seed=0), 4).with_settings(positional="rope")
    label = "n=512 d_model=768 heads=12 over 4 KV heads, d_k=64, RoPE"
    time_case(label, gqa, bare_rope_gqa, args.repeats)


if __name__ == "__main__":
    main()
