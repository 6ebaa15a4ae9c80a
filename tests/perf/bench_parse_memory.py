"""Peak memory and time of loading hostile scenario and CSV files (a script, not a test).

    python tests/perf/bench_parse_memory.py [--mib 256] [--csv-mib 64] [--src PATH]

Each file is written to a temporary folder and loaded in a fresh Python process, so the
peak resident memory (ru_maxrss, less the process's size after its imports) is the
load's alone. --src runs another checkout's attnviz (e.g. an older commit, for a
before/after comparison). Target: peak within 4× the file size plus 100 MB, time linear.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable

CHILD = """
import json, resource, sys, time
from attnviz.core.io import files
load = files.load_scenario if sys.argv[1].endswith(".attn.json") else files.load_matrix
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start = time.perf_counter()
try:
    load(sys.argv[1])
    outcome = "loaded"
except files.FileFormatError as e:
    outcome = str(e)
seconds = time.perf_counter() - start
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"seconds": seconds, "peak_mib": (peak - base) / 1024, "outcome": outcome}))
"""

HEAD = b'{"format": "attnviz-scenario", "version": 1, "tokens": ["a"], "X": ['


def write(path: str, size: int, head: bytes, unit: bytes, tail: bytes) -> None:
    """A file of about size bytes: head, unit repeated, tail."""
    count = max(0, (size - len(head) - len(tail)) // len(unit))
    block = unit * (2**20 // len(unit))
    with open(path, "wb") as f:
        f.write(head)
        for _ in range(count // (2**20 // len(unit))):
            f.write(block)
        f.write(unit * (count % (2**20 // len(unit))))
        f.write(tail)


def cases(mib: int, csv_mib: int) -> list[tuple[str, str, Callable[[str], None]]]:
    """(description, file name, writer) for each hostile file."""
    big, csv = mib * 2**20, csv_mib * 2**20
    return [
        (
            f"{mib} MiB scenario, X = [[],[],…]",
            "lists.attn.json",
            lambda p: write(p, big, HEAD, b"[],", b"[]]}"),
        ),
        (f"{mib} MiB scenario, [[[[…]]]]", "deep.attn.json", lambda p: nested(p, big)),
        (
            f"{csv_mib} MiB scenario, one row of 0.5",
            "numbers.attn.json",
            lambda p: write(p, csv, HEAD + b"[", b"0.5,", b"0.5]]}"),
        ),
        (
            f"{csv_mib} MiB scenario, rows of 2,048 × 0.5",
            "rows.attn.json",
            lambda p: write(p, csv, HEAD, b"[" + b"0.5," * 2047 + b"0.5],", b"[0.5]]}"),
        ),
        (
            f"{csv_mib} MiB CSV, one line of 0.5",
            "line.csv",
            lambda p: write(p, csv, b"", b"0.5,", b"0.5\n"),
        ),
        (
            f"{csv_mib} MiB CSV, lines of 12",
            "lines.csv",
            lambda p: write(p, csv, b"", b"12\n", b""),
        ),
    ]


def nested(path: str, size: int) -> None:
    """A file of size bytes: size/2 "[" then as many "]"."""
    with open(path, "wb") as f:
        for bracket in (b"[", b"]"):
            for _ in range(size // 2 // 2**20):
                f.write(bracket * 2**20)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--csv-mib", type=int, default=64)
    parser.add_argument("--src", default=os.path.join(os.path.dirname(__file__), "..", ".."))
    args = parser.parse_args()
    env = {**os.environ, "PYTHONPATH": os.path.abspath(args.src)}
    print(f"attnviz from {os.path.abspath(args.src)}")
    with tempfile.TemporaryDirectory() as folder:
        for what, name, writer in cases(args.mib, args.csv_mib):
            path = os.path.join(folder, name)
            writer(path)
            size = os.path.getsize(path) / 2**20
            run = subprocess.run(
                [sys.executable, "-c", CHILD, path],
                env=env,
                cwd=folder,
                capture_output=True,
                text=True,
            )
            os.unlink(path)
            if run.returncode:
                print(f"{what}: failed ({run.returncode}) {run.stderr.strip()[-300:]}")
                continue
            r = json.loads(run.stdout)
            print(
                f"{what}: {r['seconds']:6.2f} s, peak {r['peak_mib']:7.0f} MiB "
                f"({r['peak_mib'] / size:4.1f}× the file); {r['outcome'][:90]}"
            )


if __name__ == "__main__":
    main()
