"""Training speed (a script, not a test).

    python tests/perf/bench_training.py [--steps 300] [--rounds 3]

Adam on W_Q, W_K, W_V and W_O with the scenario's loss: the worked example (target loss;
target ≥ 2,000 steps per second) and a 64-token, d_model 64, 4-head next-token scenario
(target ≥ 200 steps per second, and a step ≤ 4 × compute() of the same scenario, timed
interleaved in the same run). Prints the medians over the rounds.
"""

from __future__ import annotations

import argparse
import statistics
import time

from attnviz.core.maths.forward import compute
from attnviz.core.maths.optimizers import Optimizer, State, train_step
from attnviz.core.maths.scenario import Scenario
from attnviz.core.presets import small_model, worked_example

TRAINS = ("W_Q", "W_K", "W_V", "W_O")


def per_step(s: Scenario, steps: int) -> tuple[float, float]:
    """Seconds per training step and per forward pass, measured one after the other."""
    state, opt = State(), Optimizer("adam", lr=0.01)
    t0 = time.perf_counter()
    for _ in range(steps):
        s, state, _ = train_step(s, opt, state, TRAINS)
    t1 = time.perf_counter()
    for _ in range(steps):
        compute(s)
    t2 = time.perf_counter()
    return (t1 - t0) / steps, (t2 - t1) / steps


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    tokens = tuple(f"t{i % 20}" for i in range(64))
    cases = {
        "worked example, target loss": (worked_example(), 2000),
        "64 tokens, d_model 64, 4 heads, next-token": (
            small_model(tokens, 64, 4, 16, seed=0).with_settings(loss="next-token"),
            200,
        ),
    }
    for label, (s, goal) in cases.items():
        per_step(s, 20)  # warm caches
        runs = [per_step(s, args.steps) for _ in range(args.rounds)]
        step = statistics.median(r[0] for r in runs)
        ratio = statistics.median(r[0] / r[1] for r in runs)
        print(
            f"{label}: {1 / step:,.0f} steps/s (target ≥ {goal:,}); a step is {ratio:.2f} × "
            "compute()"
        )


if __name__ == "__main__":
    main()
