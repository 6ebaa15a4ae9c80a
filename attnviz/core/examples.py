"""The example scenarios shipped under resources/examples/, found by name.

Their catalogue is ``resources/examples/README.md`` itself: a ``## section`` heading per
group, then for each example a ``### `file` — Title`` heading followed by one paragraph
that says what it shows. The window's gallery, ``attnviz examples`` and the tests all
read that one file, so what users read and what the program lists cannot drift apart.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path

from attnviz.assets import EXAMPLES, resource
from attnviz.core.io.names import quoted
from attnviz.core.maths.scenario import Scenario, ScenarioError

SUFFIXES = (".attn.json", ".attn.npz")
_ENTRY = re.compile(r"### `([^`]+)` — (.+)")


@dataclass(frozen=True)
class Example:
    """One example file and what the catalogue says about it."""

    name: str  # the file name without its suffix: what --example takes
    path: Path
    title: str
    summary: str  # one paragraph, as plain text
    section: str

    @property
    def stage(self) -> int | None:
        """The lesson stage an example named stage-N-… belongs to."""
        found = re.match(r"stage-(\d+)-", self.name)
        return int(found.group(1)) if found else None

    def load(self) -> Scenario:
        from attnviz.core.io.files import load_scenario

        return load_scenario(self.path)


def folder() -> Path:
    return resource(*EXAMPLES)


def name_of(file: str) -> str:
    """A file name without its scenario suffix."""
    for suffix in SUFFIXES:
        if file.endswith(suffix):
            return file[: -len(suffix)]
    return file


def parse_catalogue(text: str, where: Path) -> tuple[Example, ...]:
    """The examples a catalogue lists, in its order; its paragraphs become summaries."""
    out: list[Example] = []
    section = ""
    entry: tuple[str, str] | None = None  # (file, title) of the entry being read
    lines: list[str] = []

    def finish() -> None:
        if entry is not None:
            file, title = entry
            summary = " ".join(lines).replace("`", "")
            out.append(Example(name_of(file), where / file, title.strip(), summary, section))

    for line in [*text.splitlines(), "## end"]:
        if line.startswith("## ") or line.startswith("### "):
            finish()
            entry, lines = None, []
            if line.startswith("## "):
                section = line[3:].strip()
            else:
                found = _ENTRY.fullmatch(line.strip())
                if found is None:
                    raise ValueError(f"examples README: {line!r} is not ### `file` — Title")
                entry = (found.group(1), found.group(2))
        elif entry is not None and line.strip():
            lines.append(line.strip())
    return tuple(out)


@functools.cache
def examples() -> tuple[Example, ...]:
    """Every shipped example, in the catalogue's order."""
    where = folder()
    return parse_catalogue((where / "README.md").read_text(encoding="utf-8"), where)


def find(name: str) -> Example:
    """The example called name (its file name, with or without the suffix)."""
    wanted = name_of(name.strip())
    for example in examples():
        if example.name == wanted:
            return example
    names = ", ".join(e.name for e in examples())
    raise ScenarioError(f"there is no example {quoted(name)}; the examples are: {names}")
