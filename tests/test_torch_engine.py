"""The torch engine and the SDPA cross-check against the NumPy reference."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from attnviz.core.maths.forward import compute  # noqa: E402
from attnviz.core.maths.scenario import Settings  # noqa: E402
from attnviz.core.maths.torch_engine import compute_torch, cross_check, resolve_device  # noqa: E402
from attnviz.core.presets import random_scenario, worked_example  # noqa: E402

DEVICES = [
    "cpu",
    pytest.param(
        "cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")
    ),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mask", ["none", "causal", "causal-zero", "drop-after-softmax"])
def test_float64_matches_numpy(device, mask):
    s = worked_example(Settings(mask=mask, positional="sinusoidal"))
    a, b = compute(s), compute_torch(s, device, "float64")
    for name in ("Q", "weights", "output", "concat", "final", "leak", "row_sum", "entropy"):
        np.testing.assert_allclose(getattr(b, name), getattr(a, name), atol=1e-13, err_msg=name)
    np.testing.assert_array_equal(np.isneginf(a.masked), np.isneginf(b.masked))


@pytest.mark.parametrize("device", DEVICES)
def test_float32_is_close(device):
    s = random_scenario(n=32, d_model=64, heads=4, d_k=16, seed=2)
    c = cross_check(s, device, "float32")
    assert 1e-9 < c.torch_diff < 1e-4  # float32: close, but not float64-exact
    assert c.sdpa_diff is not None and c.sdpa_diff < 1e-4


def test_dropout_uses_the_same_mask():
    s = worked_example(Settings(mask="none", dropout=0.3, dropout_seed=5))
    np.testing.assert_allclose(compute_torch(s).weights, compute(s).weights, atol=1e-14)
    c = cross_check(s)
    assert c.sdpa_diff is None and "dropout" in c.sdpa_note


def test_no_projections_single_head():
    s = worked_example(Settings(projections=False, mask="causal"))
    c = cross_check(s)
    assert c.torch_diff < 1e-12 and c.sdpa_diff is not None and c.sdpa_diff < 1e-12


def test_unknown_device_and_dtype_are_refused():
    with pytest.raises(ValueError, match="device"):
        resolve_device("tpu")
    with pytest.raises(ValueError, match="dtype"):
        compute_torch(worked_example(), "cpu", "float8")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA"):
            resolve_device("cuda")


def test_ablation_matches_numpy():
    s = worked_example(Settings(ablated=(0,)))
    np.testing.assert_allclose(compute_torch(s).final, compute(s).final, atol=1e-15)
