"""What a timing sweep found, and how it is written: table text, CSV and JSON.

``Record`` is one implementation at one n; ``Report`` holds the records with the device,
the config they ran with and the measured ceilings (matrix-multiply TFLOP/s for prefill,
copy bandwidth for decode). The table's columns come from ``table_headings`` and its
cells from ``table_cells``, used by the ``attnviz bench`` table and by the window's
table alike. Standard library only.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from attnviz.bench.config import Config
from attnviz.bench.devices import GEMM_SIZE


@dataclass
class Record:
    """One implementation at one n."""

    impl: str
    n: int
    status: str  # ok, oom, skipped: reason, unsupported: reason
    time_ms: float | None = None
    peak_bytes: int | None = None
    predicted_bytes: int = 0
    tflops: float | None = None
    share_of_gemm: float | None = None
    error: float | None = None  # max |output − float64 reference| at n = CHECK_N
    compile_ms: float | None = None  # flex: the first call at this n, compilation included
    gbps: float | None = None  # decode: bytes of K and V read per second, in 10⁹
    share_of_copy: float | None = None  # decode: gbps against the measured copy bandwidth


@dataclass
class Report:
    device: dict[str, Any]
    config: dict[str, Any]  # Config.to_dict() of the sweep that ran, its device resolved
    gemm_tflops: float
    records: list[Record] = field(default_factory=list)
    cancelled: bool = False
    notes: list[str] = field(default_factory=list)  # e.g. a float64 check skipped for memory
    copy_gbps: float = 0.0  # the decode phase's ceiling: measured copy bandwidth, GB/s

    def sweep_config(self) -> Config:
        """The Config these records were measured with (the plots' titles name it)."""
        return Config.from_dict(self.config)

    def to_dict(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "config": self.config,
            "gemm_tflops": self.gemm_tflops,
            "cancelled": self.cancelled,
            "notes": self.notes,
            "copy_gbps": self.copy_gbps,
            "records": [asdict(r) for r in self.records],
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], records: list[Record] | None = None) -> Report:
        """The report ``to_dict`` wrote; records given here replace those in d (the
        streamed summary leaves them out: they came one by one before it)."""
        if records is None:
            records = [Record(**r) for r in d.get("records", [])]
        return cls(
            device=dict(d["device"]),
            config=dict(d["config"]),
            gemm_tflops=d["gemm_tflops"],
            records=records,
            cancelled=bool(d.get("cancelled", False)),
            notes=list(d.get("notes", [])),
            copy_gbps=float(d.get("copy_gbps", 0.0)),
        )


# Formats ------------------------------------------------------------------------------

COLUMNS = [f.name for f in fields(Record)]  # CSV columns and JSON keys of a record
MISSING = "–"


def _number(v: float | None, digits: int = 3) -> str:
    return MISSING if v is None else f"{v:.{digits}g}"


def _ms(v: float | None) -> str:
    """Four significant digits, and whole milliseconds from 10 s on (no exponent)."""
    return MISSING if v is None else f"{v:.4g}" if v < 1e4 else f"{v:.0f}"


def _rate(v: float | None) -> str:
    """Three significant digits, and whole numbers from 1000 on (no exponent)."""
    return MISSING if v is None else f"{v:.3g}" if v < 1e3 else f"{v:.0f}"


def _mib(v: int | None) -> str:
    return MISSING if v is None else f"{v / 2**20:.1f}"


def _share(v: float | None) -> str:
    return MISSING if v is None else f"{100 * v:.0f}%"


CELLS: dict[str, Callable[[Record], str]] = {
    "impl": lambda r: r.impl,
    "n": lambda r: str(r.n),
    "time ms": lambda r: _ms(r.time_ms),
    "compile ms": lambda r: _ms(r.compile_ms),
    "peak MiB": lambda r: _mib(r.peak_bytes),
    "predicted MiB": lambda r: _mib(r.predicted_bytes),
    "TFLOP/s": lambda r: _number(r.tflops),
    "of GEMM": lambda r: _share(r.share_of_gemm),
    "GB/s": lambda r: _rate(r.gbps),
    "of copy": lambda r: _share(r.share_of_copy),
    "error": lambda r: _number(r.error, 2),
    "status": lambda r: r.status,
}
TABLE_HEADINGS = (
    "impl",
    "n",
    "time ms",
    "peak MiB",
    "predicted MiB",
    "TFLOP/s",
    "of GEMM",
    "error",
    "status",
)
DECODE_HEADINGS = (
    "impl", "n", "time ms", "peak MiB", "predicted MiB", "GB/s", "of copy", "error", "status",
)  # fmt: skip


