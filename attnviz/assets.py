"""The files under the top-level ``resources/`` folder, wherever attnviz is installed.

setup.py installs that folder as the package ``attnviz.resources``; it is found through
``importlib.resources``, so a wheel, an editable install and a frozen build all work.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

APP_ID = "io.github.attnviz.attnviz"  # the reverse-DNS id: desktop file, metainfo, Qt
ICON_SVG = ("icons", "hicolor", "scalable", "apps", f"{APP_ID}.svg")
EXAMPLES = ("examples",)


def resource(*parts: str) -> Path:
    """The path of a file or folder under resources/ (installed as plain files, never
    zipped)."""
    where = files("attnviz.resources")
    for part in parts:
        where = where / part
    return Path(str(where))
