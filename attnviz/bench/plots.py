"""The three plots of a timing sweep as core charts: time, peak memory, and throughput
(TFLOP/s for prefill) or bandwidth (GB/s of K and V read, for decode).

The window shows them and exports them; the GPU script writes them: one definition.
``report_charts`` takes everything from the report, its titles from the config the
sweep ran with (never from settings changed since).
"""

from __future__ import annotations

from attnviz.bench.config import IMPLEMENTATIONS, Config
from attnviz.bench.report import Record, Report
from attnviz.core.figures.chart import PALETTE, Chart, Series, n_squared_guide

# One colour per implementation, whichever others a sweep has: sdpa is the same in every plot.
# The palette's last colour, yellow, is too faint for a line on white: eager flex, the
# eighth, is drawn in a dark mustard instead.
COLORS = dict(zip(IMPLEMENTATIONS, PALETTE, strict=False)) | {"flex-eager": "#9A6E00"}


def _order(impl: str) -> tuple[int, str]:
    known = impl in IMPLEMENTATIONS
    return (IMPLEMENTATIONS.index(impl) if known else len(IMPLEMENTATIONS), impl)


def report_charts(report: Report, detailed: bool = False) -> dict[str, Chart]:
    """The three plots of a report; detailed titles name the config the report ran with.
    Keys: "time", "memory", and "tflops" (prefill) or "bandwidth" (decode)."""
    ceiling = report.copy_gbps if report.config.get("phase") == "decode" else report.gemm_tflops
    return _charts(report.records, ceiling, report.sweep_config(), detailed)


def describe(config: Config) -> str:
    """What a detailed title says about the sweep: dtype, shape, mask, phase, backward."""
    what = f"{config.dtype}, batch {config.batch}, {config.heads} heads of {config.d_head}"
    if config.groups != config.heads:
        what += f" ({config.groups} KV head{'s' if config.groups > 1 else ''})"
    if config.phase == "decode":
        return what + ", decode"
    what += ", causal" if config.causal and not config.window else ""
    what += f", window {config.window}" if config.window else ""
    what += f", {config.documents} documents" if config.documents else ""
    return what + (", fwd+bwd" if config.backward else "")


def _charts(
    report_records: list[Record], ceiling: float, config: Config, detailed: bool = False
) -> dict[str, Chart]:
    """The three plots of records measured with config, as core charts; detailed titles
    name the config. ceiling: the GEMM TFLOP/s (prefill) or copy GB/s (decode)."""
    by_impl: dict[str, list[Record]] = {}
    for r in sorted(report_records, key=lambda r: (_order(r.impl), r.n)):
        by_impl.setdefault(r.impl, []).append(r)

    def series(value: str, scale: float = 1.0) -> list[Series]:
        out = []
        for impl, records in by_impl.items():
            ok = [r for r in records if getattr(r, value) is not None]
            if ok:
                ys = tuple(getattr(r, value) * scale for r in ok)
                out.append(Series(impl, tuple(r.n for r in ok), ys, color=COLORS.get(impl)))
        return out

    def guide(items: list[Series]) -> list[Series]:
        if not items or not items[0].xs:
            return []
        first = items[0]
        return [n_squared_guide(first.xs, first.xs[0], first.ys[0])]

    times, memory = series("time_ms"), series("peak_bytes", 1 / 2**20)
    what = describe(config)

    def title(name: str) -> str:
        return f"{name} ({what})" if detailed else name

    if config.phase == "decode":
        n = "cached keys n"
        return {
            "time": Chart(title("Time per decode step"), n, "ms", tuple(times)),
            "memory": Chart(title("Peak memory above inputs"), n, "MiB", tuple(memory)),
            "bandwidth": Chart(
                title("Bandwidth (K and V read)"),
                n,
                "GB/s",
                tuple(series("gbps")),
                log_y=False,
                hlines=(("copy bandwidth", ceiling),) if ceiling else (),
            ),
        }
    n = "sequence length n"
    return {
        "time": Chart(title("Time"), n, "ms", tuple(times + guide(times))),
        "memory": Chart(title("Peak memory above inputs"), n, "MiB", tuple(memory + guide(memory))),
        "tflops": Chart(
            title("Throughput"),
            n,
            "TFLOP/s",
            tuple(series("tflops")),
            log_y=False,
            hlines=(("measured GEMM", ceiling),) if ceiling else (),
        ),
    }
