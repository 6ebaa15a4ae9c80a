"""Long-sequence attention timing: dense attention against fused SDPA and its backends.

``run(config)`` sweeps n over powers of two and returns records (never draws). It needs
only torch and the standard library, so that it runs on a GPU machine with nothing else.

Implementations: ``naive`` (Q Kᵀ, scale, −∞ mask, softmax, · V: the n × n matrix is
stored), ``sdpa`` (torch's default dispatch) and ``flash``, ``efficient``, ``cudnn``,
``math`` (one SDPA backend each, forced with ``torch.nn.attention.sdpa_kernel``).

FLOPs follow FlashAttention's convention: 4·b·h·n²·d for the forward pass, half of it
with a causal mask, and 2.5 times the forward for the backward pass.
"""

from __future__ import annotations

import contextlib
import gc
import math
import os
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

from attnviz.bench.config import MAX_N, Config
from attnviz.bench.report import Record, Report
from attnviz.core.system import available_memory

BACKENDS = {
    "flash": "FLASH_ATTENTION",
    "efficient": "EFFICIENT_ATTENTION",
    "cudnn": "CUDNN_ATTENTION",
    "math": "MATH",
}
BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}
CHECK_N = 128  # the size at which every implementation is compared with float64
MEMORY_HEADROOM = 0.8  # never plan to use more than this share of the free memory


class Cancelled(Exception):
    """The caller asked the sweep to stop."""


# Arithmetic ---------------------------------------------------------------------------


def attention_flops(c: Config, n: int) -> float:
    """FlashAttention's count: 4·b·h·n²·d forward (half if causal), backward 2.5× that."""
    forward = 4 * c.batch * c.heads * n * n * c.d_head / (2 if c.causal else 1)
    return forward * (3.5 if c.backward else 1.0)


def predicted_bytes(c: Config, impl: str, n: int) -> int:
    """Memory above the inputs that the implementation needs, by formula.

    Dense attention (naive, and the math backend) holds the b·h·n² scores and their
    softmax at once (two n × n matrices), plus the output; with backward, autograd keeps
    both and the gradient of each. Fused kernels hold the output and per-row statistics
    (b·h·n) only, plus the input gradients with backward; their small per-thread scratch
    buffers are not counted. ``sdpa`` is predicted as fused.
    """
    size = BYTES[c.dtype]
    rows = c.batch * c.heads * n
    out = rows * c.d_head * size
    if impl in ("naive", "math"):
        squares = 2 * rows * n * size * (2 if c.backward else 1)
        return squares + out * (4 if c.backward else 1)
    return out * (4 if c.backward else 1) + rows * 4


# Devices and memory ---------------------------------------------------------------------


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
    return [name for name in BACKENDS if _unsupported(name, q, q, q, False) is None]


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


# Implementations ------------------------------------------------------------------------


def naive(q: Any, k: Any, v: Any, causal: bool) -> Any:
    """The brief's explicit attention: the n × n scores are materialised."""
    import torch

    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        n = q.shape[-2]
        future = torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(future, -math.inf)
    return torch.softmax(scores, dim=-1) @ v


