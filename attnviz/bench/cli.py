"""``attnviz bench``: time dense attention against fused SDPA and flex over growing n.

Needs torch and the standard library only, so that it runs on a GPU machine that has
nothing else. A progress bar goes to stderr; the report to stdout or ``--out``. The
sweep's flags are attnviz.bench.config's, the report's formats attnviz.bench.report's;
``--format jsonl`` streams {"progress": [step, total, message]}, {"record": {…}} and, at
the end, {"report": {…}} without its records, one JSON object a line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import NoReturn

from attnviz.bench.config import add_config_arguments, config_from_namespace
from attnviz.bench.devices import resolve_device
from attnviz.bench.report import render
from attnviz.bench.sweep import run

EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        print(f"attnviz bench: {message}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


def build_parser() -> argparse.ArgumentParser:
    """The sweep's flags (attnviz.bench.config), then where and how the report goes."""
    p = _Parser(prog="attnviz bench", description=__doc__.splitlines()[0])
    add_config_arguments(p)
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


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        import torch  # noqa: F401
    except ImportError:
        print("attnviz bench: needs PyTorch (pip install torch)", file=sys.stderr)
        return EXIT_USAGE
    try:
        device = resolve_device(args.device)
        config = config_from_namespace(args, device)
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
