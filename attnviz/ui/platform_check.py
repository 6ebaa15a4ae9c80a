"""Before the window opens: can Qt open one here? On a minimal Linux, Qt's xcb platform
plugin misses system libraries, and Qt aborts with a message that names none of them;
this names the Debian/Ubuntu packages to install instead. Imports no Qt."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

# The libraries Qt's xcb plugin loads, by the Debian/Ubuntu package that has each.
PACKAGES = {
    "libxcb-cursor.so.0": "libxcb-cursor0",
    "libxkbcommon-x11.so.0": "libxkbcommon-x11-0",
    "libxkbcommon.so.0": "libxkbcommon0",
    "libxcb-icccm.so.4": "libxcb-icccm4",
    "libxcb-keysyms.so.1": "libxcb-keysyms1",
    "libxcb-image.so.0": "libxcb-image0",
    "libxcb-render-util.so.0": "libxcb-render-util0",
    "libxcb-shape.so.0": "libxcb-shape0",
    "libxcb-randr.so.0": "libxcb-randr0",
    "libxcb-xinerama.so.0": "libxcb-xinerama0",
    "libxcb-xkb.so.1": "libxcb-xkb1",
    "libxcb-xfixes.so.0": "libxcb-xfixes0",
    "libxcb-shm.so.0": "libxcb-shm0",
    "libxcb-sync.so.1": "libxcb-sync1",
    "libxcb-render.so.0": "libxcb-render0",
    "libxcb-util.so.1": "libxcb-util1",
    "libxcb.so.1": "libxcb1",
    "libX11-xcb.so.1": "libx11-xcb1",
    "libX11.so.6": "libx11-6",
    "libEGL.so.1": "libegl1",
    "libGL.so.1": "libgl1",
    "libOpenGL.so.0": "libopengl0",
    "libfontconfig.so.1": "libfontconfig1",
    "libfreetype.so.6": "libfreetype6",
    "libdbus-1.so.3": "libdbus-1-3",
    "libglib-2.0.so.0": "libglib2.0-0",
}

Ldd = Callable[[Path], str]  # what `ldd` prints for a library


def _ldd(library: Path) -> str:
    tool = shutil.which("ldd")
    if tool is None:
        return ""
    done = subprocess.run([tool, str(library)], capture_output=True, text=True, timeout=10)
    return done.stdout


def xcb_plugin() -> Path | None:
    """Qt's xcb platform plugin as installed with PySide6, if it is."""
    import PySide6  # (the package alone, not its Qt modules)

    plugin = Path(PySide6.__file__).parent / "Qt" / "plugins" / "platforms" / "libqxcb.so"
    return plugin if plugin.exists() else None


def missing_libraries(ldd_output: str) -> list[str]:
    """The libraries ldd reports "not found", each once, in order."""
    missing: list[str] = []
    for line in ldd_output.splitlines():
        name, _, found = line.strip().partition(" => ")
        if found.strip() == "not found" and name not in missing:
            missing.append(name)
    return missing


def problem(
    environ: Mapping[str, str] = os.environ,
    platform: str = sys.platform,
    plugin: Callable[[], Path | None] = xcb_plugin,
    ldd: Ldd = _ldd,
) -> str:
    """Why Qt could not open a window here ('' when nothing is known to stop it)."""
    chosen = environ.get("QT_QPA_PLATFORM", "").split(":")[0]
    if not platform.startswith("linux") or chosen not in ("", "xcb"):
        return ""
    if chosen == "" and environ.get("WAYLAND_DISPLAY"):
        return ""  # (Qt may take Wayland there)
    if not environ.get("DISPLAY"):
        return (
            "attnviz: there is no display to open the window on (DISPLAY is not set).\n"
            "Run it on a desktop, or on a virtual one (xvfb-run attnviz); the commands "
            "(attnviz --help) need no display."
        )
    library = plugin()
    missing = missing_libraries(ldd(library)) if library is not None else []
    if not missing:
        return ""
    packages = [PACKAGES.get(name, name) for name in missing]
    return (
        f"attnviz: Qt cannot open a window: its xcb platform needs {', '.join(missing)}, "
        "which this system does not have.\n"
        f"On Debian or Ubuntu: sudo apt install {' '.join(packages)}"
    )