def table_headings(config: Mapping[str, Any]) -> tuple[str, ...]:
    """The table's columns for a sweep's config (a report's ``config``): bandwidth for
    decode, TFLOP/s for prefill, and the compile time when flex is timed."""
    if config.get("phase") == "decode":
        return DECODE_HEADINGS
    if "flex" in config.get("impls", ()):
        return (*TABLE_HEADINGS[:3], "compile ms", *TABLE_HEADINGS[3:])
    return TABLE_HEADINGS


def table_cells(r: Record, headings: tuple[str, ...] = TABLE_HEADINGS) -> list[str]:
    """One record as the table shows it, one string per heading."""
    return [CELLS[h](r) for h in headings]


def heading(report: Report) -> str:
    """The device, torch and the ceiling, in one line."""
    dev = report.device
    device = f"{dev.get('name', dev['type'])} ({dev['type']}, torch {dev['torch']}); "
    if report.config.get("phase") == "decode":
        return device + f"copy bandwidth {_rate(report.copy_gbps)} GB/s (read + write)"
    dtype = report.config["dtype"]
    return device + f"measured matrix multiply {report.gemm_tflops:.3g} TFLOP/s ({dtype})"


def share_note(report: Report) -> tuple[str, str]:
    """What the share column ("of GEMM" or "of copy") divides by, as a short note and a
    longer explanation: why a kernel can pass 100 % of the measured GEMM."""
    if report.config.get("phase") == "decode":
        rate = f"{_rate(report.copy_gbps)} GB/s, " if report.copy_gbps else ""
        short = (
            f"of copy: GB/s of K and V read ÷ the copy bandwidth ({rate}a large tensor "
            "copied in memory, measured at the start of this run)."
        )
        return short, short
    device, dtype = report.config.get("device", "cpu"), report.config.get("dtype", "")
    size = GEMM_SIZE.get(device, GEMM_SIZE["cpu"])
    rate = f"{report.gemm_tflops:.3g} TFLOP/s, " if report.gemm_tflops else ""
    short = (
        f"of GEMM: TFLOP/s ÷ one plain {size} × {size} {dtype} matrix multiply ({rate}timed "
        "at the start of this run): a measured reference, not the hardware's peak, so a "
        "fused kernel can pass 100 %."
    )
    why = (
        "Why a kernel can exceed it: the attention's FLOPs are counted by convention, 4·d "
        "per (query, key) pair (Q Kᵀ and the weights times V), whatever the kernel runs to "
        "get there; a fused kernel (sdpa and its backends, flex) does those products in "
        "small blocks, a tile of queries against a tile of keys, that stay in cache, and "
        "the BLAS underneath (MKL or oneDNN on a CPU) can run them faster than the one "
        "large product; and the reference is timed once (the median of 5), so a machine "
        "busy at that moment makes it low."
    )
    return short, f"{short}\n\n{why}"


def as_table(report: Report) -> str:
    """The heading, the records in aligned columns (status left ragged), notes, cancelled."""
    headings = table_headings(report.config)
    rows = [list(headings)] + [table_cells(r, headings) for r in report.records]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    lines = [
        "  ".join(c.rjust(w) for c, w in zip(row[:-1], widths, strict=True)) + "  " + row[-1]
        for row in rows
    ]
    tail = ["(cancelled)"] if report.cancelled else []
    return "\n".join([heading(report), *lines, *report.notes, *tail]) + "\n"


def as_csv(report: Report) -> str:
    """One row per record, one column per Record field; a missing value is empty."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    for r in report.records:
        writer.writerow(asdict(r))
    return out.getvalue()


def as_json(report: Report) -> str:
    return json.dumps(report.to_dict(), indent=1) + "\n"


FORMATS = {"table": as_table, "csv": as_csv, "json": as_json}


def render(report: Report, fmt: str) -> str:
    """The report as "table", "csv" or "json" text."""
    return FORMATS[fmt](report)
