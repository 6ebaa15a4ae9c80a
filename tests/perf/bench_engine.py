"""Time compute() against the plain NumPy forward pass of the same layer (a script, not a
test).

    python tests/perf/bench_engine.py [--n 1024 2048] [--repeats 5]

For each n, a GPT-2-small-sized scenario (d_model 768, 12 heads of 64, causal, scaled)
and the same with RoPE and 4 key/value heads shared by the 12 query heads (GQA). In one
run, interleaved: compute(); the plain forward pass (one fused X @ [W_Q | W_K | W_V]
matmul, batched Q @ Kᵀ, an in-place masked softmax, @ V, @ W_O); and, for reference, the
same maths as einsums. Prints the medians and compute()'s ratio to the plain pass, and
the peak memory of each (tracemalloc, which sees NumPy's buffers) against what the
scenario and one stored weights matrix (heads × n × n float64) need.
Targets: time ratio ≤ 1.2; compute()'s peak ≤ 2 × (scenario + weights matrix). And the
backward pass (every gradient of the default target loss, from compute()'s result): time
≤ 2.5 × compute()'s, peak memory ≤ 2 × compute()'s.
"""

from __future__ import annotations

import argparse
import statistics
import time
import tracemalloc
from collections.abc import Callable

import numpy as np

from attnviz.core.maths.forward import compute
from attnviz.core.maths.losses import Loss, gradients
from attnviz.core.maths.scenario import Scenario, with_kv_heads
from attnviz.core.presets import random_scenario

MiB = 2**20


def _turn(A: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """RoPE, half pairs, base 10000, on the last axis."""
    half = A.shape[-1] // 2
    theta = pos[:, None] * 10000.0 ** (-np.arange(half) * 2.0 / A.shape[-1])
    cos, sin = np.cos(theta), np.sin(theta)
    a, b = A[..., :half], A[..., half:]
    return np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)


def plain(s: Scenario) -> np.ndarray:
    """The layer as plain NumPy: fused QKV projection, batched scores, in-place softmax."""
    n, H, G, d = s.n, s.n_heads, s.kv_heads, s.d_k
    W = np.concatenate(
        [
            np.asarray(s.W_Q).transpose(1, 0, 2).reshape(s.d_model, H * d),
            np.asarray(s.W_K).transpose(1, 0, 2).reshape(s.d_model, G * d),
            np.asarray(s.W_V).transpose(1, 0, 2).reshape(s.d_model, G * d),
        ],
        axis=1,
    )
    QKV = s.X @ W
    Q = QKV[:, : H * d].reshape(n, H, d).transpose(1, 0, 2)
    K = QKV[:, H * d : (H + G) * d].reshape(n, G, d).transpose(1, 0, 2)
    V = QKV[:, (H + G) * d :].reshape(n, G, d).transpose(1, 0, 2)
    if s.settings.positional == "rope":
        Q, K = _turn(Q, np.arange(n)), _turn(K, np.arange(n))
    group = np.arange(H) * G // H
    S = Q @ K[group].transpose(0, 2, 1)
    S /= np.sqrt(d)
    np.copyto(S, -np.inf, where=np.triu(np.ones((n, n), dtype=bool), 1))
    S -= S.max(axis=-1, keepdims=True)
    np.exp(S, out=S)
    S /= S.sum(axis=-1, keepdims=True)
    out = S @ V[group]
    return out.transpose(1, 0, 2).reshape(n, -1) @ s.W_O


def einsums(s: Scenario) -> np.ndarray:
    """The same maths as einsums (for reference; not a target)."""
    H, G, n = s.n_heads, s.kv_heads, s.n
    Q = np.einsum("nd,hdk->hnk", s.X, np.asarray(s.W_Q), optimize=True)
    K = np.einsum("nd,gdk->gnk", s.X, np.asarray(s.W_K), optimize=True)
    V = np.einsum("nd,gdk->gnk", s.X, np.asarray(s.W_V), optimize=True)
    if s.settings.positional == "rope":
        Q, K = _turn(Q, np.arange(n)), _turn(K, np.arange(n))
    group = np.arange(H) * G // H
    S = np.einsum("hik,hjk->hij", Q, K[group], optimize=True) / np.sqrt(Q.shape[2])
    S[:, np.triu(np.ones((n, n), dtype=bool), 1)] = -np.inf
    S -= S.max(axis=-1, keepdims=True)
    np.exp(S, out=S)
    S /= S.sum(axis=-1, keepdims=True)
    out = np.einsum("hij,hjk->hik", S, V[group], optimize=True)
    return out.transpose(1, 0, 2).reshape(n, -1) @ s.W_O


def _final(fn: Callable[[Scenario], object], s: Scenario) -> np.ndarray:
    got = fn(s)
    return got if isinstance(got, np.ndarray) else got.final  # type: ignore[attr-defined]


def peak(fn: Callable[[Scenario], object], s: Scenario) -> float:
    """The most memory fn(s) held at once, beyond what was allocated before it, in MiB."""
    tracemalloc.start()
    tracemalloc.reset_peak()
    kept = fn(s)
    _, top = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    del kept
    return top / MiB


def time_case(label: str, s: Scenario, repeats: int) -> None:
    forward = compute(s)
    fns: dict[str, Callable[[Scenario], object]] = {
        "compute": compute,
        "plain": plain,
        "einsum": einsums,
        "backward": lambda s: gradients(s, Loss(), forward),  # from compute()'s result
    }
    want = _final(plain, s)
    for name in ("compute", "einsum"):
        np.testing.assert_allclose(_final(fns[name], s), want, atol=1e-10)  # the same maths
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn(s)
            times[name].append(time.perf_counter() - t0)
    med = {name: statistics.median(t) * 1e3 for name, t in times.items()}
    scenario = sum(a.nbytes for a in (s.X, s.W_Q, s.W_K, s.W_V, s.W_O)) / MiB
    weights = s.n_heads * s.n * s.m * 8 / MiB
    mem = {name: peak(fn, s) for name, fn in fns.items()}
    print(f"{label}, repeats={repeats}")
    print(
        f"  time: compute() {med['compute']:.1f} ms, plain {med['plain']:.1f} ms, "
        f"einsum {med['einsum']:.1f} ms; compute/plain {med['compute'] / med['plain']:.2f} "
        f"(target ≤ 1.2)"
    )
    print(
        f"  peak: compute() {mem['compute']:.0f} MiB, plain {mem['plain']:.0f} MiB, einsum "
        f"{mem['einsum']:.0f} MiB; scenario {scenario:.0f} MiB + weights matrix "
        f"{weights:.0f} MiB; compute/(scenario + weights) "
        f"{mem['compute'] / (scenario + weights):.2f} (target ≤ 2)"
    )
    print(
        f"  backward (every gradient, the target loss): {med['backward']:.1f} ms, "
        f"backward/compute {med['backward'] / med['compute']:.2f} (target ≤ 2.5); peak "
        f"{mem['backward']:.0f} MiB, backward/compute {mem['backward'] / mem['compute']:.2f} "
        "(target ≤ 2)"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, nargs="+", default=[1024, 2048])
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    for n in args.n:
        s = random_scenario(n=n, seed=0)
        time_case(f"n={n} d_model=768 heads=12 d_k=64, causal", s, args.repeats)
        gqa = with_kv_heads(s, 4).with_settings(positional="rope")
        time_case(f"n={n}, the same with RoPE and 4 key/value heads (GQA)", gqa, args.repeats)


if __name__ == "__main__":
    main()
