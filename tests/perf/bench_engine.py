"""Time compute() against a bare NumPy einsum of the same maths (a script, not a test).

    python tests/perf/bench_engine.py [--n 1024] [--repeats 7]

Both run in this process, interleaved, on the same GPT-2-small-sized scenario (d_model
768, 12 heads of 64, causal, scaled); the last line prints both medians and the ratio.
Target: compute() within 1.3× of the bare baseline.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from attnviz.core.maths.engine import compute
from attnviz.core.maths.scenario import Scenario
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=1024)
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args()
    s = random_scenario(n=args.n, seed=0)
    np.testing.assert_allclose(compute(s).final, bare(s), atol=1e-10)  # same maths
    times: dict[str, list[float]] = {"compute": [], "bare": []}
    for _ in range(args.repeats):
        for name, fn in (("compute", compute), ("bare", bare)):
            t0 = time.perf_counter()
            fn(s)
            times[name].append(time.perf_counter() - t0)
    c, b = statistics.median(times["compute"]), statistics.median(times["bare"])
    print(f"n={args.n} d_model=768 heads=12 d_k=64 repeats={args.repeats}")
    print(
        f"compute() median {c * 1e3:.1f} ms; bare einsum median {b * 1e3:.1f} ms; ratio {c / b:.2f}"
    )


if __name__ == "__main__":
    main()
