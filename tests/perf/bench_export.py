"""Time and memory of heatmap exports at GPT-2-small sizes (a script, not a test).

    python tests/perf/bench_export.py [--n 2048] [--scale 2]

Computes the gpt2-small preset once (head 1; causal, and causal-zero for the masked
views), then writes every view as SVG and PNG, each in a fresh process so that its peak
memory is its own. Prints wall and CPU seconds, the process's peak RSS (and before the
export: Python, Qt and the spec) and the file size. Linux only (/proc).
Target at n = 2048: every export under 3 s and under 1 GB.
"""

from __future__ import annotations

import argparse
import os
import pickle
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def peak_mb() -> float:
    """This process's peak resident memory (VmHWM: its own, not inherited as ru_maxrss is)."""
    status = Path("/proc/self/status").read_text()
    return (
        int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM")))
        / 1024
    )


def one(spec_path: str, out: str, scale: float) -> None:
    """Write one figure; print seconds, peak RSS and size as one line."""
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtWidgets import QApplication

    from attnviz.ui.images import write_image

    with open(spec_path, "rb") as f:
        spec = pickle.load(f)
    _app = QApplication.instance() or QApplication(["bench"])
    before = peak_mb()
    wall, cpu = time.perf_counter(), time.process_time()
    write_image(spec, out, scale)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    peak = peak_mb()
    size = os.path.getsize(out) / 1e6
    print(f"{wall:6.2f} s {cpu:6.2f} s  {peak:6.0f} MB ({before:4.0f})  {size:7.2f} MB")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=2048)
    p.add_argument("--scale", type=float, default=2.0)
    p.add_argument("--one", nargs=2, metavar=("SPEC", "OUT"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        one(*args.one, args.scale)
        return

    from attnviz.core.figures.figure import VIEWS, spec_for
    from attnviz.core.maths.forward import compute
    from attnviz.core.presets import make_preset

    s = make_preset("gpt2-small", args.n, 0)
    with tempfile.TemporaryDirectory() as folder:
        jobs = []
        for mask in ("causal", "causal-zero"):
            r = compute(s.with_settings(mask=mask))
            for view in VIEWS if mask == "causal" else ("masked", "weights"):
                name = f"{mask}-{view}"
                path = Path(folder) / f"{name}.pkl"
                path.write_bytes(pickle.dumps(spec_for(r, view, 0)))
                jobs.append((name, path))
            del r
        print(f"n = {args.n}, scale {args.scale}: wall, CPU, peak RSS (before), file size")
        for name, path in jobs:
            for suffix in (".svg", ".png"):
                out = str(Path(folder) / f"{name}{suffix}")
                cmd = [sys.executable, __file__, "--one", str(path), out]
                run = subprocess.run(
                    [*cmd, "--scale", str(args.scale)], capture_output=True, text=True
                )
                line = run.stdout.strip() or run.stderr.strip().splitlines()[-1]
                print(f"{name:20s} {suffix:4s} {line}", flush=True)
        print("\nThe whole command (start, compute, write): wall, peak RSS")
        for view in VIEWS:
            for suffix in (".svg", ".png"):
                out = str(Path(folder) / f"cli-{view}{suffix}")
                cmd = ["export", "--preset", "gpt2-small", "--n", str(args.n), "--view", view]
                wall = time.perf_counter()
                run = subprocess.run(
                    [
                        "/usr/bin/time",
                        "-f",
                        "%M",
                        sys.executable,
                        "-m",
                        "attnviz",
                        *cmd,
                        "--out",
                        out,
                        "--scale",
                        str(args.scale),
                    ],
                    capture_output=True,
                    text=True,
                )
                wall = time.perf_counter() - wall
                peak = int(run.stderr.strip().splitlines()[-1]) / 1024 if not run.returncode else 0
                print(f"attnviz export --view {view:8s} {suffix:4s} {wall:6.2f} s {peak:6.0f} MB")


if __name__ == "__main__":
    main()
