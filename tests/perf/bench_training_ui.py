"""The window's answer time while a training run plays (a script, not a test).

    python tests/perf/bench_training_ui.py [--actions 20]

In the Train workspace, a run plays (the Training dock) on the worked example and on a
64-token layer of d_model 64 with 4 heads (its own loss, and the toy-corpus task with
the causal-zero comparison run beside). Meanwhile it times, from each action until the
views have redrawn the answer (the result of that version made, every question of the
views answered, the posted paints done): a cell edit (it pauses the run, then applies;
the run is played again after), a click that selects a cell (the Inspector explains
it), and a switch of the shown head. Prints and writes p50/p95 per case and action, the
same with no run playing, and the steps per second, to
benchmarks/results/2026-12-05-issue-38-training-ui.json. Target: p95 ≤ 100 ms.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault(
    "QT_QPA_PLATFORM",
    f"offscreen:configfile={Path(__file__).resolve().parents[1] / 'screen-1440x900.json'}",
)
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from PySide6.QtCore import QEventLoop, QSettings  # noqa: E402
from PySide6.QtWidgets import QApplication  # noqa: E402

from attnviz.core.maths.training_run import RunConfig  # noqa: E402
from attnviz.core.presets import small_model, worked_example  # noqa: E402
from attnviz.ui.app import make_app  # noqa: E402
from attnviz.ui.main_window import MainWindow  # noqa: E402
from attnviz.ui.view_state import Selection  # noqa: E402
from benchmarks.machine import describe  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "2026-12-05-issue-38-training-ui.json"
WIDE = small_model(tuple(f"t{k}" for k in range(64)), 64, 4, 16, seed=1)
CASES = {
    "worked example, its own loss": (worked_example(), RunConfig(lr=0.01)),
    "n 64, d_model 64, 4 heads, its own loss": (WIDE, RunConfig(lr=0.01)),
    "d_model 64, 4 heads, toy-corpus vs causal-zero": (
        WIDE.with_settings(positional="rope"),
        RunConfig(task="toy-corpus", compare="mask", lr=0.02),
    ),
}


def drawn(app: QApplication, done) -> float:
    """Wait until done() says the answer is there, then for the paints it posted; the
    time then."""
    while not done():
        app.processEvents(QEventLoop.ProcessEventsFlag.WaitForMoreEvents, 5)
    app.processEvents()
    app.processEvents()
    return time.perf_counter()


def settled(window: MainWindow):
    """After an edit (the run paused): the edit's whole layer made, every view's question
    about it answered."""
    compute = window.compute
    return lambda: not compute.busy and compute.scheduler.idle()


def head_shown(window: MainWindow, head: int):
    """The newest version's head ``head`` made (the views draw it from there)."""
    compute = window.compute
    return lambda: not compute.busy or (compute.shown is not None and compute.shown.index == head)


def run_case(
    app: QApplication, scenario, config: RunConfig, actions: int, play: bool
) -> dict[str, list[float]]:
    folder = Path(tempfile.mkdtemp())
    window = MainWindow(QSettings(str(folder / "s.ini"), QSettings.Format.IniFormat), folder)
    window.resize(1440, 900)
    window.show()
    window.doc.start_from(scenario, "bench", "bench")
    window.workspaces.switch("train")
    panel = window.training_panel
    panel.set_config(config)
    times: dict[str, list[float]] = {"edit": [], "select": [], "head": []}
    rates = []

    def play_a_while(seconds: float = 0.4) -> None:
        if play and not window.training.running:
            panel.toggle()
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            app.processEvents(QEventLoop.ProcessEventsFlag.WaitForMoreEvents, 20)

    grid = window.weights.grids[("W_Q", 0)].matrix_model()
    for k in range(actions + 2):
        play_a_while()
        if window.training.progress is not None:
            rates.append(window.training.progress.steps_per_second)
        selection = Selection("weights", 0, k % 4, (k + 1) % 4)
        explained = []
        window.compute.answered.connect(
            lambda name, value, sel=selection, got=explained: got.append(
                name == "inspector" and value[0] == sel
            )
        )
        t0 = time.perf_counter()
        window.view_state.select(selection)  # the Inspector explains it
        times["select"].append(drawn(app, lambda got=explained: any(got)) - t0)
        window.compute.answered.disconnect()
        play_a_while(0.1)
        head = (k + 1) % window.doc.n_heads
        t0 = time.perf_counter()
        window.view_state.set_head(head)
        times["head"].append(drawn(app, head_shown(window, head)) - t0)
        play_a_while(0.1)
        t0 = time.perf_counter()
        grid.setData(grid.index(k % 2, k % 2), str(0.1 * (k % 5)))  # pauses the run first
        times["edit"].append(drawn(app, settled(window)) - t0)
    window.training.pause(wait=True)
    window.doc.undo_stack.setClean()
    window.close()
    return {name: values[2:] for name, values in times.items()} | {"rate": rates[2:]}


def ms(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))], 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--actions", type=int, default=20)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    app = make_app()
    rows = []
    for name, (scenario, config) in CASES.items():
        idle = run_case(app, scenario, config, args.actions, play=False)
        got = run_case(app, scenario, config, args.actions, play=True)
        rate = round(statistics.median(got["rate"]), 1) if got["rate"] else 0.0
        for action in ("edit", "select", "head"):
            row = [name, action, ms(got[action], 0.5), ms(got[action], 0.95),
                   ms(idle[action], 0.5), ms(idle[action], 0.95), rate]  # fmt: skip
            rows.append(row)
            print(*row, sep=" | ", flush=True)
    result = {
        "title": "Issue 38: the window's answer while a training run plays",
        "what": (
            "The Train workspace at 1440 × 900 (offscreen) while the Training dock plays a run "
            "(Adam): the time from an action until the views have drawn the answer. edit: a "
            "cell of W_Q typed in (it pauses the run first, then applies); select: a click that "
            "selects a cell (the Inspector explains it); head: the shown head switched. "
            f"{args.actions} of each per case, the first two dropped. Steps per second: the "
            "run's own rate while it plays (the comparison run's steps included). Target: "
            "p95 ≤ 100 ms. The same actions with no run playing, measured just before, for "
            "comparison."
        ),
        "command": "python tests/perf/bench_training_ui.py",
        "machine": describe(),
        "tables": [
            {
                "caption": "Action to answer drawn, while training",
                "columns": [
                    "case",
                    "action",
                    "training p50 ms",
                    "training p95 ms",
                    "no run p50 ms",
                    "no run p95 ms",
                    "steps/s",
                ],
                "rows": rows,
            }
        ],
    }
    if not args.no_write:
        OUT.write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n", "utf-8")
        print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
