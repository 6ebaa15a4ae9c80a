"""The GPU sweep of the targets (a script, not a test): needs torch and a CUDA GPU only.

    python3 tests/perf/bench_attention_gpu.py [--quick]

bf16, 16 heads of 128, batch 1, causal off, every implementation, n from 1024 to 16384.
Writes JSON and three SVG plots under tests/perf/results/ named after the device, and
prints the targets: the best backend at n = 16384 at least 60% of the measured
matrix-multiply TFLOP/s, the default `sdpa` at least 40%, and `naive` against `sdpa`
peak memory at n = 8192 at least 40×.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a bare checkout

from attnviz.bench.plots import report_charts
from attnviz.bench.report import as_table
from attnviz.bench.sweep import Config, run
from attnviz.core.figures.chart import to_svg

RESULTS = Path(__file__).parent / "results"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="n up to 4096 and 2 repeats")
    args = p.parse_args()
    config = Config(device="cuda", dtype="bfloat16", heads=16, d_head=128, min_n=1024,
                    max_n=4096 if args.quick else 16384, impls=("naive", "sdpa", "flash",
                    "efficient", "cudnn", "math"), repeats=2 if args.quick else 5)  # fmt: skip
    try:
        report = run(config, progress=lambda s, t, m: print(f"[{s}/{t}] {m}", file=sys.stderr))
    except ValueError as e:
        raise SystemExit(f"bench_attention_gpu: {e}") from None
    print(as_table(report), end="")
    name = re.sub(r"[^A-Za-z0-9]+", "-", report.device.get("name", "gpu")).strip("-").lower()
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(report.to_dict(), indent=1), "utf-8")
    for key, chart in report_charts(report, detailed=True).items():
        (RESULTS / f"{name}-{key}.svg").write_text(to_svg(chart), "utf-8")
    got = {(r.impl, r.n): r for r in report.records}
    top = max(config.sizes())
    shares = {
        i: got[i, top].share_of_gemm
        for i in config.impls
        if got.get((i, top)) and got[i, top].share_of_gemm
    }
    if shares:
        best = max(shares, key=lambda i: shares[i])
        print(f"n={top}: best backend {best} at {100 * shares[best]:.0f}% of GEMM (target ≥ 60%)")
        if "sdpa" in shares:
            print(f"n={top}: default sdpa at {100 * shares['sdpa']:.0f}% of GEMM (target ≥ 40%)")
    mid = 8192 if 8192 in config.sizes() else top
    naive, sdpa = got.get(("naive", mid)), got.get(("sdpa", mid))
    if naive and sdpa and naive.peak_bytes and sdpa.peak_bytes:
        ratio = naive.peak_bytes / sdpa.peak_bytes
        print(f"n={mid}: naive peak memory {ratio:.0f}× sdpa's (target ≥ 40×)")
    print(f"wrote {RESULTS}/{name}.json and three plots", file=sys.stderr)


if __name__ == "__main__":
    main()