def _call(impl: str, q: Any, k: Any, v: Any, causal: bool) -> Any:
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if impl == "naive":
        return naive(q, k, v, causal)
    if impl == "sdpa":
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    with sdpa_kernel(getattr(SDPBackend, BACKENDS[impl])):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def _unsupported(impl: str, q: Any, k: Any, v: Any, causal: bool) -> str | None:
    """None if impl runs on these inputs, else why not (torch's own words where it has any)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            _call(impl, q, k, v, causal)
            return None
        except RuntimeError as e:
            said = [str(w.message).strip().splitlines()[0][:160] for w in caught]
            dtype = str(q.dtype).removeprefix("torch.")
            reason = f"no {impl} kernel for {dtype} on {q.device.type}"
            if said:
                return f"{reason} ({said[0]})"
            return reason if "No viable backend" in str(e) else f"{reason} ({str(e)[:160]})"


def _is_oom(e: BaseException) -> bool:
    import torch

    if isinstance(e, (MemoryError, torch.cuda.OutOfMemoryError)):
        return True
    text = str(e).lower()
    return isinstance(e, RuntimeError) and (
        "out of memory" in text or "can't allocate memory" in text
    )


def _release(device: str, after_oom: bool = False) -> None:
    """Give memory back. A full garbage collection only after running out of memory:
    it holds the interpreter long enough to stall a window."""
    import torch

    if after_oom:
        gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


# Timing ---------------------------------------------------------------------------------


def _inputs(c: Config, n: int, device: str, dtype: Any, seed: int = 0) -> tuple[Any, Any, Any]:
    import torch

    g = torch.Generator(device="cpu").manual_seed(seed)
    shape = (c.batch, c.heads, n, c.d_head)
    return tuple(
        torch.randn(shape, generator=g).to(device=device, dtype=dtype).requires_grad_(c.backward)
        for _ in range(3)
    )  # type: ignore[return-value]


def _step(impl: str, q: Any, k: Any, v: Any, c: Config) -> None:
    out = _call(impl, q, k, v, c.causal)
    if c.backward:
        out.backward(out.detach())  # any upstream gradient of the right shape will do
        for t in (q, k, v):
            t.grad = None


def _timed(fn: Callable[[], object], device: str) -> float:
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
    """The device's measured square matrix-multiply throughput for dtype (the ceiling)."""
    import torch

    size = 8192 if device == "cuda" else 2048
    dt = getattr(torch, dtype)
    a = torch.randn(size, size, device=device).to(dt)
    b = torch.randn(size, size, device=device).to(dt)
    for _ in range(2):  # warm-up
        a @ b
    seconds = statistics.median(_timed(lambda: a @ b, device) for _ in range(repeats))
    return 2 * size**3 / seconds / 1e12


def reference_bytes(c: Config, impl: str, device: str) -> dict[str, int]:
    """Memory the float64 check at n = CHECK_N may need, per device ("cpu", and "cuda").

    An upper bound (everything it allocates, as if held at once; the measured peak is
    about half): on the CPU, the float32 draws and float64 copies of Q, K, V (12 bytes a
    value), the reference's scores and softmax (two b·h·n² float64 matrices), its output,
    the checked output and their difference; on the device, Q, K, V in the sweep's dtype
    and what the implementation itself needs at CHECK_N.
    """
    rows = c.batch * c.heads * CHECK_N
    cpu = rows * c.d_head * (3 * 12 + 5 * 8) + 2 * rows * CHECK_N * 8
    here = 3 * rows * c.d_head * BYTES[c.dtype] + predicted_bytes(c, impl, CHECK_N)
    if device == "cpu":
        return {"cpu": cpu + here}
    return {"cpu": cpu, device: here}


def memory_shortfall(need: dict[str, int]) -> str | None:
    """Why these bytes would not fit in the free memory (with headroom), or None."""
    for device, size in need.items():
        free = free_bytes(device)
        if size > MEMORY_HEADROOM * free:
            kind = "CPU" if device == "cpu" else "GPU"
            return f"needs {size / 2**30:.1f} GiB of {kind} memory, {free / 2**30:.1f} GiB free"
    return None


def reference_error(impl: str, c: Config, device: str) -> float:
    """Max |impl − float64 reference| on the same inputs at n = CHECK_N (forward).

    The reference is torch's math backend in float64 on the CPU: not the naive code
    being checked, so a mistake in either shows.
    """
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    dt = getattr(torch, c.dtype)
    q, k, v = (t.detach() for t in _inputs(c, CHECK_N, "cpu", torch.float64, seed=1))
    with sdpa_kernel(SDPBackend.MATH):
        expected = F.scaled_dot_product_attention(q, k, v, is_causal=c.causal)
    with torch.no_grad():
        got = _call(impl, q.to(device, dt), k.to(device, dt), v.to(device, dt), c.causal)
    return float((got.double().cpu() - expected).abs().max())


# The sweep ------------------------------------------------------------------------------


Progress = Callable[[int, int, str], None]


