"""Every relative link and image in README.md and docs/ points at a file that exists (and
an anchor at a heading of it), and docs/benchmarks.md is what benchmarks/render.py makes
of the stored results."""

from __future__ import annotations

import re
import runpy
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def anchors(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation dropped, dashes."""
    found = set()
    for line in page.read_text("utf-8").splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            title = re.sub(r"[^\w\- ]", "", title)
            found.add(title.replace(" ", "-"))
    return found


def test_every_relative_link_and_image_resolves():
    broken = []
    for page in PAGES:
        for target in LINK.findall(page.read_text("utf-8")):
            if re.match(r"[a-z]+:", target):
                continue  # (http:, mailto:)
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            if not file.exists():
                broken.append(f"{page.name}: {target}")
            elif anchor and file.suffix == ".md" and anchor not in anchors(file):
                broken.append(f"{page.name}: {target} (no such heading)")
    assert not broken, broken
    assert len(PAGES) >= 7


def test_the_readme_is_a_front_door():
    text = (ROOT / "README.md").read_text("utf-8")
    assert len(text.splitlines()) <= 250
    assert "pip install torch==2.13.0 -e ." in text and "python -m pytest" in text


def test_the_benchmarks_page_is_rendered_from_the_stored_results():
    render = runpy.run_path(str(ROOT / "benchmarks" / "render.py"))["render"]
    assert (ROOT / "docs" / "benchmarks.md").read_text("utf-8") == render()
