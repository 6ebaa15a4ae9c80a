"""The core and the CLI work without Qt and torch; only ``--check`` imports torch.

Each test runs a fresh interpreter, so nothing imported by other tests can hide an import.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap

import numpy as np

MODEL_LIBRARIES = ("transformers", "tokenizers", "huggingface_hub", "safetensors")
HEAVY = ("torch", "PySide6", "pyqtgraph", "shiboken6", *MODEL_LIBRARIES)
CORE_MODULES = {
    "attnviz.core.io.codegen",
    "attnviz.core.figures.colors",
    "attnviz.core.maths.compare",
    "attnviz.core.maths.cost",
    "attnviz.core.maths.experiments",
    "attnviz.core.figures.figure",
    "attnviz.core.maths.kvcache",
    "attnviz.core.lessons",
    "attnviz.core.io.text",
    "attnviz.core.maths.forward",
    "attnviz.core.maths.reuse",
    "attnviz.core.maths.streaming",
    "attnviz.core.maths.changes",
    "attnviz.core.maths.head_stack",
    "attnviz.core.scheduler",
    "attnviz.core.figures.tiled_pass",
    "attnviz.core.maths.explain",
    "attnviz.core.io.files",
    "attnviz.core.io.checks",
    "attnviz.core.io.json_files",
    "attnviz.core.io.npz_files",
    "attnviz.core.io.provenance_files",
    "attnviz.core.io.scenario_document",
    "attnviz.core.presets",
    "attnviz.core.maths.scenario",
    "attnviz.core.maths.torch_engine",
    "attnviz.core.figures.chart",
    "attnviz.core.figures.lines",
    "attnviz.core.system",
    "attnviz.core.session",
    "attnviz.core.models.hf_layer",
    "attnviz.core.models.families",
    "attnviz.core.models.families.bert",
    "attnviz.core.models.families.gpt2",
    "attnviz.core.models.families.llama",
    "attnviz.core.models.importer",
    "attnviz.core.provenance",
    "attnviz.core.models.sources",
    "attnviz.core.models.tokens",
    "attnviz.bench.cli",
    "attnviz.bench.plots",
    "attnviz.bench.sweep",
}

# The worked example's head 1 and the last row's weights, typed from the brief.
X = np.array(
    [
        [0.90, 0.10, -0.30, 0.20],
        [0.20, 0.80, 0.40, -0.50],
        [-0.40, 0.10, 0.90, 0.30],
        [0.30, -0.60, 0.20, 0.80],
    ]
)
W_Q1 = np.array([[0.1, 0.3], [0.7, -0.9], [0.3, -0.7], [-0.9, 0.7]])
W_K1 = np.array([[0.9, -0.9], [0.6, -0.3], [-0.9, 0.7], [0.2, -0.4]])


def head1_causal_weights() -> np.ndarray:
    s = (X @ W_Q1) @ (X @ W_K1).T / math.sqrt(2)
    s[np.triu_indices(4, k=1)] = -np.inf
    e = np.exp(s - s.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def run_python(code: str) -> dict:
    """Run code in a fresh interpreter; it prints one JSON object as its last line."""
    p = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert p.returncode == 0, p.stderr
    assert "Traceback" not in p.stderr
    return json.loads(p.stdout.splitlines()[-1])


IMPORT_ALL = """
import contextlib, importlib, io, json, pkgutil, sys
import attnviz, attnviz.bench, attnviz.cli, attnviz.core
core = sorted(
    m.name
    for package in (attnviz.core, attnviz.bench)
    for m in pkgutil.walk_packages(package.__path__, package.__name__ + ".")
)
for name in core:
    importlib.import_module(name)
"""


def test_cli_and_core_import_neither_qt_nor_torch():
    report = run_python(
        IMPORT_ALL
        + """
import importlib.util
from attnviz.cli import main
rcs, outs = [], []
for argv in (
    ["compute"],
    ["compute", "--format", "json", "--mask", "causal-zero"],
    ["presets"],
    ["explain", "--head", "1", "--matrix", "weights", "--row", "cat", "--col", "she"],
):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rcs.append(main(argv))
    outs.append(out.getvalue())
heavy = ("torch", "PySide6", "pyqtgraph", "shiboken6", "transformers", "tokenizers",
         "huggingface_hub", "safetensors")
print(json.dumps({
    "core": core,
    "rcs": rcs,
    "loaded": sorted(m for m in sys.modules if m.split(".")[0] in heavy),
    "installed": [m for m in heavy if importlib.util.find_spec(m) is not None],
    "explain": outs[-1].splitlines()[-1],
}))
"""
    )
    assert set(report["core"]) >= CORE_MODULES
    assert report["rcs"] == [0, 0, 0, 0]
    assert report["loaded"] == []
    # the check means something only where torch is there to be imported
    assert "torch" in report["installed"] and "transformers" in report["installed"]
    # explain ran for real: weight of "she" for query "cat", head 1
    assert report["explain"].startswith("  value = ")
    value = float(report["explain"].split("=")[1])
    assert math.isclose(value, head1_causal_weights()[3, 0], rel_tol=5.01e-6)


def test_core_works_with_qt_and_torch_blocked():
    report = run_python(
        """