def run(
    config: Config,
    progress: Progress | None = None,
    cancelled: Callable[[], bool] | None = None,
    on_record: Callable[[Record], None] | None = None,
) -> Report:
    """Time every implementation at every n; returns the report (partial if cancelled)."""
    import torch

    config.check()
    device = resolve_device(config.device)
    if config.threads and device == "cpu":
        torch.set_num_threads(config.threads)
    dt = getattr(torch, config.dtype)
    sizes = config.sizes()
    total = len(sizes) * len(config.impls) + 1
    report = Report(describe_device(device), config.to_dict() | {"device": device}, 0.0)
    step = 0

    def tell(message: str) -> None:
        if progress:
            progress(step, total, message)
        if cancelled and cancelled():
            raise Cancelled

    try:
        tell("measuring the matrix-multiply ceiling")
        report.gemm_tflops = gemm_tflops(device, config.dtype)
        step += 1
        errors: dict[str, float | None] = {}
        failed_at: dict[str, str] = {}
        for impl in config.impls:
            # Probed at the sweep's head size and dtype: kernels refuse some of them.
            q = torch.randn(1, 1, 16, config.d_head, device=device, dtype=dt)
            reason = _unsupported(impl, q, q, q, config.causal)
            errors[impl], why = (
                (None, f"unsupported: {reason}") if reason else _checked(impl, config, device)
            )
            if why.startswith("skipped: "):
                report.notes.append(f"{impl}: float64 check at n = {CHECK_N} {why}")
            elif why:
                failed_at[impl] = why
        for n in sizes:
            for impl in config.impls:
                tell(f"{impl} at n = {n}")
                record = _measure(impl, n, config, device, dt, failed_at, tell)
                record.error = errors[impl]
                if record.tflops is not None and report.gemm_tflops > 0:
                    record.share_of_gemm = record.tflops / report.gemm_tflops
                report.records.append(record)
                if on_record:
                    on_record(record)
                step += 1
        tell("done")
    except Cancelled:
        report.cancelled = True
    return report


def _checked(impl: str, c: Config, device: str) -> tuple[float | None, str]:
    """The float64 check's error, unless it would not fit in memory: then None and
    "skipped: why"; None and "unsupported: why" if the kernel refuses these inputs."""
    short = memory_shortfall(reference_bytes(c, impl, device))
    if short:
        return None, f"skipped: {short}"
    try:
        return reference_error(impl, c, device), ""
    except (RuntimeError, MemoryError) as e:
        if _is_oom(e):
            _release(device, after_oom=True)
            return None, "skipped: out of memory"
        detail = str(e).splitlines()[0][:160]
        return None, f"unsupported: no {impl} kernel for these inputs ({detail})"


def _measure(
    impl: str,
    n: int,
    c: Config,
    device: str,
    dt: Any,
    failed_at: dict[str, str],
    tell: Callable[[str], None],
) -> Record:
    import torch

    predicted = predicted_bytes(c, impl, n)
    record = Record(impl, n, "ok", predicted_bytes=predicted)
    if impl in failed_at:
        record.status = failed_at[impl]
        return record
    inputs_bytes = 3 * c.batch * c.heads * n * c.d_head * BYTES[c.dtype]
    free = free_bytes(device)
    if n > MAX_N[device]:
        record.status = f"skipped: n above {MAX_N[device]} on {device}"
        return record
    if (predicted + inputs_bytes) > MEMORY_HEADROOM * free:
        need = (predicted + inputs_bytes) / 2**30
        record.status = f"skipped: needs {need:.1f} GiB, {free / 2**30:.1f} GiB free"
        return record
    q = k = v = None
    try:
        q, k, v = _inputs(c, n, device, dt)
        for _ in range(c.warmup):
            _step(impl, q, k, v, c)
        if device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        times = []
        for _ in range(c.repeats):
            tell(f"{impl} at n = {n}")
            times.append(_timed(partial(_step, impl, q, k, v, c), device))
        seconds = statistics.median(times)
        record.time_ms = seconds * 1e3
        if device == "cuda":
            record.peak_bytes = int(torch.cuda.max_memory_allocated() - base)
        else:
            record.peak_bytes = cpu_peak_bytes(partial(_step, impl, q, k, v, c))
        record.tflops = attention_flops(c, n) / seconds / 1e12
    except Exception as e:
        if not _is_oom(e):
            raise
        record.status = "oom"
        failed_at[impl] = f"skipped: out of memory at n = {n}"
    finally:
        del q, k, v
        _release(device, after_oom=record.status == "oom")
    return record
