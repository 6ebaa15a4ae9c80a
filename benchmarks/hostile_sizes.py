"""Time and peak memory of the hostile inputs that asked for huge sizes, before and after
they were bounded, written as data.

    python benchmarks/hostile_sizes.py --before /path/to/old/checkout
        [--limit-s 150] [--limit-gb 8] [--out benchmarks/results/NAME.json]

Each case runs as a process of its own on each checkout's code (PYTHONPATH), its output
thrown away; one that passes the time or memory limit is stopped, and its row says so.
The inputs are made once, here: an .attn.npz whose zip64 end record claims 4,000,000
members (and holds them: a 217 MiB index), an autosave whose X unpacks to 1 GiB, a tiny
GPT-2 checkpoint whose config claims 1,000,000 layers, and the largest documented
scenario (gpt2-small at n = 2048) for `tiles` with 1 × 1 blocks and `compute`.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import commit, describe

HERE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE / "tests"))


def zip64_claiming(path: Path, members: int) -> None:
    """A worked example's .attn.npz followed by an index of ``members`` entries that the
    zip64 end record names, while the classic record gives the real small counts."""
    from attnviz.core.io.files import save_scenario
    from attnviz.core.presets import worked_example

    save_scenario(path, worked_example())
    data = path.read_bytes()
    end = len(data) - 22
    real_entries, real_size, real_offset = struct.unpack_from("<HLL", data, end + 10)
    entry = struct.pack("<4s4B4HL2L5H2L", b"PK\x01\x02", 20, 3, 20, 0, 0, 0, 0, 0, 0, 0, 0,
                        1, 0, 0, 0, 0, 0, 0) + b"a"  # fmt: skip
    index = entry * members
    start = end  # the huge index goes where the end record was
    record = struct.pack(
        "<4sQHHIIQQQQ", b"PK\x06\x06", 44, 45, 45, 0, 0, members, members, len(index), start
    )
    locator = struct.pack("<4sIQI", b"PK\x06\x07", 0, start + len(index), 1)
    counts = struct.pack("<HLL", real_entries, real_size, real_offset)
    classic = data[end : end + 10] + counts + b"\0\0"
    path.write_bytes(data[:end] + index + record + locator + classic)


def million_layers(folder: Path) -> Path:
    from tiny_models import save_tiny

    save_tiny("gpt2", folder)
    config = json.loads((folder / "config.json").read_text())
    config["n_layer"] = 1_000_000
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def make_inputs(work: Path) -> None:
    zip64_claiming(work / "claims.attn.npz", 4_000_000)
    from hostile_files import write_snapshot_bomb

    write_snapshot_bomb(work / "autosave.npz", (32768, 4096))
    million_layers(work / "gpt2")


def cases(work: Path) -> list[tuple[str, list[str]]]:
    """(what, the arguments of python) of each case; the inputs made in another process,
    so that this one stays small (a child's peak memory counts its parent's before exec)."""
    subprocess.run([sys.executable, __file__, "--make", str(work)], check=True)
    npz, autosave, model = work / "claims.attn.npz", work / "autosave.npz", work / "gpt2"
    load = "from attnviz.core.io import files; import sys; files.{}(sys.argv[1])"
    gpt2 = ["--preset", "gpt2-small", "--n", "2048"]
    mib = {p: p.stat().st_size / 2**20 for p in (npz, autosave)}
    return [
        (f"zip64 record claiming 4,000,000 members ({mib[npz]:.0f} MiB .attn.npz)",
         ["-c", load.format("load_scenario"), str(npz)]),
        (f"autosave whose X unpacks to 1 GiB ({mib[autosave]:.1f} MiB file)",
         ["-c", load.format("load_snapshot"), str(autosave)]),
        ("tiles, gpt2-small n = 2048, 1 × 1 blocks, JSON",
         ["-m", "attnviz", "tiles", *gpt2, "--block-q", "1", "--block-k", "1", "--format", "json"]),
        ("import, config claiming 1,000,000 layers (the weights hold 3)",
         ["-m", "attnviz", "import", str(model), "--text", "the cat", "--out",
          str(work / "out.attn.json")]),
        ("compute, gpt2-small n = 2048, JSON",
         ["-m", "attnviz", "compute", *gpt2, "--format", "json"]),
        ("compute, gpt2-small n = 2048, text", ["-m", "attnviz", "compute", *gpt2]),
    ]  # fmt: skip


def rss(pid: int) -> int:
    """The process's resident memory now, in bytes (0 where /proc is not there)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            line = next(x for x in f if x.startswith("VmRSS:"))
        return int(line.split()[1]) * 1024
    except (OSError, StopIteration):
        return 0


def measure(checkout: Path, args: list[str], limit_s: float, limit_bytes: int) -> list[object]:
    """[seconds, peak MiB, outcome] of one run: its exit status, or where it was stopped."""
    env = {**os.environ, "PYTHONPATH": str(checkout), "HF_HUB_OFFLINE": "1"}
    started = time.perf_counter()
    child = subprocess.Popen([sys.executable, *args], cwd=checkout, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    stopped = ""
    while True:
        done, status, usage = os.wait4(child.pid, os.WNOHANG)  # its own rusage
        if done:
            break
        if not stopped and time.perf_counter() - started > limit_s:
            stopped = f"stopped after {limit_s:.0f} s"
        elif not stopped and rss(child.pid) > limit_bytes:
            stopped = f"stopped at {limit_bytes / 2**30:.0f} GiB"
        if stopped:
            os.kill(child.pid, signal.SIGKILL)
        time.sleep(0.05)
    child.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
    seconds = round(time.perf_counter() - started, 2)
    outcome = stopped or f"exit {child.returncode}"
    return [seconds, round(usage.ru_maxrss / 1024), outcome]  # ru_maxrss: KiB on Linux


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--before", type=Path)
    p.add_argument("--make", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--limit-s", type=float, default=150.0)
    p.add_argument("--limit-gb", type=float, default=8.0)
    p.add_argument("--out", type=Path, default=HERE / "benchmarks/results/hostile-sizes.json")
    p.add_argument("--title", default="Hostile sizes, before and after")
    args = p.parse_args()
    if args.make:
        return make_inputs(args.make)
    if args.before is None:
        p.error("--before is required")
    checkouts = {"before": args.before.resolve(), "after": HERE}
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for case, command in cases(Path(work)):
            cells: list[object] = [case]
            for name, folder in checkouts.items():
                cells += measure(folder, command, args.limit_s, int(args.limit_gb * 2**30))
                print(f"{case}: {name} {cells[-3:]}", flush=True)
            rows.append(cells)
    columns = ["case"] + [f"{k} {w}" for k in checkouts for w in ("s", "peak MiB", "outcome")]
    result = {
        "title": args.title,
        "what": (
            "Each case as a process of its own on each checkout's code, output thrown away: "
            "wall time, peak resident memory and how it ended (exit 1 or 2: refused with one "
            f"line; stopped: past {args.limit_s:.0f} s or {args.limit_gb:.0f} GiB). One run, "
            "cases one after another."
        ),
        "command": "python benchmarks/hostile_sizes.py --before <checkout>",
        "machine": describe(),
        "commits": {name: commit(folder) for name, folder in checkouts.items()},
        "tables": [{"caption": "Time and peak memory", "columns": columns, "rows": rows}],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n", "utf-8")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
