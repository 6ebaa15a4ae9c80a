"""Render docs/benchmarks.md from the figures in benchmarks/results/*.json.

    python benchmarks/render.py

Each results file: {"title", "what", "command", "machine", "commits", "tables":
[{"caption", "columns", "rows"}], "notes"}.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
OUT = HERE.parent / "docs" / "benchmarks.md"

HEAD = """# Benchmarks

What the benchmark scripts measured, rendered from `benchmarks/results/*.json` by
`python benchmarks/render.py` (do not edit by hand). These machines are shared and
noisy: figures measured together (interleaved, in one run) compare; figures of different
runs, dates or machines do not. How to run them: [architecture](architecture.md#benchmarks).
"""


def machine_line(m: dict[str, Any]) -> str:
    cpu = m["cpu"]
    vector = ", ".join(cpu["vector"]) or "none listed"
    return (
        f"{cpu['model']}, {cpu['cores']} cores (vector: {vector}); Python {m['python']}, "
        f"NumPy {m['numpy']}; {m['date']}"
    )


def table(t: dict[str, Any]) -> str:
    lines = [f"**{t['caption']}**", "", "| " + " | ".join(t["columns"]) + " |"]
    lines.append("| " + " | ".join("---" for _ in t["columns"]) + " |")
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in t["rows"]]
    return "\n".join(lines)


def section(r: dict[str, Any]) -> str:
    parts = [f"## {r['title']}", "", r["what"], ""]
    parts.append(f"Machine: {machine_line(r['machine'])}.")
    if r.get("commits"):
        commits = ", ".join(f"{k} `{v}`" for k, v in r["commits"].items())
        parts.append(f"Commits: {commits}.")
    if r.get("command"):
        parts.append(f"Command: `{r['command']}`.")
    parts.append("")
    parts += [table(t) + "\n" for t in r["tables"]]
    parts += [note + "\n" for note in r.get("notes", [])]
    return "\n".join(parts)


def render() -> str:
    results = [json.loads(p.read_text("utf-8")) for p in sorted(RESULTS.glob("*.json"))]
    return "\n".join([HEAD, *(section(r) for r in results)]).rstrip() + "\n"


if __name__ == "__main__":
    OUT.write_text(render(), "utf-8")
    print(f"wrote {OUT}")
