"""The device a sweep runs on: which one, its memory, its clocks and its two ceilings.

The ceilings are measured in the same run as the sweep: the square matrix-multiply
TFLOP/s (what prefill attention is compared with) and the copy bandwidth (what a decode
step, which reads the whole K and V cache, is compared with). torch and the standard
library only, imported lazily.
"""

from __future__ import annotations

import contextlib
import gc
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

from attnviz.bench import kernels
from attnviz.core.system import available_memory

COPY_BYTES = {"cpu": 256 * 2**20, "cuda": 1024 * 2**20}  # the tensor the copy moves
GEMM_SIZE = {"cpu": 2048, "cuda": 8192}  # the square matrices the reference multiplies


def resolve_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device: cuda was asked for, but torch sees no CUDA GPU")
    return device


def free_bytes(device: str) -> int:
    """Memory the sweep may still use: free GPU memory, or the OS's available memory."""
    import torch

    if device == "cuda":
        return int(torch.cuda.mem_get_info()[0])
    return available_memory() or 2**62  # unknown: no guard beyond out-of-memory errors


def describe_device(device: str) -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {"type": device, "torch": torch.__version__}
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        info.update(name=props.name, memory_bytes=int(props.total_memory))
    else:
        info.update(
            name=_cpu_name(), threads=torch.get_num_threads(), memory_bytes=free_bytes("cpu")
        )
    info["backends"] = available_backends(device)
    return info


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return os.uname().machine


def available_backends(device: str) -> list[str]:
    """The SDPA backends that run a tiny float32 problem on this device."""
    import torch

    q = torch.randn(1, 1, 8, 8, device=device)
    return [name for name in kernels.BACKENDS if kernels.probe(name, q, q, q, False) is None]


def cpu_peak_bytes(fn: Callable[[], None]) -> int:
    """Peak bytes that fn allocates through torch's CPU allocator, above what it held before.

    Why this measure on the CPU: torch keeps no peak counter there (CUDA has
    max_memory_allocated), and the process's resident memory misses tensors that reuse
    freed heap. The profiler records every allocation and free; their running sum in
    time order is the memory held, and its maximum is the peak. The per-allocation
    records sit in a private part of the profiler; where it is missing, the per-op
    totals stand in (they miss memory an op allocates and frees inside itself).
    """
    from torch.profiler import ProfilerActivity, profile

    with _quiet_stderr(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    try:
        raw = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
        steps = [(e.start_ns(), e.nbytes()) for e in raw]
    except AttributeError:
        steps = [(e.time_range.start, e.self_cpu_memory_usage) for e in prof.events()]
    held = peak = 0
    for _, change in sorted(steps):
        held += change
        peak = max(peak, held)
    return peak


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Silence the profiler's C++ start/stop lines, which no setting turns off."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def is_oom(e: BaseException) -> bool:
    import torch

    if isinstance(e, (MemoryError, torch.cuda.OutOfMemoryError)):
        return True
    text = str(e).lower()
    return isinstance(e, RuntimeError) and (
        "out of memory" in text or "can't allocate memory" in text
    )


def release(device: str, after_oom: bool = False) -> None:
    """Give memory back. A full garbage collection only after running out of memory:
    it holds the interpreter long enough to stall a window."""
    import torch

    if after_oom:
        gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def timed(fn: Callable[[], object], device: str) -> float:
    """Seconds one call takes: CUDA events on a GPU, the wall clock on a CPU."""
    import torch

    if device == "cuda":
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        fn()
        stop.record()
        torch.cuda.synchronize()
        return float(start.elapsed_time(stop)) / 1e3
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def gemm_tflops(device: str, dtype: str, repeats: int = 5) -> float:
    """The device's measured square matrix-multiply throughput for dtype: the median of
    repeats products of two GEMM_SIZE-square matrices (the reference "of GEMM" divides by)."""
    import torch

    size = GEMM_SIZE.get(device, GEMM_SIZE["cpu"])
    dt = getattr(torch, dtype)
    a = torch.randn(size, size, device=device).to(dt)
    b = torch.randn(size, size, device=device).to(dt)
    for _ in range(2):  # warm-up
        a @ b
    seconds = statistics.median(timed(lambda: a @ b, device) for _ in range(repeats))
    return 2 * size**3 / seconds / 1e12


def copy_gbps(device: str, repeats: int = 5, size: int | None = None) -> float:
    """The device's measured copy bandwidth in GB/s (10⁹ bytes a second): the best of
    repeats copies of a large tensor into one already allocated, counting the bytes read
    and the bytes written (as STREAM's copy does). Smaller where memory is short."""
    import torch

    size = size or COPY_BYTES.get(device, COPY_BYTES["cpu"])
    size = max(2**20, min(size, int(0.2 * free_bytes(device))))
    x = torch.ones(size // 4, device=device)
    y = torch.empty_like(x)
    y.copy_(x)  # touches every page of the destination before the timing
    seconds = min(timed(lambda: y.copy_(x), device) for _ in range(repeats))
    return 2 * x.numel() * 4 / seconds / 1e9
