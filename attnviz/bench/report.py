"""What a timing sweep found, and how it is written: table text, CSV and JSON.

``Record`` is one implementation at one n; ``Report`` holds the records with the device,
the config they ran with and the measured matrix-multiply ceiling. The table's cells come
from one function, ``table_cells``, used by the ``attnviz bench`` table and by the
window's table alike. Standard library only.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from attnviz.bench.config import Config


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


@dataclass
class Report:
    device: dict[str, Any]
    config: dict[str, Any]  # Config.to_dict() of the sweep that ran, its device resolved
    gemm_tflops: float
    records: list[Record] = field(default_factory=list)
    cancelled: bool = False
    notes: list[str] = field(default_factory=list)  # e.g. a float64 check skipped for memory

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
        )


# Formats ------------------------------------------------------------------------------

COLUMNS = [f.name for f in fields(Record)]  # CSV columns and JSON keys of a record
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
MISSING = "–"


def _number(v: float | None, digits: int = 3) -> str:
    return MISSING if v is None else f"{v:.{digits}g}"


def _mib(v: int | None) -> str:
    return MISSING if v is None else f"{v / 2**20:.1f}"


def table_cells(r: Record) -> list[str]:
    """One record as the table shows it, one string per heading of TABLE_HEADINGS."""
    share = MISSING if r.share_of_gemm is None else f"{100 * r.share_of_gemm:.0f}%"
    return [
        r.impl,
        str(r.n),
        _number(r.time_ms, 4),
        _mib(r.peak_bytes),
        _mib(r.predicted_bytes),
        _number(r.tflops),
        share,
        _number(r.error, 2),
        r.status,
    ]


def heading(report: Report) -> str:
    """The device, torch and the ceiling, in one line."""
    dev = report.device
    return (
        f"{dev.get('name', dev['type'])} ({dev['type']}, torch {dev['torch']}); "
        f"matrix-multiply ceiling {report.gemm_tflops:.3g} TFLOP/s ({report.config['dtype']})"
    )


def as_table(report: Report) -> str:
    """The heading, the records in aligned columns (status left ragged), notes, cancelled."""
    rows = [list(TABLE_HEADINGS)] + [table_cells(r) for r in report.records]
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
