"""Files shipped inside the package (found through importlib.resources, not the source tree)."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

APP_ID = "io.github.attnviz.attnviz"  # the reverse-DNS id: desktop file, metainfo, Qt


def path(name: str) -> Path:
    """A resource file's path (the package is installed as plain files, never zipped)."""
    return Path(str(files(__name__).joinpath(name)))
