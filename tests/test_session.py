"""The session without Qt: edits as commands, replayed, undone and redone.

(tests/test_import_boundary.py checks that attnviz.core.session imports no Qt.)
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from attnviz.core.maths.forward import compute
from attnviz.core.maths.scenario import ScenarioError, resized
from attnviz.core.presets import make_preset
from attnviz.core.session import Change, LoadScenario, ReplaceScenario, Session, SetCells


def test_edits_replay_undo_and_redo_without_qt():
    session = Session()
    start = session.scenario
    seen: list[Change] = []
    session.subscribe(seen.append)

    session.apply(SetCells(session, "X", None, 1, 2, np.array([[0.5]])))
    session.apply(SetCells(session, "W_K", 1, 0, 0, np.array([[1.0, -1.0]])))
    session.apply(ReplaceScenario(session, resized(session.scenario, n=6), "grow"))
    assert session.scenario.n == 6
    assert session.scenario.X[1, 2] == 0.5
    np.testing.assert_array_equal(session.scenario.W_K[1, 0], [1.0, -1.0])
    assert seen == [
        Change("cells", "X", None, 1, 2, 1, 1),
        Change("cells", "W_K", 1, 0, 0, 1, 2),
        Change("scenario"),
    ]

    while session.undo():
        pass
    for name in ("X", "W_Q", "W_K", "W_V", "W_O"):
        np.testing.assert_array_equal(getattr(session.scenario, name), getattr(start, name))
    assert session.scenario.n == start.n
    assert session.redo() and session.redo()
    assert session.scenario.X[1, 2] == 0.5 and session.scenario.W_K[1, 0, 1] == -1.0
    # The result of the replayed document is the engine's result for it, by hand here.
    s = session.scenario
    q, k = s.X @ s.W_Q[1], s.X @ s.W_K[1]
    scores = q @ k.T / np.sqrt(s.d_k)
    np.testing.assert_allclose(compute(s).scores[1], q @ k.T, atol=1e-15)
    np.testing.assert_allclose(compute(s).scaled[1], scores, atol=1e-15)


def test_typing_into_one_cell_again_is_one_step():
    session = Session()
    before = session.scenario.X[0, 0]
    for value in (1.0, 2.0, 3.0):
        session.apply(SetCells(session, "X", None, 0, 0, np.array([[value]])))
    session.apply(SetCells(session, "X", None, 0, 1, np.array([[4.0]])))  # another cell
    assert session.scenario.X[0, 0] == 3.0
    assert session.undo() and session.scenario.X[0, 1] != 4.0
    assert session.undo() and session.scenario.X[0, 0] == before
    assert not session.undo()


def test_a_bad_edit_raises_when_made_and_changes_nothing():
    session = Session()
    before = session.scenario
    with pytest.raises(ScenarioError):
        SetCells(session, "X", None, 0, 0, np.array([[np.nan]]))
    with pytest.raises(ScenarioError):
        SetCells(session, "X", None, 3, 3, np.ones((2, 2)))  # past the last row
    assert session.scenario is before and not session.undo()


def test_loading_changes_scenario_and_path_together():
    session = Session(path=Path("/tmp/a.attn.json"))
    other = make_preset("gpt2-small", n=8)
    session.apply(LoadScenario(session, other, None, "New"))
    assert session.scenario is other and session.path is None
    session.undo()
    assert session.path == Path("/tmp/a.attn.json") and session.scenario.n == 4


def test_undo_texts_name_heads_from_one():
    session = Session()
    assert SetCells(session, "W_Q", 1, 2, 0, np.array([[1.0]])).text == "Edit head 2 W_Q[3,1]"
    assert SetCells(session, "X", None, 0, 0, np.ones((2, 3))).text == "Edit 2×3 cells of X"
