"""Mask comparison, the causality probe and head contributions, on the worked example."""

import numpy as np
import pytest
import reference as ref

from attnviz.core.maths.compare import compare_masks, head_contribution, probe
from attnviz.core.maths.forward import compute, one_head
from attnviz.core.maths.scenario import ScenarioError, Settings
from attnviz.core.presets import worked_example


def test_causal_against_zero_shows_the_leak():
    c = compare_masks(worked_example(), head=0)
    _, W_causal, out_causal = ref.head(ref.X, ref.W_Q[0], ref.W_K[0], ref.W_V[0], "causal")
    _, W_zero, out_zero = ref.head(ref.X, ref.W_Q[0], ref.W_K[0], ref.W_V[0], "causal-zero")
    np.testing.assert_allclose(c.weights_a, W_causal, atol=1e-15)
    np.testing.assert_allclose(c.weights_b, W_zero, atol=1e-15)
    np.testing.assert_allclose(c.difference, W_zero - W_causal, atol=1e-15)
    np.testing.assert_allclose(c.leak_b, np.triu(W_zero, 1).sum(axis=1), atol=1e-15)
    assert (c.leak_a == 0).all()
    shift = np.linalg.norm(out_zero - out_causal, axis=1)
    np.testing.assert_allclose(c.output_shift, shift, atol=1e-15)
    assert c.output_shift[-1] == pytest.approx(0, abs=1e-15)  # the last row sees no future


def test_comparison_computes_through_the_given_function():
    s = worked_example()
    asked: list[str] = []

    def results(scenario):
        asked.append(scenario.settings.mask)
        return compute(scenario)

    c = compare_masks(s, 1, "causal", "none", results=results)
    assert asked == ["causal", "none"]
    np.testing.assert_array_equal(c.weights_a, compute(s).weights[1])


def test_a_head_compared_alone_leaves_the_outputs_until_the_whole_layers():
    """Compared from results of the head alone (what the window shows first after an
    edit): the head's numbers and no final_shift; from whole layers, final_shift by hand."""
    edited = worked_example().with_cells("X", None, 1, 2, np.array([[0.9]]))
    first = compare_masks(edited, 0, results=lambda s: one_head(s, 0))
    assert first.final_shift is None
    _, W_causal, _ = ref.head(edited.X, ref.W_Q[0], ref.W_K[0], ref.W_V[0], "causal")
    _, W_zero, _ = ref.head(edited.X, ref.W_Q[0], ref.W_K[0], ref.W_V[0], "causal-zero")
    np.testing.assert_allclose(first.difference, W_zero - W_causal, atol=1e-15)
    whole = compare_masks(edited, 0)
    finals = [
        ref.multi_head(edited.X, ref.W_Q, ref.W_K, ref.W_V, ref.W_O, mask)[2]
        for mask in ("causal", "causal-zero")
    ]
    shift = np.linalg.norm(finals[1] - finals[0], axis=1)
    np.testing.assert_allclose(whole.final_shift, shift, atol=1e-14)


def test_probe_shows_causality():
    s = worked_example()
    p = probe(s, token=1)
    assert not p.earlier_rows_changed and p.change[0] == 0.0 and p.changed[1:].all()
    leaky = probe(s.with_settings(mask="causal-zero"), token=1)
    assert leaky.earlier_rows_changed and leaky.change[0] > 0
    # By hand for the nudged input: the same layer with x_saw + 0.5 everywhere.
    X2 = ref.X.copy()
    X2[1] += 0.5
    _, _, f1 = ref.multi_head(ref.X, ref.W_Q, ref.W_K, ref.W_V, ref.W_O, "causal-zero")
    _, _, f2 = ref.multi_head(X2, ref.W_Q, ref.W_K, ref.W_V, ref.W_O, "causal-zero")
    np.testing.assert_allclose(leaky.change, np.abs(f2 - f1).max(axis=1), atol=1e-14)
    with pytest.raises(ScenarioError):
        probe(s, token=4)


def test_head_contributions_sum_to_the_output():
    s = worked_example()
    r = compute(s)
    parts = np.stack([head_contribution(r, s.W_O, h) for h in range(r.n_heads)])
    _, concat, final = ref.multi_head(ref.X, ref.W_Q, ref.W_K, ref.W_V, ref.W_O)
    np.testing.assert_allclose(parts[0], concat[:, :2] @ ref.W_O[:2], atol=1e-15)
    np.testing.assert_allclose(parts.sum(axis=0), final, atol=1e-15)
    ablated = worked_example(Settings(ablated=(0,)))
    assert (head_contribution(compute(ablated), ablated.W_O, 0) == 0).all()
