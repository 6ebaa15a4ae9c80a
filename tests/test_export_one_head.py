"""One head alone (compute_head, and the export that uses it) matches the full compute."""

import itertools

import numpy as np
import pytest

from attnviz.cli import main
from attnviz.core.figures.figure import spec_for, to_svg
from attnviz.core.maths.forward import compute, compute_head
from attnviz.core.maths.positions import dropout_keep
from attnviz.core.maths.results import HEAD_MATRICES
from attnviz.core.maths.scenario import MASKS, POSITIONALS
from attnviz.core.maths.streaming import layer
from attnviz.core.presets import make_preset

FIELDS = (*HEAD_MATRICES, "leak", "row_sum", "entropy", "empty_rows", "keep")

SETTINGS = [
    dict(mask=mask, positional=positional, dropout=dropout, projections=projections)
    for mask, positional, dropout, projections in itertools.product(
        MASKS, POSITIONALS, (0.0, 0.3), (True, False)
    )
] + [
    dict(scale=False),
    dict(ablated=(0, 2)),
    dict(dropout=0.5, dropout_seed=12345, ablated=(1,), mask="drop-after-softmax"),
]


@pytest.fixture(scope="module")
def gpt2():
    return make_preset("gpt2-small", 40, 3)


@pytest.mark.parametrize(
    "changes", SETTINGS, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items())
)
def test_every_head_alone_is_bit_identical_to_the_full_compute(gpt2, changes):
    s = gpt2.with_settings(**changes)
    full = compute(s)
    for h, head in enumerate(full.heads):
        alone = compute_head(s, h)
        for name in FIELDS:
            a, b = getattr(alone, name), getattr(head, name)
            if b is None:
                assert a is None, name
            else:
                np.testing.assert_array_equal(a, b, err_msg=f"head {h}: {name}")
                assert not a.flags.writeable


@pytest.mark.parametrize(
    "changes", SETTINGS, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items())
)
@pytest.mark.parametrize("block", [256, 7, 1])
def test_layer_a_block_of_rows_at_a_time_matches_the_full_compute(gpt2, changes, block):
    # Blocks of query rows change only how BLAS groups the products (last-bit rounding).
    s = gpt2.with_settings(**changes)
    full, lean = compute(s), layer(s, block)
    assert lean.heads == ()
    for name in ("X", "concat", "final"):
        want = full.matrix(name)
        tol = 1e-13 * max(1.0, np.abs(want).max())
        np.testing.assert_allclose(lean.matrix(name), want, rtol=0, atol=tol, err_msg=name)
        assert not lean.matrix(name).flags.writeable


def test_worked_example_heads_alone():
    s = make_preset("worked-example").with_settings(dropout=0.2)
    full = compute(s)
    for h in range(full.n_heads):
        for name in HEAD_MATRICES:
            alone = getattr(compute_head(s, h), name)
            np.testing.assert_array_equal(alone, full.matrix(name, h))


def test_dropout_keep_skip_is_a_slice_of_the_full_draw(gpt2):
    st = gpt2.with_settings(dropout=0.25, dropout_seed=99).settings
    whole = dropout_keep(st, (5, 7, 9))
    assert whole is not None
    for h in range(5):
        one = dropout_keep(st, (1, 7, 9), skip=h)
        assert one is not None
        np.testing.assert_array_equal(one[0], whole[h])


def test_a_head_that_does_not_exist_is_refused(gpt2):
    with pytest.raises(KeyError):
        compute_head(gpt2, gpt2.n_heads)
    with pytest.raises(KeyError):
        compute_head(gpt2.with_settings(projections=False), 1)


FLAGS = {
    "default": ([], {}),
    "causal-zero, sinusoidal": (
        ["--mask", "causal-zero", "--positional", "sinusoidal"],
        {"mask": "causal-zero", "positional": "sinusoidal"},
    ),
    "no projections": (["--no-projections", "--no-scale"], {"projections": False, "scale": False}),
}


@pytest.mark.parametrize("view", [*HEAD_MATRICES, "X", "concat", "final"])
@pytest.mark.parametrize("flags", FLAGS)
def test_cli_export_is_the_figure_of_the_full_compute(tmp_path, capsys, view, flags):
    extra, changes = FLAGS[flags]
    s = make_preset("gpt2-small", 256, 0).with_settings(**changes)
    head = 0 if changes.get("projections") is False else 5
    out = tmp_path / f"{view}.svg"
    argv = ["export", "--preset", "gpt2-small", "--n", "256", "--seed", "0", *extra]
    assert main([*argv, "--view", view, "--head", str(head + 1), "--out", str(out)]) == 0
    assert out.read_text("utf-8") == to_svg(spec_for(compute(s), view, head))
