"""Checks of an output path, made before any work: no command writes over what it reads,
over a file of another kind, into a model folder it imports, or into a folder it cannot
write."""

from __future__ import annotations

import os
from collections.abc import Sequence

from attnviz.core.io.files import not_regular

SCENARIO_SUFFIXES = (".attn.json", ".attn.npz")
IMAGE_SUFFIXES = (".png", ".svg")


def _inside(path: str, folder: str) -> bool:
    folder = os.path.realpath(folder)
    return os.path.commonpath([os.path.realpath(path), folder]) == folder


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:  # either is missing: not the same file
        return False


def output_problem(
    out: str,
    suffixes: Sequence[str],
    reads: Sequence[str] = (),
    folders: Sequence[str] = (),
) -> str | None:
    """Why out cannot be written, or None: its name must end with one of suffixes, its
    folder must exist and be writable, and it must be none of the files the command reads
    (reads) and lie in none of the folders it reads (folders)."""
    name = os.fsdecode(out)
    if not name.lower().endswith(tuple(suffixes)):
        return f"name it *{' or *'.join(suffixes)}"
    folder = os.path.dirname(os.path.abspath(name))
    if not os.path.isdir(folder):
        return f"there is no folder {folder}"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"the folder {folder} cannot be written"
    if os.path.exists(name) and not os.path.isfile(name):
        return f"it is {not_regular(os.stat(name).st_mode)}"
    for path in reads:
        if _same_file(name, path):
            return f"it is the file this command reads ({path})"
    for path in folders:
        if os.path.isdir(path) and _inside(name, path):
            return f"it is inside the folder this command reads ({path})"
    return None


def free_name(path: str) -> str:
    """path, or the first of path-2, path-3, … (before its suffix) that does not exist:
    a name the user did not give never replaces a file."""
    if not os.path.lexists(path):
        return path
    name = os.fsdecode(path)
    suffix = next((s for s in SCENARIO_SUFFIXES if name.lower().endswith(s)), "")
    stem = name[: len(name) - len(suffix)] if suffix else os.path.splitext(name)[0]
    suffix = suffix or os.path.splitext(name)[1]
    k = 2
    while os.path.lexists(f"{stem}-{k}{suffix}"):
        k += 1
    return f"{stem}-{k}{suffix}"
