"""Two checkouts' benchmark figures measured interleaved in one run, written as data.

    python benchmarks/before_after.py --before /path/to/old/checkout [--rounds 3]
        [--edits 20] [--out benchmarks/results/NAME.json] [--title ...]

Each round runs, for the checkout before and then this one (each with its own code on
PYTHONPATH and its own scripts): ``tests/perf/bench_ui.py`` at n = 512 (the default
layout, then each dock raised) and ``tests/perf/bench_engine.py`` at n = 1024. The table
gives the median over the rounds of each case's p50 and p95 (ms), and of compute()'s
ratio to the plain NumPy pass. This machine's speed drifts within minutes: only figures
of one run compare.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import commit, describe

HERE = Path(__file__).resolve().parents[1]
UI_LINE = re.compile(r"^(?P<case>.+): p50 (?P<p50>[\d.]+) ms, p95 (?P<p95>[\d.]+) ms")
ENGINE_LINE = re.compile(r"compute/plain (?P<ratio>[\d.]+)")
DOCKS = (None, "Mix", "Masks", "Heads", "Lines")


def run(checkout: Path, args: list[str]) -> str:
    """A script of the checkout, on its own code, offscreen; its standard output."""
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    env.pop("QT_QPA_PLATFORM", None)  # (the script picks its offscreen screen)
    done = subprocess.run(
        [sys.executable, *args], cwd=checkout, env=env, capture_output=True, text=True
    )
    if done.returncode:
        raise SystemExit(f"{checkout}: {' '.join(args)} failed:\n{done.stderr[-2000:]}")
    return done.stdout


def ui_round(checkout: Path, edits: int) -> dict[str, tuple[float, float]]:
    """case -> (p50, p95) of one round of bench_ui at n = 512, every dock."""
    found: dict[str, tuple[float, float]] = {}
    for dock in DOCKS:
        args = ["tests/perf/bench_ui.py", "--edits", str(edits), "--n", "512"]
        if dock is not None:
            args += ["--dock", dock, "--kinds", "X", "W_K"]
        for line in run(checkout, args).splitlines():
            m = UI_LINE.match(line)
            if m and (dock is None or "worked example" not in m["case"]):
                found[m["case"]] = (float(m["p50"]), float(m["p95"]))
    return found


def engine_round(checkout: Path) -> list[float]:
    """compute()'s time over the plain pass, plain then RoPE + GQA, at n = 1024."""
    out = run(checkout, ["tests/perf/bench_engine.py", "--n", "1024", "--repeats", "3"])
    return [float(m["ratio"]) for m in ENGINE_LINE.finditer(out)]


def median(values: list[float]) -> float:
    return round(statistics.median(values), 1 if max(values) > 2 else 2)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--before", type=Path, required=True)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--edits", type=int, default=20)
    p.add_argument("--out", type=Path, default=HERE / "benchmarks/results/before-after.json")
    p.add_argument("--title", default="Before and after")
    args = p.parse_args()
    checkouts = {"before": args.before.resolve(), "after": HERE}
    ui: dict[str, dict[str, list[tuple[float, float]]]] = {k: {} for k in checkouts}
    engine: dict[str, list[list[float]]] = {k: [] for k in checkouts}
    for r in range(args.rounds):
        for name, folder in checkouts.items():  # interleaved: before, after, before, …
            for case, figures in ui_round(folder, args.edits).items():
                ui[name].setdefault(case, []).append(figures)
            engine[name].append(engine_round(folder))
            print(f"round {r + 1}: {name} done", flush=True)
    rows = []
    for case in ui["after"]:
        if case not in ui["before"]:
            continue
        cells = [case]
        for name in checkouts:
            runs = ui[name][case]
            cells += [median([p50 for p50, _ in runs]), median([p95 for _, p95 in runs])]
        rows.append(cells)
    ratios = [
        [label, *(median([rnd[k] for rnd in engine[name]]) for name in checkouts)]
        for k, label in enumerate(("n = 1024, d_model 768, 12 heads", "the same, RoPE + GQA"))
    ]
    result = {
        "title": args.title,
        "what": (
            f"Edit to screen up to date in the window (offscreen, 1400 × 860), ms, medians "
            f"over {args.rounds} interleaved rounds of {args.edits} edits; with a dock "
            "raised, until it has drawn the whole layer. And compute()'s time over the "
            "plain NumPy pass (target ≤ 1.2)."
        ),
        "command": "python benchmarks/before_after.py --before <checkout>",
        "machine": describe(),
        "commits": {name: commit(folder) for name, folder in checkouts.items()},
        "tables": [
            {
                "caption": "Edit to screen up to date, n = 512 (target p95 ≤ 16 ms; with a "
                "dock raised ≤ 100 ms)",
                "columns": ["case", "before p50", "before p95", "after p50", "after p95"],
                "rows": rows,
            },
            {
                "caption": "compute() / plain NumPy pass",
                "columns": ["case", "before", "after"],
                "rows": ratios,
            },
        ],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n", "utf-8")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
