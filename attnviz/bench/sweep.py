"""Long-sequence attention timing: dense attention against fused SDPA, its backends and flex.

``run(config)`` sweeps n over powers of two and returns records (never draws). It needs
only torch and the standard library, so that it runs on a GPU machine with nothing else.
The implementations are attnviz.bench.kernels', the arithmetic attnviz.bench.arithmetic's,
the device and its ceilings attnviz.bench.devices'.

Prefill times n queries against n keys (TFLOP/s and its share of the same-run GEMM
ceiling); decode times one new query against a cache of n keys and values (the bytes of K
and V read per second, and their share of the same-run copy bandwidth).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from functools import partial
from typing import Any

from attnviz.bench import devices, kernels
from attnviz.bench.arithmetic import (
    CHECK_N,
    attention_flops,
    has_mask,
    input_bytes,
    kv_bytes,
    predicted_bytes,
    query_rows,
    reference_bytes,
)
from attnviz.bench.config import FLEX, MAX_N, Config
from attnviz.bench.report import Record, Report

MEMORY_HEADROOM = 0.8  # never plan to use more than this share of the free memory


class Cancelled(Exception):
    """The caller asked the sweep to stop."""


# Inputs and one step ------------------------------------------------------------------------


def _inputs(c: Config, n: int, device: str, dtype: Any, seed: int = 0) -> tuple[Any, Any, Any]:
    """Q (b × h × r × d) and K, V (b × G × n × d), drawn in float32 on the CPU."""
    import torch

    g = torch.Generator(device="cpu").manual_seed(seed)
    shapes = [
        (c.batch, c.heads, query_rows(c, n), c.d_head),
        (c.batch, c.groups, n, c.d_head),
        (c.batch, c.groups, n, c.d_head),
    ]
    return tuple(
        torch.randn(shape, generator=g).to(device=device, dtype=dtype).requires_grad_(c.backward)
        for shape in shapes
    )  # type: ignore[return-value]


def _step(impl: str, q: Any, k: Any, v: Any, c: Config, mask: Any = None) -> None:
    out = kernels.call(impl, q, k, v, c.causal and c.phase == "prefill", mask)
    if c.backward:
        out.backward(out.detach())  # any upstream gradient of the right shape will do
        for t in (q, k, v):
            t.grad = None


# The float64 check ----------------------------------------------------------------------


def reference_keep(c: Config, n: int) -> Any:
    """The mask of a window or documents written out pair by pair from their
    definitions (not kernels' vectorised one, which it checks); None without one."""
    import torch

    if not has_mask(c):
        return None
    length = n // c.documents if c.documents else n

    def sees(i: int, j: int) -> bool:
        if i // length != j // length:
            return False
        if c.window:
            return i - c.window < j <= i
        return j <= i or not c.causal

    return torch.tensor([[sees(i, j) for j in range(n)] for i in range(n)])


def reference_error(impl: str, c: Config, device: str) -> float:
    """Max |impl − float64 reference| on the same inputs at n = CHECK_N (forward).

    The reference is torch's math backend in float64 on the CPU, K and V repeated to
    every head, the mask written out pair by pair: not the code being checked, so a
    mistake in either shows.
    """
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    dt = getattr(torch, c.dtype)
    q, k, v = (t.detach() for t in _inputs(c, CHECK_N, "cpu", torch.float64, seed=1))
    rk, rv = (t.repeat_interleave(c.heads // c.groups, dim=1) for t in (k, v))
    keep = reference_keep(c, CHECK_N)
    causal = c.causal and c.phase == "prefill" and keep is None
    with sdpa_kernel(SDPBackend.MATH):
        expected = F.scaled_dot_product_attention(q, rk, rv, attn_mask=keep, is_causal=causal)
    mask = kernels.mask_for(impl, c, CHECK_N, device)
    with torch.no_grad():
        got = kernels.call(impl, q.to(device, dt), k.to(device, dt), v.to(device, dt), causal, mask)
    return float((got.double().cpu() - expected).abs().max())


def memory_shortfall(need: dict[str, int]) -> str | None:
    """Why these bytes would not fit in the free memory (with headroom), or None."""
    for device, size in need.items():
        free = devices.free_bytes(device)
        if size > MEMORY_HEADROOM * free:
            kind = "CPU" if device == "cpu" else "GPU"
            return f"needs {size / 2**30:.1f} GiB of {kind} memory, {free / 2**30:.1f} GiB free"
    return None


def _checked(impl: str, c: Config, device: str) -> tuple[float | None, str]:
    """The float64 check's error, unless it would not fit in memory: then None and
    "skipped: why"; None and "unsupported: why" if the kernel refuses these inputs or
    flex cannot be compiled here."""
    short = memory_shortfall(reference_bytes(c, impl, device))
    if short:
        return None, f"skipped: {short}"
    try:
        return reference_error(impl, c, device), ""
    except Exception as e:
        if devices.is_oom(e):
            devices.release(device, after_oom=True)
            return None, "skipped: out of memory"
        if not isinstance(e, RuntimeError) and impl not in FLEX:
            raise
        return None, f"unsupported: {_failure(impl, e, device)}"


def _failure(impl: str, e: BaseException, device: str) -> str:
    """The reason an implementation failed, in one line."""
    detail = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
    if impl == "flex":
        return f"flex (torch.compile) on {device}: {detail}"
    if impl == "flex-eager":
        return f"flex-eager on {device}: {detail}"
    return f"no {impl} kernel for these inputs ({detail})"


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
    device = devices.resolve_device(config.device)
    if config.threads and device == "cpu":
        torch.set_num_threads(config.threads)
    dt = getattr(torch, config.dtype)
    sizes = config.sizes()
    total = len(sizes) * len(config.impls) + 1
    info = devices.describe_device(device)
    report = Report(info, config.to_dict() | {"device": device}, 0.0)
    report.notes += kernels.notes(config)
    decode = config.phase == "decode"
    step = 0

    def tell(message: str) -> None:
        if progress:
            progress(step, total, message)
        if cancelled and cancelled():
            raise Cancelled

    try:
        if decode:
            tell("measuring the copy bandwidth")
            report.copy_gbps = devices.copy_gbps(device)
        else:
            tell("timing the reference matrix multiply")
            report.gemm_tflops = devices.gemm_tflops(device, config.dtype)
        step += 1
        errors: dict[str, float | None] = {}
        failed_at: dict[str, str] = {}
        for impl in config.impls:
            tell(f"checking {impl} against float64" + (" (compiling)" if impl == "flex" else ""))
            reason = kernels.refusal(impl, config, device, dt)
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
                _shares(record, report)
                report.records.append(record)
                if on_record:
                    on_record(record)
                step += 1
        tell("done")
    except Cancelled:
        report.cancelled = True
    return report


def _shares(record: Record, report: Report) -> None:
    """A record's throughput against the ceilings its report measured."""
    if record.tflops is not None and report.gemm_tflops > 0:
        record.share_of_gemm = record.tflops / report.gemm_tflops
    if record.gbps is not None and report.copy_gbps > 0:
        record.share_of_copy = record.gbps / report.copy_gbps


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
    inputs = input_bytes(c, impl, n)
    free = devices.free_bytes(device)
    if n > MAX_N[device]:
        record.status = f"skipped: n above {MAX_N[device]} on {device}"
        return record
    if (predicted + inputs) > MEMORY_HEADROOM * free:
        need = (predicted + inputs) / 2**30
        record.status = f"skipped: needs {need:.1f} GiB, {free / 2**30:.1f} GiB free"
        return record
    q = k = v = mask = None
    try:
        q, k, v = _inputs(c, n, device, dt)
        mask = kernels.mask_for(impl, c, n, device)
        step = partial(_step, impl, q, k, v, c, mask)
        if impl == "flex":
            record.compile_ms = _first_call(step, device) * 1e3
        for _ in range(c.warmup):
            step()
        if device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        times = []
        for _ in range(c.repeats):
            tell(f"{impl} at n = {n}")
            times.append(devices.timed(step, device))
        seconds = statistics.median(times)
        record.time_ms = seconds * 1e3
        if device == "cuda":
            record.peak_bytes = int(torch.cuda.max_memory_allocated() - base)
        else:
            record.peak_bytes = devices.cpu_peak_bytes(step)
        record.tflops = attention_flops(c, n) / seconds / 1e12
        if c.phase == "decode":
            record.gbps = kv_bytes(c, n) / seconds / 1e9
    except Exception as e:
        if devices.is_oom(e):
            record.status = "oom"
            failed_at[impl] = f"skipped: out of memory at n = {n}"
        elif impl in FLEX:
            record.status = failed_at[impl] = f"unsupported: {_failure(impl, e, device)}"
            record.compile_ms = None
        else:
            raise
    finally:
        del q, k, v, mask
        devices.release(device, after_oom=record.status == "oom")
    return record


def _first_call(step: Callable[[], None], device: str) -> float:
    """Seconds of flex's first call at this n, compilation included: the compiler's caches
    are reset first, so that every n is compiled (as a new shape in a model would be)."""
    import torch

    reset = getattr(torch.compiler, "reset", None)
    if reset is not None:
        reset()
    return devices.timed(step, device)
