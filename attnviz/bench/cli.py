"""``attnviz bench``: time dense attention against fused SDPA over growing n.

Needs torch and the standard library only, so that it runs on a GPU machine that has
nothing else. A progress bar goes to stderr; the report to stdout or ``--out``.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, fields
from typing import NoReturn

from attnviz.bench.sweep import DTYPES, IMPLEMENTATIONS, Config, Record, Report, run

EXIT_USAGE = 2
COLUMNS = [f.name for f in fields(Record)]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        print(f"attnviz bench: {message}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


def _whole(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None


def _impls(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in IMPLEMENTATIONS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"{', '.join(unknown) or 'nothing'}: expected some of {','.join(IMPLEMENTATIONS)}"
        )
    return names


def build_parser() -> argparse.ArgumentParser:
    d = Config()
    p = _Parser(prog="attnviz bench", description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--dtype", choices=DTYPES, default=d.dtype)
    p.add_argument("--batch", type=_whole, default=d.batch)
    p.add_argument("--heads", type=_whole, default=d.heads)
    p.add_argument("--d-head", type=_whole, default=d.d_head)
    p.add_argument("--causal", action="store_true", help="mask future keys")
    p.add_argument("--backward", action="store_true", help="time forward + backward")
    p.add_argument("--min-n", type=_whole, default=d.min_n, help="a power of two")
    p.add_argument(
        "--max-n",
        type=_whole,
        default=None,
        help="a power of two (default: 4096 on a CPU, 65536 on a GPU)",
    )
    p.add_argument(
        "--impl",
        type=_impls,
        default=None,
        help=f"comma-separated: {','.join(IMPLEMENTATIONS)} (default: all)",
    )
    p.add_argument("--repeats", type=_whole, default=d.repeats)
    p.add_argument("--threads", type=_whole, default=0, help="CPU threads (default: torch's)")
    p.add_argument(
        "--format",
        choices=("table", "json", "csv", "jsonl"),
        default="table",
        help="jsonl streams progress and records as JSON lines while it runs (for programs)",
    )
    p.add_argument("--out", metavar="FILE", help="write the report here instead of stdout")
    p.add_argument(
        "--low-priority",
        action="store_true",
        help="run at a lower CPU priority (a window running the sweep stays responsive)",
    )
    return p


def config_from(args: argparse.Namespace, device: str) -> Config:
    max_n = args.max_n if args.max_n is not None else (65536 if device == "cuda" else 4096)
    return Config(
        device=device,
        dtype=args.dtype,
        batch=args.batch,
        heads=args.heads,
        d_head=args.d_head,
        causal=args.causal,
        backward=args.backward,
        min_n=args.min_n,
        max_n=max_n,
        impls=args.impl or IMPLEMENTATIONS,
        repeats=args.repeats,
        threads=args.threads,
    )


def out_problem(path: str) -> str | None:
    """Why the report could not be written to path, or None: checked before any timing."""
    if os.path.isdir(path):
        return "is a folder"
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.exists(folder):
        return f"the folder {folder} does not exist"
    if not os.path.isdir(folder):
        return f"{folder} is not a folder"
    try:
        if os.path.exists(path):
            with open(path, "a", encoding="utf-8"):  # opened, not changed
                pass
        else:
            with tempfile.TemporaryFile(dir=folder):
                pass
    except OSError as e:
        return f"cannot write there: {e.strerror or e}"
    return None


def progress_bar(step: int, total: int, message: str) -> None:
    width = 30
    done = int(width * step / max(total, 1))
    print(
        f"\r[{'#' * done}{'.' * (width - done)}] {step}/{total} {message:<40}",
        end="",
        file=sys.stderr,
    )
    if step >= total:
        print(file=sys.stderr)


def stream_line(kind: str) -> Callable[..., None]:
    """A callback that prints its arguments as one JSON line: {"progress": [...]} etc."""

    def emit(*args: object) -> None:
        value = asdict(args[0]) if kind == "record" else list(args)  # type: ignore[call-overload]
        print(json.dumps({kind: value}), flush=True)

    return emit


def _number(v: float | None, digits: int = 3) -> str:
    return "–" if v is None else f"{v:.{digits}g}"


def _mib(v: int | None) -> str:
    return "–" if v is None else f"{v / 2**20:.1f}"


def as_table(report: Report) -> str:
    dev = report.device
    head = (
        f"{dev.get('name', dev['type'])} ({dev['type']}, torch {dev['torch']}); "
        f"matrix-multiply ceiling {report.gemm_tflops:.3g} TFLOP/s ({report.config['dtype']})"
    )
    rows = [
        [
            "impl",
            "n",
            "time ms",
            "peak MiB",
            "predicted MiB",
            "TFLOP/s",
            "of GEMM",
            "error",
            "status",
        ]
    ]
    for r in report.records:
        share = "–" if r.share_of_gemm is None else f"{100 * r.share_of_gemm:.0f}%"
        rows.append(
            [
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
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    lines = [
        "  ".join(c.rjust(w) for c, w in zip(row[:-1], widths, strict=True)) + "  " + row[-1]
        for row in rows
    ]
    tail = ["(cancelled)"] if report.cancelled else []
    return "\n".join([head, *lines, *report.notes, *tail]) + "\n"


def as_csv(report: Report) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    for r in report.records:
        writer.writerow(asdict(r))
    return out.getvalue()


def render(report: Report, fmt: str) -> str:
    if fmt == "json":
        return json.dumps(report.to_dict(), indent=1) + "\n"
    return as_csv(report) if fmt == "csv" else as_table(report)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        import torch  # noqa: F401
    except ImportError:
        print("attnviz bench: needs PyTorch (pip install torch)", file=sys.stderr)
        return EXIT_USAGE
    from attnviz.bench.sweep import resolve_device

    try:
        device = resolve_device(args.device)
        config = config_from(args, device)
        config.check()
    except ValueError as e:
        print(f"attnviz bench: {e}", file=sys.stderr)
        return EXIT_USAGE
    stream = args.format == "jsonl"
    if stream and args.out:
        print("attnviz bench: --format jsonl streams to stdout; leave out --out", file=sys.stderr)
        return EXIT_USAGE
    problem = args.out and out_problem(args.out)
    if problem:
        print(f"attnviz bench: --out {args.out}: {problem}", file=sys.stderr)
        return EXIT_USAGE
    if args.low_priority and hasattr(os, "nice"):
        os.nice(10)
    try:
        report = run(
            config,
            progress=stream_line("progress") if stream else progress_bar,
            on_record=stream_line("record") if stream else None,
        )
    except KeyboardInterrupt:
        print("\nattnviz bench: interrupted", file=sys.stderr)
        return 130
    if stream:
        summary = report.to_dict()
        del summary["records"]  # already streamed
        print(json.dumps({"report": summary}), flush=True)
        return 0
    text = render(report, args.format)
    if args.out:
        try:
            with open(args.out, "w", encoding="utf-8") as f:
                f.write(text)
        except OSError as e:
            print(f"attnviz bench: --out {args.out}: {e.strerror or e}", file=sys.stderr)
            return EXIT_USAGE
        print(f"wrote {args.out}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0
