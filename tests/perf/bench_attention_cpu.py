"""Dense against fused attention on this CPU (a script, not a test).

    python tests/perf/bench_attention_cpu.py [--targets | --kernels] [--threads T]

``--targets`` (fp32, 12 heads of 64, batch 1): prints the sweep, then the two target
ratios measured in this run: at n = 2048 `sdpa` is at least 3× faster than `naive`; at
n = 4096 the peak memory of `naive` is at least 20× that of `sdpa`.

``--kernels``: the timing cases of current models, side by side in one run (fp32, 12
query heads of 64 sharing 4 key/value heads, batch 1, one thread by default: on a
loaded two-core machine a second OpenMP thread waits for a core, milliseconds a call):
GQA causal prefill (naive, sdpa, compiled flex), the same with a causal sliding window of
256 keys (naive and sdpa given the dense mask, flex with its block mask, eager flex), and
decode (one new query against a cache of n; naive and sdpa) with the bandwidth achieved
against the copy bandwidth measured in the same run. Without a flag, both.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a bare checkout

from attnviz.bench.config import Config
from attnviz.bench.report import Report, as_table
from attnviz.bench.sweep import run


def targets() -> None:
    config = Config(device="cpu", dtype="float32", heads=12, d_head=64, min_n=512, max_n=4096,
                    impls=("naive", "sdpa"), repeats=3)  # fmt: skip
    report = run(config)
    print(as_table(report), end="")
    got = {(r.impl, r.n): r for r in report.records}
    naive, sdpa = got["naive", 2048], got["sdpa", 2048]
    assert naive.time_ms and sdpa.time_ms, "the n = 2048 timings are missing"
    speed = naive.time_ms / sdpa.time_ms
    big_naive, big_sdpa = got["naive", 4096], got["sdpa", 4096]
    assert big_naive.peak_bytes and big_sdpa.peak_bytes, "the n = 4096 memory figures are missing"
    memory = big_naive.peak_bytes / big_sdpa.peak_bytes
    verdict = {True: "ok", False: "MISSED"}
    print(f"n=2048: sdpa {speed:.1f}× faster than naive (target ≥ 3×): {verdict[speed >= 3]}")
    print(f"n=4096: naive peak memory {memory:.0f}× sdpa's (target ≥ 20×): {verdict[memory >= 20]}")


def kernels(threads: int) -> None:
    def case(**settings: Any) -> Config:
        shape: dict[str, Any] = dict(device="cpu", dtype="float32", heads=12, kv_heads=4,
                                     d_head=64, repeats=5, threads=threads)  # fmt: skip
        return Config(**(shape | settings))

    prefill = dict(min_n=512, max_n=4096)
    cases = {
        "GQA prefill, causal": case(causal=True, impls=("naive", "sdpa", "flex"), **prefill),
        "GQA prefill, causal window of 256": case(
            window=256, impls=("naive", "sdpa", "flex", "flex-eager"), **prefill
        ),
        "GQA decode": case(phase="decode", min_n=1024, max_n=32768, impls=("naive", "sdpa")),
    }
    reports: dict[str, Report] = {}
    for title, config in cases.items():
        print(f"== {title}", flush=True)
        reports[title] = run(config)
        print(as_table(reports[title]), end="", flush=True)
    window = {(r.impl, r.n): r for r in reports["GQA prefill, causal window of 256"].records}
    flex, sdpa = window.get(("flex", 4096)), window.get(("sdpa", 4096))
    if flex and sdpa and flex.time_ms and sdpa.time_ms:
        print(f"window n=4096: flex {flex.time_ms:.1f} ms (compiled in "
              f"{(flex.compile_ms or 0) / 1e3:.1f} s) against sdpa with the dense mask "
              f"{sdpa.time_ms:.1f} ms: {sdpa.time_ms / flex.time_ms:.1f}×")  # fmt: skip
    elif flex:
        print(f"window: flex {flex.status}")
    decode = reports["GQA decode"]
    for r in decode.records:
        if r.impl == "sdpa" and r.share_of_copy is not None:
            print(f"decode n={r.n}: sdpa {r.gbps:.2f} GB/s, {100 * r.share_of_copy:.0f}% of "
                  f"the copy bandwidth ({decode.copy_gbps:.1f} GB/s)")  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--targets", action="store_true", help="only the two CPU targets")
    p.add_argument("--kernels", action="store_true", help="only the GQA, window, decode cases")
    p.add_argument("--threads", type=int, default=1, help="for --kernels (default 1)")
    args = p.parse_args()
    both = not (args.targets or args.kernels)
    if args.targets or both:
        targets()
    if args.kernels or both:
        kernels(args.threads)


if __name__ == "__main__":
    main()
