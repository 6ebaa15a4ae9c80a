"""docs/attnviz-notebook.ipynb runs headless, every cell, in a fresh kernel: offscreen, in a
temporary folder, with settings and data there too (its window opens under %gui qt)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "docs" / "attnviz-notebook.ipynb"


def test_the_example_notebook_runs(tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat", reason="the test extra's nbformat is missing")
    nbclient = pytest.importorskip("nbclient", reason="the test extra's nbclient is missing")
    pytest.importorskip("ipykernel", reason="the test extra's ipykernel is missing")
    for name, value in {
        "QT_QPA_PLATFORM": "offscreen",
        "HF_HUB_OFFLINE": "1",
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "XDG_DATA_HOME": str(tmp_path / "data"),
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }.items():
        monkeypatch.setenv(name, value)  # the kernel inherits them
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(
        nb,
        timeout=180,
        kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path)}},
        shutdown_kernel="immediate",  # a kernel running Qt's loop waits out a graceful one
        on_cell_executed=_settle_after_gui,
    )
    try:
        client.execute()
    except RuntimeError as e:  # nbclient's errors when the kernel does not start or answer
        dead = isinstance(e, nbclient.exceptions.DeadKernelError)
        if dead or "Kernel didn't respond" in str(e):
            pytest.skip(f"the Jupyter kernel could not start here: {e}")
        raise
    outputs = {i: cell.get("outputs", []) for i, cell in enumerate(nb.cells)}

    def data(i: int, mime: str) -> str:
        return next(o["data"][mime] for o in outputs[i] if mime in o.get("data", {}))

    assert data(1, "text/html").count("<svg") == 2  # both heads' weights, inline
    assert "<svg" in data(3, "image/svg+xml")
    assert data(4, "text/plain") == "True"
    assert float(data(6, "text/plain")) < 1e-14  # from_qkv against NumPy
    assert float(data(8, "text/plain")) < 1e-12  # the captured module against itself
    assert "head 2 · weights" in data(9, "image/svg+xml")
    assert data(12, "text/plain") == "(True, 4)"  # the window opened; the kernel went on
    assert (tmp_path / "scaled-head1.svg").stat().st_size > 0


def _settle_after_gui(cell, **_):
    """After ``%gui qt``, give the kernel a moment to enter Qt's loop before the next
    cell, as a person running cells does: ipykernel can miss a request that arrives while
    it switches loops, and the next cell then never runs (the "Run All" hang, ipython
    #7039), which a loaded machine made happen here."""
    if "%gui" in cell.source:
        time.sleep(2.0)
