"""Write the training tasks under resources/tasks/ (each a few KB), seeded.

python packaging/make_tasks.py

Each task is a vocabulary and examples: a sequence of tokens and, at each position, the
token the model should predict there ("_" where nothing is asked), split into training
and held-out examples. ``attnviz.core.maths.tasks`` reads them; the test suite checks
that every file equals what this script makes.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np

FOLDER = Path(__file__).resolve().parent.parent / "resources" / "tasks"
Example = tuple[list[str], list[str]]  # tokens, targets ("_": not scored)

NOUNS = ("cat", "dog", "bird", "fox", "cow", "owl")
VERBS = ("sat", "slept", "stood", "lay")
PLACES = ("mat", "rug", "bed", "log")
LETTERS = tuple("abcdefghijkl")
COUNT = 160  # examples a task (the toy corpus has 96 sentences): 16 held out


def toy_corpus(rng: np.random.Generator) -> Example:
    """A short sentence over the worked example's words and a few more: each position
    predicts the next word."""
    words = ["the", rng.choice(NOUNS), rng.choice(VERBS), "on", "the", rng.choice(PLACES), "."]
    return [str(w) for w in words], [str(w) for w in words[1:]] + ["_"]


def copy(rng: np.random.Generator) -> Example:
    """Four letters, "=", the same four again: from "=" each position predicts the letter
    four places back, the next one to copy."""
    letters = [str(c) for c in rng.choice(LETTERS, 4, replace=False)]
    return [*letters, "=", *letters], ["_"] * 4 + letters + ["_"]


def previous_token(rng: np.random.Generator) -> Example:
    """Eight random letters: each position from the second predicts the letter before it."""
    letters = [str(c) for c in rng.choice(LETTERS, 8)]
    return letters, ["_", *letters[:-1]]


def previous_and_first(rng: np.random.Generator) -> Example:
    """Eight random letters: each position from the third predicts two tokens at once
    ("b+A": each half the probability), the letter before it and the first letter in
    capitals. Two patterns, each with its own map from what is read to what is said: one
    head cannot do both, two can."""
    letters = [str(c) for c in rng.choice(LETTERS, 8)]
    targets = [f"{letters[i - 1]}+{letters[0].upper()}" for i in range(2, 8)]
    return letters, ["_", "_", *targets]


def induction(rng: np.random.Generator) -> Example:
    """Letters with a pair A B early and A again last: the last position predicts B
    (… A B … A → B). One attention layer alone cannot: it needs a previous-token head
    in a layer before it."""
    letters = [str(c) for c in rng.choice(LETTERS, 7, replace=False)]
    return [*letters, letters[1]], ["_"] * 7 + [letters[2]]


TASKS: dict[str, tuple[str, str, Callable[[np.random.Generator], Example]]] = {
    "toy-corpus": (
        "Toy corpus",
        "next word of short sentences such as “the cat sat on the mat .”",
        toy_corpus,
    ),
    "copy": ("Copy", "four letters, “=”, and the same four again: copy them", copy),
    "previous-token": ("Previous token", "name the letter before each position", previous_token),
    "previous-and-first": (
        "Previous and first",
        "name the letter before each position and the first letter in capitals, both at once",
        previous_and_first,
    ),
    "induction": ("Induction", "… A B … A → B: one layer alone cannot", induction),
}
HELD_OUT = 16  # the last examples of each task


def distinct(make: Callable[[np.random.Generator], Example], seed: int) -> list[Example]:
    """COUNT different examples (fewer if the task has fewer): none held out is trained on."""
    rng = np.random.default_rng(seed)
    seen: dict[str, Example] = {}
    for _ in range(50 * COUNT):
        tokens, targets = make(rng)
        seen.setdefault(" ".join(tokens), (tokens, targets))
        if len(seen) == COUNT:
            break
    return list(seen.values())


def document(name: str) -> dict[str, object]:
    title, description, make = TASKS[name]
    examples = distinct(make, zlib.crc32(name.encode()))
    said = {w for _, targets in examples for t in targets for w in t.split("+")}
    vocabulary = sorted({t for tokens, _ in examples for t in tokens} | said - {"_"})
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
