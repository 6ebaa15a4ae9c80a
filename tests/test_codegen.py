"""Exported scripts run without attnviz and print the engine's numbers.

Each case writes the script to a temporary folder and runs it in a fresh interpreter
with PYTHONPATH removed, so the only attnviz it could reach is an installed one, and the
script text is checked to import no attnviz at all.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from attnviz.core.io.codegen import to_script
from attnviz.core.maths.engine import compute
from attnviz.core.maths.scenario import MASKS, Scenario, Settings
from attnviz.core.presets import random_scenario, worked_example

HAS_TORCH = importlib.util.find_spec("torch") is not None
IMPORTS_ATTNVIZ = re.compile(r"^\s*(import|from)\s+attnviz", re.MULTILINE)
IMPORTS_TORCH = re.compile(r"^\s*(import|from)\s+torch", re.MULTILINE)


def run_script(text: str, tmp_path) -> dict[str, np.ndarray]:
    """Run an exported script; its output parsed as {title: matrix} (the documented format)."""
    assert not IMPORTS_ATTNVIZ.search(text)
    path = tmp_path / "attention.py"
    path.write_text(text, encoding="ascii")  # the script is pure ASCII by design
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, str(path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    sections: dict[str, list[list[float]]] = {}
    title = None
    for line in done.stdout.splitlines():
        if line.startswith("#"):
            continue
        if line.startswith("["):
            assert title is not None, line
            sections[title].append(json.loads(line))
        else:
            title = line
            assert title not in sections, f"{title!r} printed twice"
            sections[title] = []
    return {name: np.array(rows, dtype=np.float64) for name, rows in sections.items()}


def assert_matches_engine(s: Scenario, printed: dict[str, np.ndarray]) -> None:
    ref = compute(s)
    expected = [f"head {h + 1} weights" for h in range(ref.n_heads)] + ["output"]
    assert list(printed) == expected
    for h in range(ref.n_heads):
        np.testing.assert_allclose(
            printed[f"head {h + 1} weights"], ref.heads[h].weights, rtol=0, atol=1e-12
        )
    np.testing.assert_allclose(printed["output"], ref.final, rtol=0, atol=1e-12)


RANDOM = random_scenario(n=6, d_model=8, heads=3, d_k=4, seed=1)

NUMPY_CASES = {
    **{
        f"{mask}-{'scaled' if scale else 'unscaled'}": worked_example(
            Settings(mask=mask, scale=scale)
        )
        for mask in MASKS
        for scale in (True, False)
    },
    "no-projections": worked_example(Settings(projections=False, scale=False, mask="none")),
    "no-projections-causal-ablated": worked_example(Settings(projections=False, ablated=(0,))),
    "sinusoidal": worked_example(Settings(positional="sinusoidal")),
    "dropout": worked_example(Settings(mask="none", dropout=0.3, dropout_seed=5)),
    "ablated": worked_example(Settings(ablated=(1,))),
    "random": RANDOM,
    "random-everything": RANDOM.with_settings(
        mask="causal-zero", positional="sinusoidal", dropout=0.3, dropout_seed=5, ablated=(0, 2)
    ),
}

TORCH_CASES = {
    "worked-example": worked_example(),
    "no-projections": worked_example(Settings(projections=False, mask="drop-after-softmax")),
    "dropout-sinusoidal": worked_example(
        Settings(mask="none", positional="sinusoidal", dropout=0.3, dropout_seed=5)
    ),
    "random-ablated": RANDOM.with_settings(mask="causal-zero", scale=False, ablated=(1,)),
}


@pytest.mark.parametrize("name", NUMPY_CASES)
def test_numpy_script_prints_the_engine_numbers(name, tmp_path):
    s = NUMPY_CASES[name]
    text = to_script(s, "numpy")
    assert not IMPORTS_TORCH.search(text)
    assert_matches_engine(s, run_script(text, tmp_path))


@pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")
@pytest.mark.parametrize("name", TORCH_CASES)
def test_torch_script_prints_the_engine_numbers(name, tmp_path):
    s = TORCH_CASES[name]
    text = to_script(s, "torch")
    assert IMPORTS_TORCH.search(text)
    assert_matches_engine(s, run_script(text, tmp_path))


def test_the_script_embeds_the_numbers_exactly():
    s = RANDOM
    text = to_script(s)
    for value in (s.X[0, 0], s.W_Q[2, 7, 3], s.W_O[-1, -1]):
        assert repr(float(value)) in text
    assert "ABLATED = ()" in text


def test_odd_tokens_and_source_cannot_break_the_script(tmp_path):
    tokens = ("猫", 'a"""b', "x\u2028y", "#]")  # a line break of sorts; \n is refused
    s = worked_example(Settings(mask="none")).with_tokens(tokens)
    text = to_script(s, source='evil"""\nimport os; os.remove("x")  # é.attn.json')
    assert text.isascii()
    assert "\nimport os" not in text
    assert text.startswith('"""') and "Exported from: 'evil" in text
    assert_matches_engine(s, run_script(text, tmp_path))


def test_header_names_the_scenario():
    text = to_script(worked_example(), "torch", source="worked-example")
    head = text[: text.index("import")]
    assert "PyTorch" in head and "'worked-example'" in head
    assert "4 tokens, d_model 4, 2 heads of d_k 2" in head and "causal mask" in head


@pytest.mark.parametrize("flavor", ["jax", "NumPy", ""])
def test_unknown_flavor_is_refused(flavor):
    with pytest.raises(ValueError, match=re.escape(repr(flavor))):
        to_script(worked_example(), flavor)
