"""Before the window: which packages Qt's xcb platform needs, named instead of Qt's abort."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from attnviz.ui.platform_check import missing_libraries, problem

LDD = """\tlinux-vdso.so.1 (0x00007ffd)
\tlibxcb-icccm.so.4 => not found
\tlibxcb.so.1 => /lib/x86_64-linux-gnu/libxcb.so.1 (0x00007f00)
\tlibxcb-keysyms.so.1 => not found
\tlibxcb-icccm.so.4 => not found
\tlibodd.so.7 => not found
"""


def fake_plugin() -> Path:
    return Path("/qt/plugins/platforms/libqxcb.so")


def test_the_missing_libraries_are_read_from_ldd_once_each():
    assert missing_libraries(LDD) == ["libxcb-icccm.so.4", "libxcb-keysyms.so.1", "libodd.so.7"]
    assert missing_libraries("") == []


def test_missing_libraries_are_named_with_the_packages_that_have_them():
    said = problem({"DISPLAY": ":0"}, "linux", fake_plugin, lambda _: LDD)
    assert "libxcb-icccm.so.4, libxcb-keysyms.so.1, libodd.so.7" in said
    assert said.endswith("sudo apt install libxcb-icccm4 libxcb-keysyms1 libodd.so.7")


def test_nothing_is_said_where_nothing_is_missing_or_qt_uses_another_platform():
    complete = "\tlibxcb.so.1 => /lib/libxcb.so.1 (0x1)\n"
    assert problem({"DISPLAY": ":0"}, "linux", fake_plugin, lambda _: complete) == ""
    for environ in ({"QT_QPA_PLATFORM": "offscreen"}, {"QT_QPA_PLATFORM": "wayland"}):
        assert problem(environ, "linux", fake_plugin, lambda _: LDD) == ""
    assert problem({}, "darwin", fake_plugin, lambda _: LDD) == ""
    assert problem({"DISPLAY": ":0"}, "linux", lambda: None, lambda _: LDD) == ""


def test_no_display_is_said_plainly():
    said = problem({"QT_QPA_PLATFORM": "xcb"}, "linux", fake_plugin, lambda _: "")
    assert "DISPLAY is not set" in said and "xvfb-run" in said


def test_the_window_command_says_it_and_exits_without_a_traceback():
    environ = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")}
    environ["QT_QPA_PLATFORM"] = "xcb"
    done = subprocess.run(
        [sys.executable, "-m", "attnviz"], env=environ, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1
    assert "no display" in done.stderr and "Traceback" not in done.stderr
