"""The numbers badge: green when the engines agree, red naming the quantity when not."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

torch_engine = pytest.importorskip("attnviz.core.maths.torch_engine")
pytest.importorskip("torch")

from test_entropy_stability import equal_tokens  # noqa: E402

from attnviz.core.maths.results import Result, RowStats  # noqa: E402
from attnviz.ui.numbers_badge import GREEN, RED, NumbersBadge  # noqa: E402
from attnviz.ui.workspace import Workspace  # noqa: E402


def with_entropy_off(r: Result, by: float) -> Result:
    entropy = np.array(r.heads[0].entropy)
    entropy[1] += by
    h = r.heads[0]
    head = dataclasses.replace(h, rows=RowStats(h.leak, h.row_sum, entropy))
    return dataclasses.replace(r, heads=(head, *r.heads[1:]))


def checked(qtbot, value: float) -> NumbersBadge:
    ws = Workspace.create(equal_tokens(value))
    badge = NumbersBadge(ws)
    qtbot.addWidget(badge)
    badge.start()
    ws.compute.wait()
    return badge


@pytest.mark.parametrize("value", [1.0, 1e4, 1e6])
def test_agreeing_engines_are_green(qtbot, value: float) -> None:
    badge = checked(qtbot, value)
    assert badge.text().startswith("✓"), badge.text()
    assert GREEN in badge.styleSheet()
    assert "entropy: " in badge.toolTip() and "leak: " in badge.toolTip()


@pytest.mark.parametrize("value", [1.0, 1e4, 1e6])
def test_an_entropy_off_by_0_08_turns_it_red(
    qtbot, monkeypatch: pytest.MonkeyPatch, value: float
) -> None:
    honest = torch_engine.compute_torch
    monkeypatch.setattr(
        torch_engine,
        "compute_torch",
        lambda s, device="cpu", dtype="float64": with_entropy_off(honest(s, device, dtype), 0.08),
    )
    badge = checked(qtbot, value)
    assert badge.text().startswith("✗ entropy differs by 8.0e-02"), badge.text()
    assert RED in badge.styleSheet()
