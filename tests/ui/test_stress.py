"""Random edits, undo, dock switches and exports in one window: after each, every number
on screen and in every exported file is compute() of the scenario the document holds
(no stale result allowed), whatever the scheduler reused or left out."""

from __future__ import annotations

import numpy as np
import pytest
from test_export import check_cells, svg_root

from attnviz.core.maths.forward import compute
from attnviz.core.presets import random_scenario
from attnviz.ui.heatmap import on_screen

pytestmark = pytest.mark.usefixtures("warnings_shown", "answers")

DOCKS = ("Pipeline", "Masks", "Heads", "Mix", "Lines")
PIPELINE_VIEWS = ("Q", "K", "V", "scores", "scaled", "masked", "weights", "output")


def close(a: np.ndarray, b: np.ndarray, what: str) -> None:
    np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12, err_msg=what)


def check_screen(window) -> int:
    """Every view on screen against compute() of the document; how many were checked."""
    s = window.doc.scenario
    want = compute(s)
    head = window.view_state.head
    checked = 0
    pipeline = window.pipeline
    if on_screen(pipeline):
        for name in PIPELINE_VIEWS:
            close(pipeline.views[name].spec.values, want.matrix(name, head), f"pipeline {name}")
            checked += 1
    heads = window.panel("Heads")
    if on_screen(heads):
        for h, view in enumerate(heads.views):
            close(view.spec.values, want.heads[h].weights, f"heads {h + 1}")
            checked += 1
    mix = window.panel("Mix")
    if on_screen(mix):
        close(mix.final.spec.values, want.final, "mix final")
        d_k = s.d_k
        for h, view in enumerate(mix.parts):
            part = want.heads[h].output @ s.W_O[h * d_k : (h + 1) * d_k]
            close(view.spec.values, part, f"mix head {h + 1}")
        checked += 1
    masks = window.panel("Masks")
    if on_screen(masks):
        other = compute(s.with_settings(mask="causal-zero")).heads[head].weights
        close(masks.views["A"].spec.values, want.heads[head].weights, "masks A")
        close(masks.views["B"].spec.values, other, "masks B")
        checked += 1
    lines = window.panel("Lines")
    if on_screen(lines):
        close(lines.canvas.weights[head], want.heads[head].weights, "lines")
        checked += 1
    return checked


def test_random_actions_never_leave_a_stale_number(shown_window, qtbot, tmp_path):
    s = random_scenario(n=40, d_model=24, heads=20, d_k=4, seed=11)  # on the worker
    window = shown_window(scenario=s)
    window.compute.wait()
    rng = np.random.default_rng(5)
    checked = exports = 0
    for step in range(60):
        action = rng.choice(["edit", "edit", "edit", "undo", "dock", "head", "export"])
        doc = window.doc
        if action == "edit":
            name = str(rng.choice(["X", "W_Q", "W_K", "W_V", "W_O"]))
            head = None if name in ("X", "W_O") else int(rng.integers(doc.scenario.n_heads))
            shape = doc.scenario.matrix(name, head).shape
            row, col = int(rng.integers(shape[0])), int(rng.integers(shape[1]))
            value = np.array([[float(rng.normal())]])
            doc.replace(doc.scenario.with_cells(name, head, row, col, value), "edit")
        elif action == "undo" and doc.undo_stack.canUndo():
            doc.undo_stack.undo()
        elif action == "dock":
            window.bring_forward((str(rng.choice(DOCKS)),))
        elif action == "head":
            window.view_state.set_head(int(rng.integers(doc.scenario.n_heads)))
        elif action == "export":
            folder = tmp_path / f"export{step}"
            folder.mkdir()
            head = window.view_state.head
            row = int(rng.integers(doc.scenario.n))
            doc.replace(doc.scenario.with_cells("X", None, row, 0, np.array([[2.0]])), "edit")
            exported = window.doc.scenario
            window.files.export_all_to(folder)  # while that edit is being computed
            window.files.image_export.wait()
            weights = compute(exported).heads[head].weights
            svg = svg_root(folder / f"head{head + 1}-weights.svg")
            check_cells(svg, exported.tokens, exported.tokens, weights)
            exports += 1
        window.compute.wait()
        for _ in range(3):
            qtbot.wait(1)
        checked += check_screen(window)
    assert checked > 60 and exports > 0
