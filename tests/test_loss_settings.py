"""The loss the gradients are of is part of the scenario: saved (format version 4, only
when it is not the default), read back, checked, kept inside the output when the
scenario shrinks, and used by `attnviz grad` on a file."""

from __future__ import annotations

import dataclasses
import json
import re

import numpy as np
import pytest

from attnviz.cli import main
from attnviz.core.io.files import FileFormatError, load_scenario, save_scenario
from attnviz.core.maths.changes import changes_between
from attnviz.core.maths.losses import gradients
from attnviz.core.maths.scenario import ScenarioError, insert_token, remove_token, resized
from attnviz.core.presets import worked_example

LOSSES = [
    {"loss": "next-token"},
    {"loss": "cell", "loss_cell": (2, 3)},
    {"loss": "target", "loss_target": "first-token"},
]


@pytest.mark.parametrize("suffix", [".attn.json", ".attn.npz"])
@pytest.mark.parametrize("loss", LOSSES)
def test_a_chosen_loss_is_saved_as_version_4_and_read_back(tmp_path, suffix, loss):
    s = worked_example().with_settings(**loss)
    path = tmp_path / f"s{suffix}"
    save_scenario(path, s)
    back = load_scenario(path)
    assert (back.settings.loss, back.settings.loss_target, back.settings.loss_cell) == (
        s.settings.loss, s.settings.loss_target, s.settings.loss_cell)  # fmt: skip
    if suffix == ".attn.json":
        doc = json.loads(path.read_text())
        assert doc["version"] == 4
        if "loss_cell" in loss:
            assert doc["settings"]["loss_cell"] == [3, 4]  # numbered from 1, as shown


def test_the_default_loss_leaves_the_version_alone(tmp_path):
    path = tmp_path / "w.attn.json"
    save_scenario(path, worked_example())
    doc = json.loads(path.read_text())
    assert doc["version"] == 1 and not {"loss", "loss_target", "loss_cell"} & set(doc["settings"])


def saved_with(tmp_path, version: int, **settings) -> str:
    path = tmp_path / "w.attn.json"
    save_scenario(path, worked_example())
    doc = json.loads(path.read_text())
    doc["version"] = version
    doc["settings"].update(settings)
    path.write_text(json.dumps(doc))
    return str(path)


@pytest.mark.parametrize(
    ("version", "settings", "message"),
    [
        (3, {"loss": "cell"}, "settings.loss: needs version 4 (the file says 3)"),
        (4, {"loss": "guess"}, "settings.loss: 'guess' is not one of target, next-token, cell"),
        (4, {"loss_target": "x"}, "settings.loss_target: 'x' is not one of previous-token"),
        (4, {"loss_cell": [5, 1]}, "settings.loss_cell: row 5, column 1; the output is 4×4"),
        (4, {"loss_cell": [0, 1]}, "settings.loss_cell[1]"),
        (4, {"loss_cell": [1]}, "settings.loss_cell: expected [row, column], numbered from 1"),
        (4, {"loss_cell": [1, 10**400]}, "settings.loss_cell[2]"),
    ],
)
def test_a_bad_loss_in_a_file_is_named(tmp_path, version, settings, message):
    with pytest.raises((FileFormatError, ScenarioError), match=re.escape(message)):
        load_scenario(saved_with(tmp_path, version, **settings))


def test_the_cell_stays_inside_an_output_that_shrinks():
    s = worked_example().with_settings(loss="cell", loss_cell=(3, 3))
    assert resized(s, n=2, d_model=3).settings.loss_cell == (1, 2)
    assert remove_token(s, 0).settings.loss_cell == (2, 3)
    with pytest.raises(ScenarioError, match=r"settings\.loss_cell: row 5, column 1"):
        worked_example().with_settings(loss_cell=(4, 0))


def test_a_new_loss_changes_no_number_of_the_forward_pass():
    s = worked_example()
    changes = changes_between(s, s.with_settings(loss="next-token", loss_cell=(1, 1)))
    assert not (changes.reshaped or changes.projections or changes.attention or changes.mix)


def test_grad_uses_the_file_s_own_loss(tmp_path, capsys):
    s = worked_example().with_settings(loss="cell", loss_cell=(1, 2))
    path = tmp_path / "c.attn.json"
    save_scenario(path, s)
    assert main(["grad", str(path), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    # final[2, 3] by hand: the worked example's two heads, causal, then W_O
    X = np.asarray(s.X)
    outs = []
    for h in range(2):
        Q, K, V = (X @ np.asarray(W)[h] for W in (s.W_Q, s.W_K, s.W_V))
        S = Q @ K.T / np.sqrt(2)
        S[np.triu_indices(4, 1)] = -np.inf
        P = np.exp(S - S.max(axis=1, keepdims=True))
        outs.append(P / P.sum(axis=1, keepdims=True) @ V)
    final = np.hstack(outs) @ np.asarray(s.W_O)
    assert doc["loss"]["kind"] == "cell" and doc["loss"]["name"] == "cell:2,3"
    assert doc["loss"]["value"] == pytest.approx(final[1, 2], rel=1e-12)
    assert doc["final"] == [[1.0 if (i, j) == (1, 2) else 0.0 for j in range(4)] for i in range(4)]


def custom(T=None):
    s = worked_example().with_settings(loss_target="custom")
    return s if T is None else dataclasses.replace(s, target=T)


def test_the_custom_target_starts_as_the_previous_token_target_and_is_edited_like_a_matrix():
    s = custom()
    X = np.asarray(s.X)
    np.testing.assert_array_equal(s.target, np.concatenate([X[:1], X[:-1]]))
    edited = s.with_cells("target", None, 1, 2, np.array([[5.0]]))
    T = np.array(s.target)
    T[1, 2] = 5.0
    final = np.asarray(gradients(edited).final)  # dL/dfinal = final − T, by hand
    from attnviz.core.maths.forward import compute

    np.testing.assert_allclose(final, compute(edited).final - T, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("suffix", [".attn.json", ".attn.npz"])
def test_the_custom_target_is_saved_and_read_back(tmp_path, suffix):
    T = np.arange(16.0).reshape(4, 4) / 7
    path = tmp_path / f"t{suffix}"
    save_scenario(path, custom(T))
    back = load_scenario(path)
    assert back.settings.loss_target == "custom"
    np.testing.assert_array_equal(back.target, T)


def test_the_custom_target_follows_the_tokens():
    T = np.arange(16.0).reshape(4, 4)
    s = custom(T)
    np.testing.assert_array_equal(remove_token(s, 1).target, np.delete(T, 1, axis=0))
    np.testing.assert_array_equal(resized(s, d_model=2).target, T[:, :2])
    np.testing.assert_array_equal(insert_token(s, 0).target[1:], T)


def test_a_custom_target_without_its_grid_in_a_file_is_named(tmp_path):
    with pytest.raises(FileFormatError, match=re.escape("settings.target: missing")):
        load_scenario(saved_with(tmp_path, 4, loss_target="custom"))
