"""Save and open a Llama-3-8B-shaped layer as .attn.npz (a script, not a test).

    python tests/perf/bench_open_large.py [--repeats 3] [--folder DIR]

One random attention layer of Llama-3-8B's shape: n = 16 tokens, d_model 4096, 32 query
heads sharing 8 key/value heads, d_k 128, RoPE, causal (W_Q 32×4096×128, W_K and W_V
8×4096×128, W_O 4096×4096: 336 MB of float64). Prints the median save time, the file
size, the median open time (target: under 2 s), where the open time goes (reading the
arrays, checking the scenario's values), the time of compute(), and of one cell edit of
W_Q followed by a result made from the one before (exact reuse: the edited head
projected again) and by a full compute.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from attnviz.core.io.files import load_scenario, save_scenario
from attnviz.core.maths.forward import compute
from attnviz.core.maths.reuse import Base, Plan
from attnviz.core.maths.scenario import Scenario, Settings, check_values

N, D_MODEL, HEADS, KV_HEADS, D_K = 16, 4096, 32, 8, 128


def llama_layer(seed: int = 0) -> Scenario:
    """Random weights scaled as at initialisation (so the scores stay moderate)."""
    rng = np.random.default_rng(seed)
    scale = D_MODEL**-0.5
    return Scenario(
        tokens=tuple(f"t{i}" for i in range(N)),
        X=rng.standard_normal((N, D_MODEL)),
        W_Q=rng.standard_normal((HEADS, D_MODEL, D_K)) * scale,
        W_K=rng.standard_normal((KV_HEADS, D_MODEL, D_K)) * scale,
        W_V=rng.standard_normal((KV_HEADS, D_MODEL, D_K)) * scale,
        W_O=rng.standard_normal((HEADS * D_K, D_MODEL)) * scale,
        settings=Settings(mask="causal", positional="rope", rope_base=500000.0),
    )


def timed(fn: Callable[[], Any], repeats: int) -> tuple[float, float, Any]:
    """The median and the best wall time of fn over repeats runs, and its last value."""
    times, value = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        value = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), min(times), value


def ms(median: float, best: float) -> str:
    return f"{median * 1e3:7.1f} ms (best {best * 1e3:.1f})"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--folder", help="where to write the file (default: a temporary folder)")
    args = p.parse_args()

    s = llama_layer()
    nbytes = sum(a.nbytes for a in s.arrays().values())
    print(
        f"n={N} d_model={D_MODEL} heads={HEADS} kv_heads={KV_HEADS} d_k={D_K}, RoPE, causal: "
        f"{nbytes / 1e6:.0f} MB of float64"
    )
    with tempfile.TemporaryDirectory(dir=args.folder) as folder:
        path = Path(folder) / "llama3-8b-layer.attn.npz"
        save, best, _ = timed(lambda: save_scenario(path, s), args.repeats)
        size = os.path.getsize(path)
        print(f"save  {save:6.3f} s (best {best:.3f}; median of {args.repeats}, fsync included)")
        print(f"file  {size / 1e6:6.1f} MB ({size / 2**20:.1f} MiB)")
        load, best, back = timed(lambda: load_scenario(path), args.repeats)
        verdict = "under" if load < 2.0 else "OVER"
        print(f"open  {load:6.3f} s (best {best:.3f}; target 2 s: {verdict})")
    exact = all(getattr(back, k).tobytes() == a.tobytes() for k, a in s.arrays().items())
    print(f"      round trip bit for bit: {exact}")

    def check_all() -> None:
        for name in ("X", "W_O", "b_O", "W_Q", "W_K", "W_V"):
            for block in np.atleast_3d(np.asarray(getattr(back, name))):
                check_values(name, block)

    checks, _, _ = timed(check_all, args.repeats)
    print(f"      of which checking every value (Scenario.__post_init__) about {checks:.3f} s")

    compute(back)  # warm up: the first run after a large read pays for page faults
    *full, result = timed(lambda: compute(back), args.repeats)
    print(f"compute(scenario)              {ms(*full)}")
    *edit, edited = timed(lambda: back.with_cells("W_Q", 0, 0, 0, np.array([[1.0]])), args.repeats)
    print(f"with_cells W_Q[1] (1 cell)     {ms(*edit)}")
    *inc, _ = timed(lambda: Plan(edited, Base(back, result)).result(), args.repeats)
    print(f"  then reuse (the window)      {ms(*inc)}")
    *again, _ = timed(lambda: compute(edited), args.repeats)
    print(f"  then compute                 {ms(*again)}")
    print(
        f"edit + reuse {(edit[0] + inc[0]) * 1e3:.0f} ms; "
        f"edit + compute {(edit[0] + again[0]) * 1e3:.0f} ms (medians)"
    )


if __name__ == "__main__":
    main()
