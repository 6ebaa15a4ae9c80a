"""attnviz.show: blocks a script until the window closes; returns at once where Qt's event
loop runs already (a Qt program, or IPython after %gui qt). Each case runs in a fresh
interpreter, offscreen, with its settings and data in a temporary folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap


def run(tmp_path, code: str) -> dict:
    env = {
        **os.environ,
        "QT_QPA_PLATFORM": "offscreen",
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "XDG_DATA_HOME": str(tmp_path / "data"),
    }
    p = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=os.getcwd(),
        check=False,
    )
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.splitlines()[-1])


def test_show_from_a_script_blocks_until_the_window_closes(tmp_path):
    report = run(
        tmp_path,
        """
        import json, time
        from PySide6.QtCore import QTimer
        import attnviz
        from attnviz.api.window import qt_app
        app = qt_app()
        seen = {}
        def close():
            w = app.activeWindow() or next(
                w for w in app.topLevelWidgets() if type(w).__name__ == "MainWindow")
            seen["visible"] = w.isVisible()
            seen["tokens"] = list(w.doc.scenario.tokens)
            w.doc.undo_stack.setClean()
            w.close()
        QTimer.singleShot(500, close)
        s = attnviz.from_qkv([[1.0, 0.0]] * 3, [[1.0, 0.0]] * 3, [[0.5, 0.5]] * 3,
                             tokens=["x", "y", "z"])
        window = attnviz.show(s)
        print(json.dumps({**seen, "closed": not window.isVisible()}))
        """,
    )
    assert report == {"visible": True, "tokens": ["x", "y", "z"], "closed": True}


def test_show_returns_at_once_where_the_event_loop_runs(tmp_path):
    report = run(
        tmp_path,
        """
        import json
        from PySide6.QtCore import QTimer
        import attnviz
        from attnviz.api.window import qt_app
        app = qt_app()
        seen = {}
        def open_window():
            w = attnviz.show(attnviz.preset("llama-style"))  # inside the running loop
            seen["returned_visible"] = w.isVisible()
            seen["heads"] = w.doc.scenario.n_heads
            w.doc.undo_stack.setClean()
            QTimer.singleShot(200, w.close)
        QTimer.singleShot(0, open_window)
        app.exec()
        print(json.dumps(seen))
        """,
    )
    assert report == {"returned_visible": True, "heads": 4}
