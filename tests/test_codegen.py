"""Exported scripts run without attnviz and print the engine's numbers.

Each case writes the script to a temporary folder and runs it in a fresh interpreter
with PYTHONPATH removed, so the only attnviz it could reach is an installed one, and the
script text is checked to import no attnviz at all. The many variant cases (what current
models add) share one such interpreter per flavor, each script run as its own __main__,
so that torch is imported once.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from attnviz.core.io.codegen import FLAVORS, to_script
from attnviz.core.maths.forward import compute
from attnviz.core.maths.scenario import (
    MASKS,
    Scenario,
    Settings,
    resized,
    with_cross_attention,
    with_kv_heads,
)
from attnviz.core.presets import make_preset, random_scenario, worked_example

HAS_TORCH = importlib.util.find_spec("torch") is not None
IMPORTS_ATTNVIZ = re.compile(r"^\s*(import|from)\s+attnviz", re.MULTILINE)
IMPORTS_TORCH = re.compile(r"^\s*(import|from)\s+torch", re.MULTILINE)


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def parse_output(stdout: str) -> dict[str, np.ndarray]:
    """A script's output parsed as {title: matrix} (the documented format)."""
    sections: dict[str, list[list[float]]] = {}
    title = None
    for line in stdout.splitlines():
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


def run_script(text: str, tmp_path) -> dict[str, np.ndarray]:
    """Run an exported script; its output parsed as {title: matrix} (the documented format)."""
    assert not IMPORTS_ATTNVIZ.search(text)
    path = tmp_path / "attention.py"
    path.write_text(text, encoding="ascii")  # the script is pure ASCII by design
    done = subprocess.run(
        [sys.executable, str(path)],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return parse_output(done.stdout)


# Runs each script given on the command line as __main__, its output captured; prints
# {script: {"stdout": ...} or {"error": traceback}} as JSON.
_RUN_MANY = """\
import contextlib, io, json, runpy, sys, traceback
results = {}
for path in sys.argv[1:]:
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            runpy.run_path(path, run_name="__main__")
        results[path] = {"stdout": out.getvalue()}
    except BaseException:
        results[path] = {"error": traceback.format_exc()}
sys.stdout.write(json.dumps(results))
"""


def run_scripts(texts: dict[str, str], folder) -> dict[str, dict[str, str]]:
    """Run several exported scripts, by name, in one fresh interpreter; for each name
    {"stdout": its output} or {"error": its traceback}."""
    paths = {}
    for i, (name, text) in enumerate(texts.items()):
        assert not IMPORTS_ATTNVIZ.search(text), name
        path = folder / f"attention_{i}.py"
        path.write_text(text, encoding="ascii")
        paths[name] = str(path)
    done = subprocess.run(
        [sys.executable, "-c", _RUN_MANY, *paths.values()],
        cwd=folder,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    results = json.loads(done.stdout)
    return {name: results[path] for name, path in paths.items()}


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


# What current models add, alone and combined. Four query heads (so that two key/value
# heads make GQA and one MQA); random, not neutral, biases and norm weights.
BASE = random_scenario(n=5, d_model=8, heads=4, d_k=4, seed=3)
GQA = with_kv_heads(BASE, 2)
MQA = with_kv_heads(BASE, 1)


def with_biases(s: Scenario, seed: int = 0, output: bool = True) -> Scenario:
    """s with random b_Q, b_K, b_V (and b_O) of the right shapes."""
    rng = np.random.default_rng(seed)
    biases = {name: rng.normal(size=getattr(s, name).shape) for name in ("b_Q", "b_K", "b_V")}
    if output:
        biases["b_O"] = rng.normal(size=(1, s.d_model))
    return dataclasses.replace(s, **biases)


def with_relative_bias(s: Scenario, seed: int = 0, **settings: object) -> Scenario:
    """s under T5's relative position bias, its table (buckets × heads) random."""
    s = s.with_settings(positional="relative-bias", **settings)
    table = np.random.default_rng(seed).normal(size=(s.settings.relative_buckets, s.n_heads))
    return dataclasses.replace(s, relative_bias=table)


def with_norm_weights(s: Scenario, seed: int = 0) -> Scenario:
    """s under QK-norm with norm weights that are not 1 (and a larger epsilon)."""
    rng = np.random.default_rng(seed)
    s = dataclasses.replace(
        s,
        q_norm=rng.uniform(0.5, 2.0, size=s.q_norm.shape),
        k_norm=rng.uniform(-2.0, 2.0, size=s.k_norm.shape),
    )
    return s.with_settings(qk_norm="rms", qk_norm_eps=1e-3)


def cross(s: Scenario, m: int, alignment: str = "top-left", seed: int = 0) -> Scenario:
    """s with m key tokens of its own (random X_kv): cross-attention."""
    s = resized(with_cross_attention(s, True), m=m)
    X_kv = np.random.default_rng(seed).normal(size=(m, s.d_model))
    return dataclasses.replace(s, X_kv=X_kv).with_settings(causal_alignment=alignment)


def custom_mask(s: Scenario, empty_row: int | None = None, seed: int = 0) -> Scenario:
    """s under a random custom mask; empty_row: a query that may attend no key at all."""
    mask = (np.random.default_rng(seed).random((s.n, s.m)) < 0.6).astype(np.float64)
    mask[:, 0] = 1.0
    if empty_row is not None:
        mask[empty_row] = 0.0
    return dataclasses.replace(s.with_settings(mask="custom"), mask_matrix=mask)


SIX_HEADS = random_scenario(n=5, d_model=6, heads=6, d_k=2, seed=4)  # not a power of two

VARIANT_CASES = {
    "gqa": GQA,
    "mqa": MQA,
    "gqa-unscaled-causal-zero": GQA.with_settings(scale=False, mask="causal-zero"),
    "biases": with_biases(BASE),
    "biases-gqa": with_biases(GQA, seed=1),
    "output-bias-only": dataclasses.replace(BASE, b_O=np.arange(8.0).reshape(1, 8)),
    "cross-more-keys": cross(BASE, m=7),
    "cross-more-keys-bottom-right": cross(BASE, m=7, alignment="bottom-right"),
    "cross-fewer-keys-top-left": cross(BASE, m=3),
    # bottom-right with n > m: the first queries sit before every key, so see none
    "cross-fewer-keys-bottom-right": cross(BASE, m=3, alignment="bottom-right"),
    "cross-no-mask": cross(BASE, m=6).with_settings(mask="none"),
    "cross-sinusoidal-drop-after-softmax": cross(BASE, m=6, alignment="bottom-right").with_settings(
        positional="sinusoidal", mask="drop-after-softmax"
    ),
    "qk-norm": BASE.with_settings(qk_norm="rms"),
    "qk-norm-weights-gqa": with_norm_weights(GQA),
    "qk-norm-whole": BASE.with_settings(qk_norm="rms-whole"),
    "qk-norm-whole-weights-gqa-rope": with_norm_weights(GQA).with_settings(
        qk_norm="rms-whole", positional="rope"
    ),
    "qk-norm-whole-no-projections-cross": cross(BASE, m=6).with_settings(
        projections=False, qk_norm="rms-whole"
    ),
    "rope-half": BASE.with_settings(positional="rope"),
    "rope-half-partial": BASE.with_settings(positional="rope", rope_dims=2, rope_base=100.0),
    "rope-interleaved": BASE.with_settings(positional="rope", rope_style="interleaved"),
    "rope-scaled": BASE.with_settings(
        positional="rope", rope_frequencies=(0.8, 0.011), rope_factor=1.2
    ),
    "rope-interleaved-partial": random_scenario(
        n=5, d_model=8, heads=2, d_k=6, seed=5
    ).with_settings(positional="rope", rope_style="interleaved", rope_dims=4, rope_base=50.0),
    "alibi-default": BASE.with_settings(positional="alibi"),
    "alibi-default-six-heads": SIX_HEADS.with_settings(positional="alibi", mask="none"),
    "alibi-default-three-heads": resized(BASE, heads=3).with_settings(positional="alibi"),
    "alibi-given": BASE.with_settings(positional="alibi", alibi_slopes=(0.5, -0.25, 2.0, 0.0)),
    # T5's: 3 buckets a direction, distances 0 and 1 exact, 2 and beyond the last
    "relative-bias": with_relative_bias(
        BASE, relative_buckets=6, relative_max_distance=3, scale=False
    ),
    "relative-bias-decoder-cross": with_relative_bias(
        cross(GQA, m=7, alignment="bottom-right"),
        seed=1,
        relative_buckets=5,
        relative_max_distance=4,
        relative_bidirectional=False,
        softcap=2.0,
    ),
    "softcap": BASE.with_settings(scale=False, softcap=1.5),
    "sinks": BASE.with_settings(sinks=(0.5, -1.0, 3.0, 0.0)),
    "sinks-no-mask": GQA.with_settings(mask="none", sinks=(-2.0, 0.0, 1.0, 4.0)),
    "scale-value": BASE.with_settings(scale_value=0.9),
    "scale-value-off": BASE.with_settings(scale=False, scale_value=0.9),
    "sliding-window": BASE.with_settings(mask="sliding-window", window=2),
    "sliding-window-cross": cross(BASE, m=8, alignment="bottom-right").with_settings(
        mask="sliding-window", window=3
    ),
    # top-left, n > m, window 1: the last queries' windows hold no key
    "sliding-window-cross-empty": cross(BASE, m=3).with_settings(mask="sliding-window", window=1),
    "custom": custom_mask(BASE),
    "custom-empty-row": custom_mask(BASE, empty_row=2),
    "custom-cross-empty-row": custom_mask(cross(BASE, m=6), empty_row=0, seed=1),
    "custom-empty-row-sinks": custom_mask(BASE, empty_row=1).with_settings(
        sinks=(1.0, 1.0, -1.0, 0.0)
    ),
    "no-projections-rope": BASE.with_settings(projections=False, positional="rope"),
    # an odd d_model: the last feature has no partner and stays as it is
    "no-projections-rope-odd-width": random_scenario(
        n=4, d_model=5, heads=1, d_k=4, seed=6
    ).with_settings(projections=False, positional="rope"),
    # d_k 1: nothing to pair, so RoPE changes nothing
    "rope-d_k-1": random_scenario(n=4, d_model=4, heads=2, d_k=1, seed=7).with_settings(
        positional="rope"
    ),
    "no-projections-rope-partial-interleaved": BASE.with_settings(
        projections=False, positional="rope", rope_style="interleaved", rope_dims=4
    ),
    "no-projections-cross-alibi-sinks-qk-norm": with_norm_weights(cross(BASE, m=6)).with_settings(
        projections=False, positional="alibi", sinks=(0.3, 0.0, 0.0, 0.0)
    ),
    "everything": with_biases(
        with_norm_weights(cross(GQA, m=7, alignment="bottom-right"))
    ).with_settings(
        positional="rope",
        rope_style="interleaved",
        rope_dims=2,
        softcap=3.0,
        scale_value=0.7,
        sinks=(0.1, -0.2, 0.3, 0.4),
        dropout=0.25,
        dropout_seed=9,
        ablated=(1,),
    ),
    "everything-alibi-custom": custom_mask(
        with_biases(with_norm_weights(MQA), seed=2), empty_row=3, seed=2
    ).with_settings(positional="alibi", softcap=2.0, scale_value=1.3, ablated=(0, 3)),
    "mqa-alibi-window-sinks": with_kv_heads(SIX_HEADS, 1).with_settings(
        positional="alibi", mask="sliding-window", window=2, sinks=(0.0,) * 6
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


@pytest.fixture(scope="module")
def variant_runs(request, tmp_path_factory) -> dict[str, dict[str, str]]:
    """Every variant case's script of one flavor (request.param), run in one interpreter."""
    flavor = request.param
    if flavor == "torch" and not HAS_TORCH:
        pytest.skip("torch is not installed")
    texts = {
        name: to_script(s, flavor)
        for name, s in VARIANT_CASES.items()
        if flavor != "tiled" or tiled_kernel_does(s)
    }
    return run_scripts(texts, tmp_path_factory.mktemp(flavor))


def tiled_kernel_does(s) -> bool:
    """A tiled kernel masks with −∞ and has no dropout (the tiled script refuses the rest)."""
    return (
        s.settings.mask in ("none", "causal", "sliding-window", "custom") and not s.settings.dropout
    )


def variant_output(runs: dict[str, dict[str, str]], name: str) -> dict[str, np.ndarray]:
    if name not in runs:
        pytest.skip("the tiled script refuses what a kernel does not do (tested below)")
    run = runs[name]
    assert "error" not in run, run.get("error")
    return parse_output(run["stdout"])


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


@pytest.mark.parametrize("variant_runs", FLAVORS, indirect=True)
@pytest.mark.parametrize("name", VARIANT_CASES)
def test_script_reproduces_each_variant(name, variant_runs):
    assert_matches_engine(VARIANT_CASES[name], variant_output(variant_runs, name))


@pytest.mark.parametrize("variant_runs", FLAVORS, indirect=True)
@pytest.mark.parametrize(
    "name",
    [
        "cross-fewer-keys-bottom-right",
        "sliding-window-cross-empty",
        "custom-empty-row",
        "custom-cross-empty-row",
        "everything-alibi-custom",
    ],
)
def test_a_query_that_may_attend_no_key_gets_weights_0_not_nan(name, variant_runs):
    s = VARIANT_CASES[name]
    empty = compute(s).empty_rows  # (heads, n)
    assert empty.any()
    printed = variant_output(variant_runs, name)
    for h in range(s.n_heads):
        weights = printed[f"head {h + 1} weights"]
        assert np.isfinite(weights).all()
        assert (weights[empty[h]] == 0.0).all()
    assert np.isfinite(printed["output"]).all()


# The ALiBi paper's slopes, worked out by hand: 2^(-8k/H) for H a power of two; for six
# heads (BLOOM) the four of H = 4, then slopes 1 and 3 of H = 8; for three, the two of
# H = 2, then slope 1 of H = 4.
PAPER_SLOPES = {
    "alibi-default": (2**-2, 2**-4, 2**-6, 2**-8),
    "alibi-default-six-heads": (2**-2, 2**-4, 2**-6, 2**-8, 2**-1, 2**-3),
    "alibi-default-three-heads": (2**-4, 2**-8, 2**-2),
}


@pytest.mark.parametrize("variant_runs", FLAVORS, indirect=True)
@pytest.mark.parametrize("name", PAPER_SLOPES)
def test_default_alibi_slopes_are_the_papers(name, variant_runs):
    given = VARIANT_CASES[name].with_settings(alibi_slopes=PAPER_SLOPES[name])
    assert_matches_engine(given, variant_output(variant_runs, name))


# A line of each optional part of the script: it appears exactly when the scenario uses it.
PARTS = {
    "grouped": "len(W_K) // len(W_Q)",
    "qkv_bias": "b_Q[h]",
    "out_bias": "+ b_O",
    "cross": "X_kv",
    "qk_norm": "QK_NORM_EPS",
    "norm_weights": "q_norm[h]",
    "rope": "def rope(",
    "alibi": "ALIBI_SLOPES",
    "relative": "def relative_bucket(",
    "scale_value": "SCALE_VALUE",
    "softcap": "SOFTCAP",
    "sinks": "SINKS",
    "custom": "MASK_MATRIX",
    "empty_rows": "total == 0",
}
USES = {
    "gqa": {"grouped"},
    "mqa": {"grouped"},
    "biases": {"qkv_bias", "out_bias"},
    "output-bias-only": {"out_bias"},
    "cross-more-keys": {"cross"},
    "cross-fewer-keys-bottom-right": {"cross", "empty_rows"},
    "qk-norm": {"qk_norm"},
    "qk-norm-weights-gqa": {"qk_norm", "norm_weights", "grouped"},
    "qk-norm-whole": {"qk_norm"},
    "qk-norm-whole-weights-gqa-rope": {"qk_norm", "norm_weights", "grouped", "rope"},
    "qk-norm-whole-no-projections-cross": {"qk_norm", "cross"},
    "rope-interleaved": {"rope"},
    "no-projections-rope": {"rope"},
    "alibi-given": {"alibi"},
    "relative-bias": {"relative"},
    "scale-value": {"scale_value"},
    "softcap": {"softcap"},
    "sinks": {"sinks"},
    "custom": {"custom", "empty_rows"},
    "custom-empty-row-sinks": {"custom", "sinks"},  # a sink: never an empty row
    "sliding-window": set(),
    "everything": set(PARTS) - {"alibi", "relative", "custom", "empty_rows"},
}


@pytest.mark.parametrize("flavor", FLAVORS)
@pytest.mark.parametrize("name", ["plain", "random", *USES])
def test_the_script_holds_the_lines_of_the_parts_in_use_only(name, flavor):
    s = {"plain": worked_example(), "random": RANDOM}.get(name) or VARIANT_CASES[name]
    if flavor == "tiled" and not tiled_kernel_does(s):
        pytest.skip("the tiled script refuses what a kernel does not do (tested below)")
    text = to_script(s, flavor)
    shown = {part for part, line in PARTS.items() if line in text}
    expected = USES.get(name, set())
    if flavor == "tiled":  # the tiled pass always keeps a row that sees no key at 0
        expected = expected - {"empty_rows"}
    assert shown == expected


def test_the_plain_script_is_the_textbook_one():
    text = to_script(worked_example()).lower()
    for word in ("rope", "alibi", "sink", "_norm", "cap", "b_", "g = ", "offset", "q_pos", "top"):
        assert word not in text, word
    assert "Q, K, V = X @ W_Q[h], X @ W_K[h], X @ W_V[h]".lower() in text
    assert "output = mixed @ w_o\n" in text


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


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("custom", ["custom mask (-inf where MASK_MATRIX is 0)"]),
        ("gqa", ["4 query heads of d_k 4 sharing 2 key/value heads (GQA)"]),
        ("mqa", ["sharing 1 key/value head (MQA)"]),
        ("biases", ["biases on Q, K and V", "output bias b_O"]),
        ("cross-more-keys-bottom-right", ["cross-attention over 7 key tokens (bottom-right"]),
        ("qk-norm-weights-gqa", ["QK-norm (RMS, eps 0.001, with weights)"]),
        ("rope-half-partial", ["RoPE (half pairs, base 100.0, 2 features turned)"]),
        ("alibi-default", ["ALiBi (the paper's slopes)"]),
        ("alibi-given", ["ALiBi (given slopes)"]),
        ("softcap", ["not scaled", "soft-capped at 1.5"]),
        ("scale-value", ["scaled by 0.9"]),
        ("sinks", ["a sink logit per head"]),
        ("sliding-window", ["sliding window of 2 keys"]),
    ],
)
def test_header_names_the_variants(name, words):
    text = to_script(VARIANT_CASES[name], "numpy")
    head = " ".join(text[: text.index('"""', 3)].split())  # the docstring, unwrapped
    for w in words:
        assert w in head


@pytest.mark.parametrize("flavor", ["jax", "NumPy", ""])
def test_unknown_flavor_is_refused(flavor):
    with pytest.raises(ValueError, match=re.escape(repr(flavor))):
        to_script(worked_example(), flavor)


def test_the_tiled_script_refuses_what_a_kernel_does_not_do():
    for settings in ({"mask": "causal-zero"}, {"mask": "drop-after-softmax"}, {"dropout": 0.2}):
        with pytest.raises(ValueError, match=r"mask|dropout"):
            to_script(worked_example().with_settings(**settings), "tiled")


def test_the_tiled_script_skips_hidden_tiles_and_names_its_blocks(tmp_path):
    s = make_preset("gpt2-small", n=6)
    text = to_script(s, "tiled", blocks=(2, 3))
    assert "BLOCK_Q = 2" in text and "BLOCK_K = 3" in text
    assert "continue  # the mask hides the whole tile" in text
    out = parse_output(run_scripts({"t": text}, tmp_path)["t"]["stdout"])
    r = compute(s)
    np.testing.assert_allclose(out["output"], r.final, rtol=0, atol=1e-12)
