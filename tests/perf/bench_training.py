"""Training speed (a script, not a test): writes its figures as data.

    python tests/perf/bench_training.py [--steps 300] [--rounds 3] [--out PATH]

Adam through the Trainer: the worked example on its own target loss (target ≥ 2,000 steps
per second); a 64-token, d_model 64, 4-head next-token scenario (target ≥ 200 steps per
second, and a step ≤ 4 × compute() of the same scenario, timed interleaved in the same
run); and lesson 10's toy-corpus task (batches of 8 sentences through the embedding
table), for what the Training dock can reach. Medians over the rounds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from attnviz.core.maths.forward import compute
from attnviz.core.maths.optimizers import Optimizer
from attnviz.core.maths.scenario import Scenario
from attnviz.core.maths.tasks import load_task
from attnviz.core.maths.training import Trainer
from attnviz.core.presets import make_preset, small_model, worked_example

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
from machine import commit, describe  # noqa: E402


def per_step(s: Scenario, task: str | None, steps: int) -> tuple[float, float]:
    """Seconds per training step and per forward pass of the shown scenario, one after
    the other."""
    trainer = Trainer(s, Optimizer("adam", lr=0.01), None if task is None else load_task(task))
    t0 = time.perf_counter()
    for _ in range(steps):
        trainer.step()
    t1 = time.perf_counter()
    shown = trainer.scenario
    for _ in range(steps):
        compute(shown)
    t2 = time.perf_counter()
    return (t1 - t0) / steps, (t2 - t1) / steps


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/training.json")
    args = p.parse_args()
    tokens = tuple(f"t{i % 20}" for i in range(64))
    cases = {
        "worked example, target loss": (worked_example(), None, "≥ 2,000"),
        "64 tokens, d_model 64, 4 heads, next-token": (
            small_model(tokens, 64, 4, 16, seed=0).with_settings(loss="next-token"),
            None,
            "≥ 200",
        ),
        "lesson 10: toy-corpus task, batches of 8": (
            make_preset("stage-10-leak"),
            "toy-corpus",
            "",
        ),
    }
    rows = []
    for label, (s, task, goal) in cases.items():
        per_step(s, task, 20)  # warm caches
        runs = [per_step(s, task, args.steps) for _ in range(args.rounds)]
        step = statistics.median(r[0] for r in runs)
        ratio = statistics.median(r[0] / r[1] for r in runs)
        rows.append([label, f"{1 / step:,.0f}", goal or "–", f"{ratio:.2f}"])
        print(f"{label}: {1 / step:,.0f} steps/s (target {goal or 'none'}); a step is "
              f"{ratio:.2f} × compute() of the shown scenario")  # fmt: skip
    result = {
        "title": "Issue 38: training steps per second",
        "what": "Adam through the Trainer, headless, one thread; a step against a forward "
        "pass (compute()) of the shown scenario timed right after it in the same run (for "
        "the task: one sentence against a batch of 8). Medians over "
        f"{args.rounds} rounds of {args.steps} steps.",
        "command": "python tests/perf/bench_training.py",
        "machine": describe(),
        "commits": {"measured": commit(ROOT)},
        "tables": [
            {
                "caption": "Training speed",
                "columns": ["case", "steps/s", "target steps/s", "step ÷ forward"],
                "rows": rows,
            }
        ],
        "notes": ["Target for the 64-token case: a step costs at most 4 × the forward pass."],
    }
    args.out.write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n", "utf-8")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