import importlib.abc, sys

BLOCKED = {"PySide6", "pyqtgraph", "shiboken6", "torch", "transformers", "tokenizers",
           "huggingface_hub", "safetensors"}

class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{name} is blocked in this test")
        return None

sys.meta_path.insert(0, Blocker())
blocked = []
for name in sorted(BLOCKED):
    try:
        __import__(name)
    except ImportError:
        blocked.append(name)
"""
        + IMPORT_ALL
        + """
from attnviz.core.maths.forward import compute
from attnviz.core.presets import worked_example
from attnviz.cli import main
r = compute(worked_example())
out = io.StringIO()
with contextlib.redirect_stdout(out):
    rc = main(["compute", "--format", "json", "--no-scale"])
print(json.dumps({
    "blocked": blocked,
    "core": core,
    "weights": r.weights[0].tolist(),
    "final_shape": list(r.final.shape),
    "rc": rc,
    "cli_heads": len(json.loads(out.getvalue())["heads"]),
}))
"""
    )
    assert report["blocked"] == sorted(HEAVY)
    assert set(report["core"]) >= CORE_MODULES
    np.testing.assert_allclose(report["weights"], head1_causal_weights(), rtol=0, atol=1e-12)
    assert report["final_shape"] == [4, 4]
    assert report["rc"] == 0 and report["cli_heads"] == 2


def test_check_imports_torch_and_agrees_with_numpy():
    report = run_python(
        """
import contextlib, io, json, sys
from attnviz.cli import main
before = "torch" in sys.modules
runs = {}
for name, argv in {
    "json": ["compute", "--check", "--format", "json"],
    "text": ["compute", "--check"],
    "zero": ["compute", "--check", "--format", "json", "--mask", "causal-zero"],
    "plain": ["compute", "--check", "--format", "json", "--no-projections", "--no-scale"],
}.items():
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(argv)
    runs[name] = {"rc": rc, "out": out.getvalue()}
print(json.dumps({"before": before, "after": "torch" in sys.modules, "runs": runs}))
"""
    )
    assert report["before"] is False
    assert report["after"] is True
    runs = report["runs"]
    assert {r["rc"] for r in runs.values()} == {0}

    for name in ("json", "plain"):
        check = json.loads(runs[name]["out"])["check"]
        assert check["device"] in ("cpu", "cuda") and check["dtype"] == "float64"
        assert 0 <= check["torch"] < 1e-12
        assert 0 <= check["sdpa"] < 1e-12

    zero = json.loads(runs["zero"]["out"])["check"]
    assert 0 <= zero["torch"] < 1e-12
    assert zero["sdpa"] is None and "causal-zero" in zero["sdpa_note"]

    last = runs["text"]["out"].strip().splitlines()[-1]
    assert last.startswith("check on ")
    torch_diff = float(last.split("torch engine vs NumPy ")[1].split(";")[0])
    sdpa_diff = float(last.split("SDPA vs NumPy ")[1])
    assert 0 <= torch_diff < 1e-12 and 0 <= sdpa_diff < 1e-12


def test_the_python_api_imports_neither_qt_nor_torch_until_a_call_needs_them():
    report = run_python(
        """
import json, sys, tempfile, pathlib
import attnviz
heavy = ("torch", "PySide6", "pyqtgraph", "shiboken6", "transformers", "tokenizers",
         "huggingface_hub", "safetensors")
loaded = lambda: sorted(m for m in sys.modules if m.split(".")[0] in heavy)
at_import = loaded()
import attnviz.api
s = attnviz.preset()
c = attnviz.compute(s)
fig = attnviz.figure(c, "weights", head=1)
svg = fig._repr_svg_()
q = attnviz.from_qkv([[1.0, 0.0], [0.0, 1.0]], [[1.0, 0.0], [0.0, 1.0]], [[1.0, 2.0], [3.0, 4.0]])
folder = pathlib.Path(tempfile.mkdtemp())
fig.save(folder / "w.svg")
attnviz.load(attnviz.save(s, folder / "s.attn.json"))
after_calls = loaded()
fig.save(folder / "w.png")
print(json.dumps({
    "at_import": at_import,
    "after_calls": after_calls,
    "after_png": "PySide6" in sys.modules,
    "api": sorted(attnviz.api.__all__),
    "exported": sorted(n for n in attnviz.__all__ if n != "__version__"),
    "weights": c.weights[0].tolist(),
}))
"""
    )
    assert report["at_import"] == [] and report["after_calls"] == []
    assert report["after_png"] is True  # a PNG is drawn by Qt, imported then
    assert report["api"] == report["exported"]
    np.testing.assert_allclose(report["weights"], head1_causal_weights(), rtol=0, atol=1e-12)
