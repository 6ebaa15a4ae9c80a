"""The GPU sweeps of the targets (a script, not a test): needs torch and a CUDA GPU only.

    python3 tests/perf/bench_attention_gpu.py [--quick] [--case CASE ...] [--device cuda]
                                              [--out FOLDER]

bf16, 16 heads of 128, batch 1. Four cases, each written as JSON and SVG plots under
tests/perf/results/ named after the device and the case:

- ``target``: causal off, every SDPA backend and naive, n from 1024 to 16384: the best
  backend at n = 16384 at least 60% of the same-run matrix-multiply TFLOP/s, the default
  ``sdpa`` at least 40%, ``naive`` against ``sdpa`` peak memory at n = 8192 at least 40×;
- ``gqa``: the same with 4 key/value heads (SDPA's enable_gqa; naive repeats K and V);
- ``window``: causal sliding window of 1024 keys, ``flex`` (compiled, its compile time
  apart) against SDPA given the dense mask, and ``sdpa`` plain causal as the reference;
- ``decode``: one new query against a cache of n = 1024 … 131072 keys, 16 heads and 4
  key/value heads, naive and every SDPA backend: at n = 32768 the best at least 60% of
  the same-run copy bandwidth.

``--device cpu`` runs the same code paths on the CPU at small sizes (to check the script
where there is no GPU); its figures are not the targets'.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a bare checkout

from attnviz.bench.config import Config
from attnviz.bench.plots import report_charts
from attnviz.bench.report import Record, Report, as_table
from attnviz.bench.sweep import run
from attnviz.core.figures.chart import to_svg

RESULTS = Path(__file__).parent / "results"
SDPA = ("sdpa", "flash", "efficient", "cudnn", "math")
CASES = ("target", "gqa", "window", "decode")


def configs(device: str, quick: bool) -> dict[str, Config]:
    """Each case's sweep; on the CPU the same cases at sizes a CPU finishes."""
    gpu = device == "cuda"
    top = (4096 if quick else 16384) if gpu else 1024
    low = 1024 if gpu else 256
    shape = dict(device=device, dtype="bfloat16" if gpu else "float32", heads=16, d_head=128,
                 min_n=low, max_n=top, repeats=2 if quick else 5)  # fmt: skip
    return {
        "target": Config(**shape, impls=("naive", *SDPA)),  # type: ignore[arg-type]
        "gqa": Config(**shape, kv_heads=4, impls=("naive", *SDPA)),  # type: ignore[arg-type]
        "window": Config(
            **shape,  # type: ignore[arg-type]
            causal=True,
            window=1024 if gpu else 128,
            impls=("naive", "sdpa", "efficient", "flex"),
        ),
        "decode": Config(
            **shape | {"max_n": (32768 if quick else 131072) if gpu else 16384},  # type: ignore[arg-type]
            kv_heads=4,
            phase="decode",
            impls=("naive", *SDPA),
        ),
    }


def write(report: Report, folder: Path, name: str, case: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}-{case}.json").write_text(json.dumps(report.to_dict(), indent=1), "utf-8")
    for key, chart in report_charts(report, detailed=True).items():
        (folder / f"{name}-{case}-{key}.svg").write_text(to_svg(chart), "utf-8")


def shares_at(
    got: dict[tuple[str, int], Record], impls: tuple[str, ...], n: int, field: str
) -> dict[str, float]:
    """Each implementation's share of a ceiling at n, where it was measured."""
    found = {i: getattr(got[i, n], field) for i in impls if (i, n) in got}
    return {i: float(share) for i, share in found.items() if share}


def verdicts(case: str, report: Report, config: Config) -> list[str]:
    """The target lines this case can say something about."""
    got = {(r.impl, r.n): r for r in report.records}
    top, lines = max(config.sizes()), []
    if case in ("target", "gqa"):
        shares = shares_at(got, config.impls, top, "share_of_gemm")
        if shares:
            best = max(shares, key=lambda i: shares[i])
            lines.append(f"{case} n={top}: best {best} at {100 * shares[best]:.0f}% of GEMM"
                         " (target ≥ 60%)")  # fmt: skip
            if "sdpa" in shares:
                lines.append(f"{case} n={top}: default sdpa at {100 * shares['sdpa']:.0f}% of GEMM"
                             " (target ≥ 40%)")  # fmt: skip
        mid = 8192 if 8192 in config.sizes() else top
        naive, sdpa = got.get(("naive", mid)), got.get(("sdpa", mid))
        if naive and sdpa and naive.peak_bytes and sdpa.peak_bytes:
            ratio = naive.peak_bytes / sdpa.peak_bytes
            lines.append(f"{case} n={mid}: naive peak memory {ratio:.0f}× sdpa's (target ≥ 40×)")
    if case == "window":
        for impl in ("flex", "sdpa", "efficient"):
            r = got.get((impl, top))
            if r and r.time_ms:
                compiled = f", compiled in {r.compile_ms / 1e3:.1f} s" if r.compile_ms else ""
                lines.append(f"window n={top}: {impl} {r.time_ms:.3g} ms, "
                             f"{r.tflops:.3g} TFLOP/s{compiled}")  # fmt: skip
    if case == "decode":
        n = 32768 if 32768 in config.sizes() else top
        shares = shares_at(got, config.impls, n, "share_of_copy")
        if shares:
            best = max(shares, key=lambda i: shares[i])
            lines.append(f"decode n={n}: best {best} at {100 * shares[best]:.0f}% of copy "
                         f"bandwidth ({report.copy_gbps:.0f} GB/s) (target ≥ 60%)")  # fmt: skip
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="smaller n and 2 repeats")
    p.add_argument("--case", choices=CASES, action="append", help="default: every case")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--out", type=Path, default=RESULTS, help=f"default: {RESULTS}")
    args = p.parse_args()
    cases = configs(args.device, args.quick)
    summary: list[str] = []
    for case in args.case or CASES:
        config = cases[case]
        print(f"== {case}", flush=True)
        try:
            report = run(config, progress=lambda s, t, m: print(f"[{s}/{t}] {m}", file=sys.stderr))
        except ValueError as e:
            raise SystemExit(f"bench_attention_gpu: {e}") from None
        print(as_table(report), end="", flush=True)
        name = re.sub(r"[^A-Za-z0-9]+", "-", report.device.get("name", "gpu")).strip("-").lower()
        write(report, args.out, name, case)
        summary += verdicts(case, report, config)
        print(f"wrote {args.out}/{name}-{case}.json and its plots", file=sys.stderr)
    print("\n".join(summary))


if __name__ == "__main__":
    main()
