"""The main window: undoable commands, title, menus, docks and layout, files, the
unsaved-changes prompt, autosave, drag and drop, heatmap hover and click, and large
scenarios computed off the UI thread.

Expected numbers come from the brief's matrices (``reference``) or values typed here.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import reference
from PySide6.QtCore import QMimeData, QPoint, QPointF, QSettings, Qt, QUrl
from PySide6.QtGui import QColor, QDragEnterEvent, QDropEvent, QKeySequence
from PySide6.QtWidgets import QFileDialog, QInputDialog, QMessageBox

import attnviz.ui.main_window as main_window
from attnviz.core.maths.forward import compute
from attnviz.core.maths.results import HEAD_MATRICES, Result
from attnviz.core.session import SetCells

# Never let a message box block the run: warnings are recorded (tests that expect one ask
# for the list) and any other box nobody answers is rejected and fails the test.
pytestmark = pytest.mark.usefixtures("warnings_shown", "answers")

TOKENS = ("she", "saw", "the", "cat")
CTRL = Qt.KeyboardModifier.ControlModifier
Button = QMessageBox.StandardButton


def snapshot(doc) -> tuple:
    """Everything a scenario holds, as plain values that compare exactly."""
    s = doc.scenario
    arrays = tuple(np.array(getattr(s, n)).tobytes() for n in ("X", "W_Q", "W_K", "W_V", "W_O"))
    shapes = tuple(getattr(s, n).shape for n in ("X", "W_Q", "W_K", "W_V", "W_O"))
    return s.tokens, shapes, arrays, s.settings


def menu(window, title: str):
    for action in window.menuBar().actions():
        if action.text().replace("&", "") == title:
            return action.menu()
    raise AssertionError(f"no {title} menu")


def action(menu_, text: str):
    for a in menu_.actions():
        if a.text().replace("&", "").startswith(text):
            return a
    raise AssertionError(f"no {text} action in {menu_.title()}")


def edit(doc, name: str, head, row: int, col: int, value: float) -> None:
    doc.push(SetCells(doc.session, name, head, row, col, np.array([[value]])))


def cell_center(view, row: int, col: int) -> QPoint:
    """Widget coordinates of the centre of a heatmap cell."""
    return view.point_at(col + 0.5, row + 0.5).toPoint()


def save_to(monkeypatch, path: Path) -> None:
    """Answer the next Save dialogs with path."""
    monkeypatch.setattr(
        QFileDialog, "getSaveFileName", lambda *a, **k: (str(path), "attnviz scenario")
    )


def read_json(path: Path) -> dict:
    return json.loads(path.read_text("utf-8"))


# The pipeline of the worked example ----------------------------------------------------------


def test_new_window_shows_the_worked_example_for_both_heads(shown_window, qtbot):
    window = shown_window()
    views = window.pipeline.views
    for head in (0, 1):
        if head == 1:
            qtbot.keyClick(window, Qt.Key.Key_BracketRight, CTRL)  # View > Next Head
            assert window.view_state.head == 1
        Wq, Wk, Wv = reference.W_Q[head], reference.W_K[head], reference.W_V[head]
        Q, K = reference.X @ Wq, reference.X @ Wk
        scaled, weights, output = reference.head(reference.X, Wq, Wk, Wv)
        expected = {
            "Q": Q,
            "K": K,
            "V": reference.X @ Wv,
            "scores": Q @ K.T,
            "scaled": scaled,
            "weights": weights,
            "output": output,
        }
        for name, values in expected.items():
            np.testing.assert_allclose(views[name].spec.values, values, rtol=0, atol=1e-12)
        masked = views["masked"].spec.values
        future = np.triu(np.ones((4, 4), dtype=bool), k=1)
        assert np.all(masked[future] == -math.inf)
        np.testing.assert_allclose(masked[~future], scaled[~future], rtol=0, atol=1e-12)
        assert views["weights"].spec.row_labels == TOKENS
        assert views["weights"].spec.col_labels == TOKENS
        assert f"head {head + 1}" in views["Q"].spec.title


# Heatmaps: masked cells, hover text, click ---------------------------------------------------


def test_masked_cells_keep_minus_infinity_and_are_hatched(shown_window, qtbot):
    from attnviz.core.figures import colors

    window = shown_window()
    view = window.pipeline.views["masked"]
    qtbot.waitUntil(view.isVisible)
    assert view.spec.values[0, 3] == -math.inf and view.spec.values[2, 3] == -math.inf
    assert view.marks.hatched.sum() == 6  # the −∞ cells are hatched
    image = view.grab().toImage()
    hatch = QColor(colors.MASKED_HATCH).rgb()

    def pixels(row: int, col: int) -> set[int]:
        c = cell_center(view, row, col)
        return {
            image.pixel(c.x() + dx, c.y() + dy) & 0xFFFFFF
            for dx in range(-6, 7)
            for dy in range(-6, 7)
        }

    assert hatch & 0xFFFFFF in pixels(0, 3)  # masked: hatch lines over grey
    assert hatch & 0xFFFFFF in pixels(1, 2)
    assert hatch & 0xFFFFFF not in pixels(3, 0)  # not masked: a colour, no hatching


def test_each_cell_shows_the_colour_map_of_its_value_on_screen(shown_window, qtbot):
    """Read from the screen, just inside each cell's corner (clear of the printed value):
    the colour of the documented map, as in the exported figures."""
    from attnviz.core.figures import colors

    window = shown_window()
    view = window.pipeline.views["scaled"]
    qtbot.waitUntil(view.isVisible)
    image = view.grab().toImage()
    spec = view.spec
    for row in range(4):
        for col in range(4):
            corner = QPointF(col + 0.15, row + 0.15)
            at = view.point_at(corner.x(), corner.y()).toPoint()
            got = QColor(image.pixel(at.x(), at.y()))
            want = colors.rgb(spec.values[row : row + 1, col], spec.kind, spec.levels)[0]
            assert (got.red(), got.green(), got.blue()) == tuple(want), (row, col)


def test_hover_text_names_the_cell_and_its_exact_value(shown_window):
    window = shown_window()
    views = window.pipeline.views
    _, weights, _ = reference.head(
        reference.X, reference.W_Q[0], reference.W_K[0], reference.W_V[0]
    )
    text = views["weights"].describe(2, 1)
    lines = text.split("\n")
    assert "head 1" in lines[0]
    assert "query the" in lines[1] and "key saw" in lines[1]
    value = float(lines[-1])
    assert value == views["weights"].spec.values[2, 1]  # exact: repr, not rounded
    assert lines[-1] == repr(value)
    assert value == pytest.approx(weights[2, 1], abs=1e-12)

    masked = views["masked"].describe(0, 2)
    assert "query she" in masked and "key the" in masked and "−∞" in masked

    q = views["Q"].describe(3, 1)
    assert "cat" in q and "2" in q.split("\n")[1]
    assert float(q.split("\n")[-1]) == pytest.approx((reference.X @ reference.W_Q[0])[3, 1])


def test_hovering_a_cell_shows_its_tooltip(shown_window, qtbot):
    from PySide6.QtWidgets import QToolTip

    window = shown_window()
    view = window.pipeline.views["scaled"]
    qtbot.waitUntil(view.isVisible)
    qtbot.mouseMove(view, cell_center(view, 1, 0))
    qtbot.waitUntil(QToolTip.isVisible, timeout=2000)
    assert QToolTip.text() == view.describe(1, 0)


def test_click_selects_the_cell(shown_window, qtbot):
    window = shown_window()
    view = window.pipeline.views["weights"]
    qtbot.waitUntil(view.isVisible)
    with (
        qtbot.waitSignal(view.cellClicked, timeout=2000) as clicked,
        qtbot.waitSignal(window.pipeline.cellClicked, timeout=2000) as panel,
    ):
        qtbot.mouseClick(view, Qt.MouseButton.LeftButton, pos=cell_center(view, 3, 2))
    assert clicked.args == ["weights", 3, 2]
    assert panel.args == ["weights", 0, 3, 2]
    assert view.selected == (3, 2)
    _, weights, _ = reference.head(
        reference.X, reference.W_Q[0], reference.W_K[0], reference.W_V[0]
    )
    message = window.statusBar().currentMessage()
    assert "query cat" in message and "key the" in message
    assert float(message.rsplit("·", 1)[1]) == pytest.approx(weights[3, 2], abs=1e-12)
    # Clicking another view moves the selection there.
    other = window.pipeline.views["Q"]
    with qtbot.waitSignal(other.cellClicked, timeout=2000) as clicked:
        qtbot.mouseClick(other, Qt.MouseButton.LeftButton, pos=cell_center(other, 0, 1))
    assert clicked.args == ["Q", 0, 1]
    assert view.selected is None


# Commands, undo and the title -----------------------------------------------------------------


def test_every_change_is_one_undoable_command(shown_window, monkeypatch, tmp_path, warnings_shown):
    window = shown_window()
    doc = window.doc
    csv = tmp_path / "w_o.csv"

    def import_w_o():
        rows, cols = doc.scenario.W_O.shape
        csv.write_text(
            "\n".join(",".join(str(i * cols + j) for j in range(cols)) for i in range(rows))
        )
        return window.files.import_matrix_from(w_o, csv)

    x, w_o = window.inputs.grid, window.weights.grids[("W_O", None)]
    monkeypatch.setattr(QInputDialog, "getText", lambda *a, **k: ("dog", True))

    def select(grid, row, col):
        grid.setCurrentIndex(grid.model().index(row, col))

    changes = {
        "a cell": lambda: x.model().setData(x.model().index(1, 1), "0.625"),
        "a paste": lambda: (select(w_o, 2, 1), w_o.paste_text("[[1, 2], [3, 4]]")),
        "a fill": lambda: (
            select(x, 0, 0),
            x.selectAll(),
            x.paste_text("0.5"),
        ),
        "a delete": lambda: (select(w_o, 0, 0), w_o.clear()),
        "d_model": lambda: window.inputs.d_model.setValue(6),
        "heads": lambda: window.weights.heads.setValue(3),
        "d_k": lambda: window.weights.d_k.setValue(3),
        "add a token": lambda: (select(x, 1, 0), window.inputs.add()),
        "remove a token": lambda: (select(x, 0, 0), window.inputs.remove()),
        "move a token": lambda: (select(x, 0, 0), window.inputs.move_token(1)),
        "rename a token": lambda: window.inputs.rename(0),
        "scale": lambda: window.act_scale.trigger(),
        "projections": lambda: window.act_projections.trigger(),
        "mask": lambda: window.mask_box.textActivated.emit("causal-zero"),
        "position": lambda: window.pos_box.textActivated.emit("sinusoidal"),
        "a matrix import": import_w_o,
        "a preset": lambda: window.load_preset("stage-4-scaling"),
    }
    for what, change in changes.items():
        before, count = snapshot(doc), doc.undo_stack.count()
        result_before = np.array(window.compute.result.final)
        change()
        after = snapshot(doc)
        assert after != before, what
        assert doc.undo_stack.count() == count + 1, what
        doc.undo_stack.undo()
        assert snapshot(doc) == before, what
        np.testing.assert_array_equal(window.compute.result.final, result_before, err_msg=what)
        doc.undo_stack.redo()
        assert snapshot(doc) == after, what
    assert doc.undo_stack.count() == len(changes)
    assert doc.scenario.tokens == TOKENS
    assert doc.scenario.settings.mask == "none"  # the last preset
    for _ in changes:
        doc.undo_stack.undo()
    np.testing.assert_array_equal(doc.scenario.X, reference.X)
    np.testing.assert_array_equal(doc.scenario.W_Q, reference.W_Q)
    np.testing.assert_array_equal(doc.scenario.W_O, reference.W_O)
    assert doc.undo_stack.isClean()
    assert not window.isWindowModified()
    assert not warnings_shown


def test_title_shows_the_file_name_and_an_unsaved_mark(shown_window, tmp_path, monkeypatch):
    window = shown_window()
    doc = window.doc
    assert "untitled" in window.windowTitle() and "[*]" in window.windowTitle()
    assert not window.isWindowModified()
    edit(doc, "X", None, 0, 0, 0.5)
    assert window.isWindowModified()
    save_to(monkeypatch, tmp_path / "lesson")
    assert window.files.save()
    assert (tmp_path / "lesson.attn.json").exists()
    assert "lesson.attn.json" in window.windowTitle()
    assert not window.isWindowModified()
    doc.undo_stack.undo()
    assert window.isWindowModified()
    doc.undo_stack.redo()
    assert not window.isWindowModified()
    # An edit of the same cell after saving is a new step, not merged into the saved one.
    edit(doc, "X", None, 0, 0, 0.25)
    assert window.isWindowModified() and doc.undo_stack.count() == 2
    doc.undo_stack.undo()
    assert not window.isWindowModified() and doc.scenario.X[0, 0] == 0.5


def test_undo_and_redo_in_the_edit_menu_with_standard_shortcuts(shown_window, qtbot):
    window = shown_window()
    doc = window.doc
    edit_menu = menu(window, "Edit")
    undo, redo = action(edit_menu, "Undo"), action(edit_menu, "Redo")
    assert undo.shortcut() == QKeySequence(QKeySequence.StandardKey.Undo)
    assert QKeySequence(QKeySequence.StandardKey.Redo) in redo.shortcuts()
    assert not undo.isEnabled() and not redo.isEnabled()

    edit(doc, "W_K", 1, 3, 0, 0.125)
    assert undo.isEnabled()
    undo.trigger()
    assert doc.scenario.W_K[1, 3, 0] == -0.9
    redo.trigger()
    assert doc.scenario.W_K[1, 3, 0] == 0.125

    qtbot.keyClick(window, Qt.Key.Key_Z, CTRL)
    assert doc.scenario.W_K[1, 3, 0] == -0.9
    assert redo.isEnabled()


def test_ctrl_y_redoes(shown_window, qtbot):
    window = shown_window()
    doc = window.doc
    edit(doc, "X", None, 0, 0, 2.0)
    qtbot.keyClick(window, Qt.Key.Key_Z, CTRL)
    assert doc.scenario.X[0, 0] == 0.9
    qtbot.keyClick(window, Qt.Key.Key_Y, CTRL)
    assert doc.scenario.X[0, 0] == 2.0


def test_every_standard_redo_binding_redoes(shown_window, qtbot):
    window = shown_window()
    doc = window.doc
    redo = action(menu(window, "Edit"), "Redo")
    edit(doc, "X", None, 0, 0, 2.0)
    doc.undo_stack.undo()
    qtbot.keyClick(window, Qt.Key.Key_Z, CTRL | Qt.KeyboardModifier.ShiftModifier)
    assert doc.scenario.X[0, 0] == 2.0
    bindings = QKeySequence.keyBindings(QKeySequence.StandardKey.Redo)
    assert set(bindings) <= set(redo.shortcuts())


# Docks and layout -----------------------------------------------------------------------------


def test_docks_close_and_reopen_from_the_view_menu_and_reset_workspace(shown_window, qtbot):
    window = shown_window()
    view_menu = menu(window, "View")
    for title in ("Inputs", "Weights", "Pipeline"):
        dock = window.docks[title]
        toggle = action(view_menu, title)
        assert toggle.isCheckable() and toggle.isChecked()
        toggle.trigger()
        assert dock.isHidden() and not toggle.isChecked()
        toggle.trigger()
        qtbot.waitUntil(dock.isVisible)
        assert toggle.isChecked()

    window.docks["Inputs"].close()
    window.docks["Weights"].close()
    window.docks["Pipeline"].setFloating(True)
    assert window.docks["Pipeline"].isFloating()
    action(view_menu, "Reset Workspace").trigger()
    for title in ("Inputs", "Weights", "Pipeline"):
        dock = window.docks[title]
        qtbot.waitUntil(dock.isVisible)
        assert not dock.isFloating(), title
        assert window.dockWidgetArea(dock) != Qt.DockWidgetArea.NoDockWidgetArea


def test_layout_and_recent_files_persist_between_windows(make_window, qtbot, tmp_path, monkeypatch):
    first = make_window()
    first.show()
    qtbot.waitExposed(first)
    # Small enough for the offscreen screen (800 × 800), so no clamping moves it.
    for title, dock in first.docks.items():
        if title != "Inputs":
            dock.close()
    first.resize(640, 480)
    first.move(30, 40)
    qtbot.waitUntil(lambda: first.size().width() == 640)
    geometry = first.geometry()
    a, b = tmp_path / "a.attn.json", tmp_path / "b.attn.json"
    for path in (a, b):
        save_to(monkeypatch, path)
        assert first.files.save_as()
    assert first.files.open_path(a)
    assert first.close()

    second = make_window()
    second.show()
    qtbot.waitExposed(second)
    assert second.geometry() == geometry
    assert second.docks["Inputs"].isVisible()
    for title in ("Weights", "Pipeline"):
        assert second.docks[title].isHidden(), title
    assert second.files.recent_files()[:2] == [str(a.resolve()), str(b.resolve())]
    second.recent_menu.aboutToShow.emit()
    entries = [x.text() for x in second.recent_menu.actions()]
    assert entries[:2] == [str(a.resolve()), str(b.resolve())]
    second.recent_menu.actions()[1].trigger()
    assert second.doc.path == b.resolve()


def test_a_window_can_be_closed_twice(tmp_path, qtbot):
    from attnviz.ui.main_window import MainWindow

    settings = QSettings(str(tmp_path / "twice.ini"), QSettings.Format.IniFormat)
    window = MainWindow(settings, tmp_path / "data")
    errors: list[BaseException] = []
    try:
        with qtbot.captureExceptions() as exceptions:
            for _ in range(2):  # e.g. pytest-qt and then make_window, for a window never shown
                try:
                    window.close()
                except RuntimeError as e:
                    errors.append(e)
        assert not errors and not exceptions, errors or exceptions[0][1]
    finally:
        window.deleteLater()


# Files: save, open, bad files, the unsaved-changes prompt ----------------------------------


def test_save_and_open_round_trip(make_window, qtbot, tmp_path, monkeypatch):
    first = make_window()
    first.show()
    doc = first.doc
    edit(doc, "X", None, 1, 2, 1.0 / 3.0)
    edit(doc, "W_Q", 1, 3, 1, -0.0625)
    edit(doc, "W_V", 0, 0, 0, 123456.5)
    edit(doc, "W_O", None, 2, 3, 1e-7)
    changed = doc.scenario.with_tokens(("she", "saw", "a", "dog")).with_settings(
        mask="causal-zero", scale=False, positional="sinusoidal"
    )
    doc.replace(changed, "tokens and settings")
    save_to(monkeypatch, tmp_path / "round")
    assert first.files.save()
    path = tmp_path / "round.attn.json"
    data = read_json(path)
    assert data["tokens"] == ["she", "saw", "a", "dog"]
    assert data["X"][1][2] == 1.0 / 3.0
    assert data["W_O"][2][3] == 1e-7

    second = make_window(settings_name="other.ini")
    second.show()
    assert second.files.open_path(path)
    assert snapshot(second.doc) == snapshot(doc)
    assert second.doc.path == path.resolve()
    assert "round.attn.json" in second.windowTitle() and not second.isWindowModified()
    assert second.doc.undo_stack.count() == 1  # opening is itself one undoable step
    for name in HEAD_MATRICES:
        for head in (0, 1):
            np.testing.assert_array_equal(
                second.compute.result.matrix(name, head), first.compute.result.matrix(name, head)
            )
    # The loaded scenario is what was typed, recomputed: causal-zero, unscaled, sinusoidal.
    s = second.doc.scenario
    assert s.X[1, 2] == 1.0 / 3.0 and s.W_Q[1, 3, 1] == -0.0625 and s.W_V[0, 0, 0] == 123456.5
    X = np.array(s.X) + reference.sinusoidal(4, 4)
    _, weights, _ = reference.head(X, s.W_Q[0], s.W_K[0], s.W_V[0], mask="causal-zero", scale=False)
    np.testing.assert_allclose(second.compute.result.matrix("weights", 0), weights, atol=1e-12)


BAD_FILES = {
    "not-json.attn.json": b"{ this is not json",
    "empty.attn.json": b"",
    "binary.attn.json": bytes(range(256)),
    "list.attn.json": b"[1, 2, 3]",
    "wrong-format.attn.json": b'{"format": "something-else", "version": 1}',
}


def test_a_bad_file_leaves_the_document_as_it_was(
    shown_window, tmp_path, monkeypatch, warnings_shown
):
    window = shown_window()
    doc = window.doc
    good = tmp_path / "good.attn.json"
    save_to(monkeypatch, good)
    assert window.files.save()
    edit(doc, "X", None, 0, 0, 0.5)
    edit(doc, "W_K", 0, 1, 1, -0.5)
    text = good.read_text("utf-8")
    data = json.loads(text)
    bad = dict(BAD_FILES)
    bad["nan.attn.json"] = text.replace("0.9", "NaN", 1).encode()
    bad["huge.attn.json"] = text.replace("0.9", "1e999", 1).encode()
    shape = json.loads(text)
    shape["heads"][0]["W_Q"] = shape["heads"][0]["W_Q"][:3]
    bad["shape.attn.json"] = json.dumps(shape).encode()
    version = dict(data, version=99)
    bad["version.attn.json"] = json.dumps(version).encode()
    tokens = dict(data, tokens=["she", "saw"])
    bad["tokens.attn.json"] = json.dumps(tokens).encode()
    for name, content in bad.items():
        (tmp_path / name).write_bytes(content)
    bad["missing.attn.json"] = None
    bad["folder"] = None
    (tmp_path / "folder").mkdir()

    before = snapshot(doc)
    scenario, result = doc.scenario, window.compute.result
    state = (doc.undo_stack.count(), doc.undo_stack.index(), doc.path, window.windowTitle())
    for name in bad:
        warnings_shown.clear()
        assert not window.files.open_path(tmp_path / name, ask=False), name
        assert len(warnings_shown) == 1, name
        assert name in warnings_shown[0][1], warnings_shown[0][1]
        assert doc.scenario is scenario and window.compute.result is result, name
        assert snapshot(doc) == before, name
        assert (
            doc.undo_stack.count(),
            doc.undo_stack.index(),
            doc.path,
            window.windowTitle(),
        ) == state
        assert window.isWindowModified()
    np.testing.assert_array_equal(
        window.pipeline.views["Q"].spec.values[0], [0.5, 0.1, -0.3, 0.2] @ reference.W_Q[0]
    )


def test_unsaved_prompt_cancel_keeps_everything(shown_window, answers, tmp_path):
    window = shown_window()
    doc = window.doc
    edit(doc, "X", None, 2, 2, 0.5)
    answers.queue(Button.Cancel)
    window.files.new_document()
    assert "untitled" in answers.texts[0]
    assert doc.scenario.X[2, 2] == 0.5 and doc.undo_stack.count() == 1
    assert window.isWindowModified()

    (tmp_path / "other.attn.json").write_text(json.dumps({"format": "x"}))
    answers.queue(Button.Cancel)
    assert not window.files.open_path(tmp_path / "other.attn.json")
    assert doc.scenario.X[2, 2] == 0.5

    answers.queue(Button.Cancel)
    assert not window.close()
    assert window.isVisible()
    assert doc.scenario.X[2, 2] == 0.5


def test_unsaved_prompt_discard_drops_the_changes(shown_window, answers, tmp_path):
    window = shown_window()
    doc = window.doc
    edit(doc, "X", None, 2, 2, 0.5)
    answers.queue(Button.Discard)
    window.files.new_document()
    np.testing.assert_array_equal(doc.scenario.X, reference.X)
    assert not window.isWindowModified() and doc.path is None
    doc.undo_stack.undo()  # New is one undoable step: the discarded edit comes back
    assert doc.scenario.X[2, 2] == 0.5


def test_unsaved_prompt_save_writes_the_file_first(shown_window, answers, tmp_path, monkeypatch):
    window = shown_window()
    doc = window.doc
    # With a path: Save writes there.
    path = tmp_path / "kept.attn.json"
    save_to(monkeypatch, path)
    assert window.files.save()
    edit(doc, "W_O", None, 0, 3, 0.75)
    answers.queue(Button.Save)
    window.files.new_document()
    assert "kept.attn.json" in answers.texts[0]
    assert read_json(path)["W_O"][0][3] == 0.75
    assert doc.path is None and doc.scenario.W_O[0, 3] == 0.2

    # Without a path: Save asks for one.
    edit(doc, "W_O", None, 1, 3, -0.75)
    save_to(monkeypatch, tmp_path / "asked")
    answers.queue(Button.Save)
    window.files.new_document()
    assert read_json(tmp_path / "asked.attn.json")["W_O"][1][3] == -0.75
    assert doc.scenario.W_O[1, 3] == 0.4

    # Save, then cancelling the file dialog, keeps the document.
    edit(doc, "W_O", None, 2, 3, 0.0625)
    monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda *a, **k: ("", ""))
    answers.queue(Button.Save)
    window.files.new_document()
    assert doc.scenario.W_O[2, 3] == 0.0625 and window.isWindowModified()


def test_drag_and_drop_of_a_file_opens_it(shown_window, tmp_path, monkeypatch, answers):
    window = shown_window()
    doc = window.doc
    edit(doc, "X", None, 3, 0, -0.125)
    path = tmp_path / "dropped.attn.json"
    save_to(monkeypatch, path)
    assert window.files.save()
    doc.reset(doc.scenario.with_cells("X", None, 3, 0, np.array([[9.0]])), None)
    edit(doc, "X", None, 0, 0, 7.0)  # unsaved: the drop asks first

    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(path))])
    enter = QDragEnterEvent(
        QPoint(50, 50),
        Qt.DropAction.CopyAction,
        mime,
        Qt.MouseButton.LeftButton,
        Qt.KeyboardModifier.NoModifier,
    )
    window.dragEnterEvent(enter)
    assert enter.isAccepted()
    drop = QDropEvent(
        QPointF(50, 50),
        Qt.DropAction.CopyAction,
        mime,
        Qt.MouseButton.LeftButton,
        Qt.KeyboardModifier.NoModifier,
    )
    answers.queue(Button.Cancel)
    window.dropEvent(drop)
    assert doc.path is None and doc.scenario.X[0, 0] == 7.0  # cancelled: nothing opened
    answers.queue(Button.Discard)
    window.dropEvent(drop)
    assert doc.path == path.resolve()
    assert doc.scenario.X[3, 0] == -0.125
    assert "dropped.attn.json" in window.windowTitle()

    web = QMimeData()
    web.setUrls([QUrl("https://example.com/x.attn.json")])
    enter = QDragEnterEvent(
        QPoint(50, 50),
        Qt.DropAction.CopyAction,
        web,
        Qt.MouseButton.LeftButton,
        Qt.KeyboardModifier.NoModifier,
    )
    enter.ignore()
    window.dragEnterEvent(enter)
    assert not enter.isAccepted()


# Autosave ----------------------------------------------------------------------------------


def test_autosave_and_restore(make_window, qtbot, monkeypatch):
    first = make_window()
    first.show()
    first.autosave()
    assert not first.autosave_path.exists()  # nothing unsaved, nothing written
    edit(first.doc, "X", None, 0, 1, 0.875)
    edit(first.doc, "W_V", 1, 2, 0, -3.5)
    first.autosave()
    qtbot.waitUntil(first.autosave_path.exists)
    assert first.autosaver.timer.isActive()

    second = make_window(settings_name="second.ini")  # same data folder: "after a crash"
    second.show()
    asked = []

    def question(*args, **kwargs):
        asked.append(args)
        return Button.Yes

    monkeypatch.setattr(QMessageBox, "question", question)
    assert second.offer_restore()
    assert len(asked) == 1
    s = second.doc.scenario
    assert s.X[0, 1] == 0.875 and s.W_V[1, 2, 0] == -3.5
    assert snapshot(second.doc) == snapshot(first.doc)
    assert second.isWindowModified()  # restored work is unsaved work
    assert second.doc.undo_stack.count() == 1
    np.testing.assert_allclose(
        second.pipeline.views["Q"].spec.values[0],
        np.array([0.9, 0.875, -0.3, 0.2]) @ reference.W_Q[0],
        atol=1e-12,
    )

    monkeypatch.setattr(QMessageBox, "question", lambda *a, **k: Button.No)
    assert not second.offer_restore()
    assert not second.autosave_path.exists()  # declined: the copy is dropped
    assert not second.offer_restore()  # and not offered again


def test_undoing_a_restore_does_not_claim_the_worked_example_is_the_saved_file(
    make_window, qtbot, monkeypatch, tmp_path
):
    first = make_window()
    first.show()
    edit(first.doc, "X", None, 0, 0, 0.25)
    path = tmp_path / "mine.attn.json"
    save_to(monkeypatch, path)
    assert first.files.save()
    edit(first.doc, "X", None, 0, 0, 0.5)
    first.autosave()
    qtbot.waitUntil(first.autosave_path.exists)

    second = make_window(settings_name="second.ini")
    second.show()
    monkeypatch.setattr(QMessageBox, "question", lambda *a, **k: Button.Yes)
    assert second.offer_restore()
    assert second.doc.path == path.resolve() and second.doc.scenario.X[0, 0] == 0.5
    second.doc.undo_stack.undo()
    # Either the document shows what the file holds, or it is marked as not saved.
    assert second.doc.scenario.X[0, 0] == read_json(path)["X"][0][0] or (second.isWindowModified())


def test_the_timed_autosave_waits_for_a_pause_in_editing(make_window, qtbot, monkeypatch):
    """Its write competes with the edits for the cores: while the user types it waits,
    for a pause of QUIET_S, or at most LATEST_S behind."""
    import attnviz.ui.autosave as autosave_module

    clock = [1000.0]
    monkeypatch.setattr(autosave_module.time, "monotonic", lambda: clock[0])
    window = make_window()
    saver = window.autosaver

    def saved_x() -> float:
        saver._writer.wait()
        return float(saver.read()[0].X[0, 1])

    edit(window.doc, "X", None, 0, 1, 0.5)
    clock[0] += 0.2
    saver.timed()  # typing: put off
    saver._writer.wait()
    assert not window.autosave_path.exists()
    clock[0] += autosave_module.QUIET_S
    saver.timed()  # a pause: written
    assert saved_x() == 0.5
    value = 0.5
    while clock[0] < 1000.0 + 1.2 + autosave_module.LATEST_S - 1:  # typing on and on
        value += 1
        edit(window.doc, "X", None, 0, 1, value)
        clock[0] += 0.5
        saver.timed()
        assert saved_x() == 0.5  # put off
    clock[0] += 1.0
    value += 1
    edit(window.doc, "X", None, 0, 1, value)
    saver.timed()  # still typing, but LATEST_S behind: written
    assert saved_x() == value


def test_saving_and_closing_clear_the_autosave(make_window, qtbot, tmp_path, monkeypatch):
    window = make_window()
    window.show()
    edit(window.doc, "X", None, 0, 0, 0.5)
    window.autosave()
    qtbot.waitUntil(window.autosave_path.exists)
    save_to(monkeypatch, tmp_path / "saved")
    assert window.files.save()
    assert not window.autosave_path.exists()
    edit(window.doc, "X", None, 0, 0, 0.25)
    window.autosave()
    qtbot.waitUntil(window.autosave_path.exists)
    window.doc.undo_stack.undo()  # back to the saved state
    assert window.close()
    assert not window.autosave_path.exists()


def test_no_autosave_is_left_once_nothing_is_unsaved(make_window, qtbot):
    window = make_window()
    window.show()
    edit(window.doc, "X", None, 0, 0, 0.5)
    window.autosave()
    qtbot.waitUntil(window.autosave_path.exists)
    window.doc.undo_stack.undo()
    assert not window.isWindowModified()
    window.autosave()  # what the timer does next
    qtbot.wait(50)
    assert not window.autosave_path.exists()


# Large scenarios: the worker thread ------------------------------------------------------------


def compare_results(got, want, exact: bool) -> None:
    assert isinstance(got, Result)  # the whole layer, not one head of it
    assert got.tokens == want.tokens and got.n_heads == want.n_heads
    for head in range(want.n_heads):
        for name in HEAD_MATRICES:
            a, b = got.matrix(name, head), want.matrix(name, head)
            assert a.shape == b.shape
            np.testing.assert_array_equal(np.isneginf(a), np.isneginf(b))
            if exact:
                np.testing.assert_array_equal(a, b, err_msg=f"{name} {head}")
            else:
                fin = np.isfinite(b)
                np.testing.assert_allclose(a[fin], b[fin], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got.final, want.final, rtol=1e-12, atol=1e-12)


def test_a_large_scenario_computes_while_the_window_answers(shown_window, qtbot, monkeypatch):
    window = shown_window()
    doc = window.doc
    monkeypatch.setattr(QInputDialog, "getInt", lambda *a, **k: (128, True))
    busy: list[bool] = []
    window.compute.busyChanged.connect(busy.append)
    monkeypatch.setattr(main_window, "BUSY_AFTER_MS", 0)  # as if the work lasted
    window.load_preset("gpt2-small")
    s = doc.scenario
    assert s.n == 128
    assert window.compute.busy and not window.busy.text()  # shown only after a while
    # (the window's timers run meanwhile: the computation does not hold the UI thread)
    qtbot.waitUntil(lambda: window.busy.text() == "computing…", timeout=2000)
    window.compute.wait()
    assert busy == [True, False] and not window.busy.text()
    compare_results(window.compute.result, compute(s), exact=False)
    # An independent check of one head against the plain loop reference.
    _, weights, _ = reference.head(np.array(s.X), s.W_Q[3], s.W_K[3], s.W_V[3])
    np.testing.assert_allclose(
        window.compute.result.matrix("weights", 3), weights, rtol=0, atol=1e-12
    )
    np.testing.assert_allclose(
        window.pipeline.views["Q"].spec.values, np.array(s.X) @ s.W_Q[0], rtol=0, atol=1e-12
    )


def test_quick_edits_while_busy_end_with_the_latest_scenario(shown_window, qtbot, monkeypatch):
    window = shown_window()
    doc = window.doc
    monkeypatch.setattr(QInputDialog, "getInt", lambda *a, **k: (128, True))
    published = []
    window.compute.resultChanged.connect(published.append)
    window.load_preset("gpt2-small")
    assert window.compute.busy
    x = window.inputs.grid
    for k in range(5):  # typed faster than the worker computes
        assert x.model().setData(x.model().index(k, 0), str(k + 0.5))
    window.weights.grids[("W_Q", 0)].model().setData(
        window.weights.grids[("W_Q", 0)].model().index(0, 0), "2"
    )
    window.weights.grids[("W_O", None)].matrix_model().set_block(0, 0, np.full((2, 2), 0.25))
    window.compute.wait()
    s = doc.scenario
    assert [s.X[k, 0] for k in range(5)] == [0.5, 1.5, 2.5, 3.5, 4.5]
    np.testing.assert_array_equal(published[-1].final, window.compute.result.final)
    np.testing.assert_array_equal(window.compute.result.X[:5, 0], [0.5, 1.5, 2.5, 3.5, 4.5])
    compare_results(window.compute.result, compute(s), exact=False)
    X = np.array(s.X)
    W = np.array(s.W_Q[0])
    assert W[0, 0] == 2.0
    np.testing.assert_allclose(window.pipeline.views["Q"].spec.values, X @ W, atol=1e-12)
    np.testing.assert_allclose(
        window.compute.result.final, window.compute.result.concat @ np.array(s.W_O), atol=1e-12
    )

    # Undo back to the small example while the large one is still computing.
    window.weights.grids[("W_O", None)].matrix_model().set_block(0, 0, np.full((2, 2), 0.5))
    assert window.compute.busy
    while doc.undo_stack.canUndo():
        doc.undo_stack.undo()
    window.compute.wait()
    assert window.compute.result.tokens == TOKENS
    _, weights, _ = reference.head(
        reference.X, reference.W_Q[1], reference.W_K[1], reference.W_V[1]
    )
    np.testing.assert_allclose(
        window.compute.result.matrix("weights", 1), weights, rtol=0, atol=1e-12
    )
    assert window.pipeline.views["weights"].spec.values.shape == (4, 4)
    qtbot.wait(50)  # nothing stale arrives later
    assert window.compute.result.tokens == TOKENS and not window.compute.busy


def test_opening_a_file_is_undoable(make_window, tmp_path, answers, warnings_shown):
    from attnviz.core.io.files import save_scenario
    from attnviz.core.maths.scenario import Settings
    from attnviz.core.presets import worked_example

    path = tmp_path / "other.attn.json"
    save_scenario(path, worked_example(Settings(mask="none")))
    window = make_window()
    window.show()
    assert window.files.open_path(path)
    assert window.doc.scenario.settings.mask == "none" and window.doc.path == path.resolve()
    assert not window.isWindowModified()
    window.doc.undo_stack.undo()
    assert window.doc.scenario.settings.mask == "causal" and window.doc.path is None
    window.doc.undo_stack.redo()
    assert window.doc.scenario.settings.mask == "none" and not window.isWindowModified()
