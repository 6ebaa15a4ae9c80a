"""Write the training tasks under resources/tasks/ (each a few KB), seeded.

python packaging/make_tasks.py

Each task is a vocabulary and examples: a sequence of tokens and, at each position, the
token the model should predict there ("_" where nothing is asked), split into training
and held-out examples. ``attnviz.core.maths.tasks`` reads them; the test suite checks
that every file equals what this script makes.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np

FOLDER = Path(__file__).resolve().parent.parent / "resources" / "tasks"
Example = tuple[list[str], list[str]]  # tokens, targets ("_": not scored)

NOUNS = ("cat", "dog", "bird", "fox", "cow", "owl")
VERBS = ("sat", "slept", "stood", "lay")
PLACES = ("mat", "rug", "bed", "log")
LETTERS = tuple("abcdefghijkl")
COUNT = 160  # examples a task: 144 to train on, 16 held out


def toy_corpus(rng: np.random.Generator) -> list[Example]:
    """Short sentences over the worked example's words and a few more: each position
    predicts the next word."""
    examples = []
    for _ in range(COUNT):
        words = ["the", rng.choice(NOUNS), rng.choice(VERBS), "on", "the",
                 rng.choice(PLACES), "."]  # fmt: skip
        examples.append(([str(w) for w in words], [str(w) for w in words[1:]] + ["_"]))
    return examples


def copy(rng: np.random.Generator) -> list[Example]:
    """Four letters, "=", the same four again: from "=" each position predicts the letter
    four places back, the next one to copy."""
    examples = []
    for _ in range(COUNT):
        letters = [str(c) for c in rng.choice(LETTERS, 4, replace=False)]
        tokens = [*letters, "=", *letters]
        examples.append((tokens, ["_"] * 4 + letters[:4] + ["_"]))
    return examples


def previous_token(rng: np.random.Generator) -> list[Example]:
    """Eight random letters: each position from the second predicts the letter before it."""
    examples = []
    for _ in range(COUNT):
        letters = [str(c) for c in rng.choice(LETTERS, 8)]
        examples.append((letters, ["_", *letters[:-1]]))
    return examples


def induction(rng: np.random.Generator) -> list[Example]:
    """Letters with a pair A B early and A again last: the last position predicts B
    (… A B … A → B). One attention layer alone cannot: it needs a previous-token head
    in a layer before it."""
    examples = []
    for _ in range(COUNT):
        letters = [str(c) for c in rng.choice(LETTERS, 7, replace=False)]
        a, b = letters[1], letters[2]
        tokens = [*letters, a]
        examples.append((tokens, ["_"] * 7 + [b]))
    return examples


TASKS: dict[str, tuple[str, str, Callable[[np.random.Generator], list[Example]]]] = {
    "toy-corpus": (
        "Toy corpus",
        "next word of short sentences such as “the cat sat on the mat .”",
        toy_corpus,
    ),
    "copy": ("Copy", "four letters, “=”, and the same four again: copy them", copy),
    "previous-token": ("Previous token", "name the letter before each position", previous_token),
    "induction": ("Induction", "… A B … A → B: one layer alone cannot", induction),
}
HELD_OUT = 16  # the last examples of each task


def document(name: str) -> dict[str, object]:
    title, description, make = TASKS[name]
    examples = make(np.random.default_rng(sorted(TASKS).index(name) + 1))
    vocabulary = sorted({t for tokens, _ in examples for t in tokens})
    rows = [[" ".join(tokens), " ".join(targets)] for tokens, targets in examples]
    return {
        "format": "attnviz-task",
        "version": 1,
        "name": name,
        "title": title,
        "description": description,
        "vocabulary": vocabulary,
        "train": rows[:-HELD_OUT],
        "held_out": rows[-HELD_OUT:],
    }


def text(name: str) -> str:
    """The document as JSON with one example a line."""
    doc = document(name)
    lines = [f"{json.dumps(k)}: {json.dumps(v, ensure_ascii=False)}" for k, v in doc.items()
             if k not in ("train", "held_out")]  # fmt: skip
    for split in ("train", "held_out"):
        rows = ",\n  ".join(json.dumps(row, ensure_ascii=False) for row in doc[split])  # type: ignore[attr-defined]
        lines.append(f"{json.dumps(split)}: [\n  {rows}\n]")
    return "{\n" + ",\n".join(lines) + "\n}\n"


def main() -> None:
    FOLDER.mkdir(parents=True, exist_ok=True)
    for name in TASKS:
        (FOLDER / f"{name}.task.json").write_text(text(name), encoding="utf-8")
        print(f"wrote {name}.task.json")


if __name__ == "__main__":
    main()
