"""Every ```python block of docs/api.md runs, in order, in one fresh interpreter: offscreen,
in a temporary folder, with settings and data there too (the window never blocks: the
page opens it with block=False)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "api.md"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)

RUNNER = """
import json, sys
blocks = json.load(open(sys.argv[1], encoding="utf-8"))
namespace = {"__name__": "__main__"}
for i, code in enumerate(blocks):
    print(f"--- block {i + 1}", flush=True)
    exec(compile(code, f"docs/api.md block {i + 1}", "exec"), namespace)
print("ran", len(blocks))
"""


def test_every_python_block_of_the_api_page_runs(tmp_path):
    blocks = BLOCK.findall(PAGE.read_text("utf-8"))
    assert len(blocks) >= 8
    (tmp_path / "blocks.json").write_text(json.dumps(blocks), "utf-8")
    env = {
        **os.environ,
        "QT_QPA_PLATFORM": "offscreen",
        "HF_HUB_OFFLINE": "1",
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "XDG_DATA_HOME": str(tmp_path / "data"),
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    p = subprocess.run(
        [sys.executable, "-c", RUNNER, str(tmp_path / "blocks.json")],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp_path,
        check=False,
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert p.stdout.splitlines()[-1] == f"ran {len(blocks)}"
    for name in ("worked.attn.json", "weights-head2.svg", "weights-head2.png", "mha-head3.svg"):
        assert (tmp_path / name).stat().st_size > 0
