"""Dense against fused attention on this CPU (a script, not a test).

    python tests/perf/bench_attention_cpu.py

fp32, 12 heads of 64, batch 1. Prints the sweep, then the two target ratios measured in
this run: at n = 2048 `sdpa` is at least 3× faster than `naive`; at n = 4096 the peak
memory of `naive` is at least 20× that of `sdpa`.
"""

from __future__ import annotations

from attnviz.bench.report import as_table
from attnviz.bench.sweep import Config, run


def main() -> None:
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


if __name__ == "__main__":
    main()
