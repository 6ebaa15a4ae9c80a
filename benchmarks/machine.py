"""What a benchmark ran on: the CPU and its vector extensions, the versions, the commit."""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

VECTOR_FLAGS = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "amx_tile")


def cpu() -> dict[str, Any]:
    """The CPU's model, cores and vector extensions (from /proc/cpuinfo on Linux)."""
    model, flags = platform.processor() or platform.machine(), set()
    info = Path("/proc/cpuinfo")
    if info.exists():
        for line in info.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
    return {
        "model": model,
        "cores": os.cpu_count(),
        "vector": [flag for flag in VECTOR_FLAGS if flag in flags],
    }


def commit(folder: Path) -> str:
    """The checkout's commit (short), with + when it has uncommitted changes."""

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=folder, capture_output=True, text=True)
        return done.stdout.strip()

    return git("rev-parse", "--short", "HEAD") + ("+" if git("status", "--porcelain") else "")


def describe() -> dict[str, Any]:
    """The machine and the versions, and the date (UTC)."""
    import numpy

    return {
        "cpu": cpu(),
        "python": platform.python_version(),
        "numpy": numpy.__version__,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }
