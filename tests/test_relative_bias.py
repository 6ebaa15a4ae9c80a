"""T5's learned, bucketed relative position bias (positional "relative-bias"): the bucket
function against transformers' own and a reference written here, the scores against
NumPy by hand, the gradient of the table against autograd, the torch engine, the KV
cache, the tiled pass, the Inspector's text, the files (version 6), resizing, and
hostile input refused with a message naming the problem."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
from scenario_strategies import make
from variant_reference import assert_matches_reference, t5_bucket

from attnviz.core.io.checks import FileFormatError
from attnviz.core.io.files import load_scenario, load_snapshot, save_scenario, save_snapshot
from attnviz.core.maths.explain import explain
from attnviz.core.maths.forward import compute
from attnviz.core.maths.kvcache import KVCache
from attnviz.core.maths.losses import Loss, gradients
from attnviz.core.maths.scenario import (
    Scenario,
    ScenarioError,
    Settings,
    insert_token,
    remove_token,
    resized,
)
from attnviz.core.maths.tiling import tiles
from attnviz.core.maths.variants import relative_bucket

T5 = {"positional": "relative-bias", "scale": False, "mask": "none"}


def relative(n: int = 6, m: int | None = None, seed: int = 0, **settings: object) -> Scenario:
    """A random scenario under T5's bias: 8 buckets a direction's worth of distances."""
    config = {**T5, "relative_buckets": 8, "relative_max_distance": 5, **settings}
    return make(n=n, m=m, seed=seed, **config)


def by_hand(s: Scenario) -> np.ndarray:
    """(H, n, m) the weights, in NumPy here: no scale, scores Q Kᵀ plus the table's entry
    of each score's bucket (t5_bucket, written in the tests), softmax without a mask."""
    st = s.settings
    out = []
    for h in range(s.n_heads):
        g = h * s.kv_heads // s.n_heads
        Q = s.X @ s.W_Q[h] + s.b_Q[h, 0]
        K = s.X @ s.W_K[g] + s.b_K[g, 0]
        S = Q @ K.T
        for i in range(s.n):
            for j in range(s.m):
                b = t5_bucket(j - i, st.relative_bidirectional, st.relative_buckets,
                              st.relative_max_distance)  # fmt: skip
                S[i, j] += s.relative_bias[b, h]
        E = np.exp(S - S.max(axis=1, keepdims=True))
        out.append(E / E.sum(axis=1, keepdims=True))
    return np.array(out)


# The bucket function --------------------------------------------------------------------


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize(("buckets", "distance"), [(32, 128), (8, 5), (5, 3), (64, 256), (6, 4)])
def test_buckets_are_t5s_and_the_reference_s(bidirectional, buckets, distance):
    if bidirectional and buckets < 8 and buckets // 2 // 2 < 1:
        pytest.skip("too few buckets for two directions")
    rel = np.arange(-600, 601)
    got = relative_bucket(rel, bidirectional, buckets, distance)
    want = [t5_bucket(int(r), bidirectional, buckets, distance) for r in rel]
    np.testing.assert_array_equal(got, want)
    torch = pytest.importorskip("torch")
    from transformers.models.t5.modeling_t5 import T5Attention

    theirs = T5Attention._relative_position_bucket(
        torch.tensor(rel), bidirectional, buckets, distance
    ).numpy()
    np.testing.assert_array_equal(got, theirs)


def test_t5s_buckets_by_hand():
    """T5-base's encoder: 16 buckets a direction, 8 exact; 8 + ⌊log(r/8)/log(16)·8⌋
    (r = 50: 8 + ⌊5.29⌋ = 13)."""
    rel = np.array([0, -1, 1, -7, 7, -8, 8, -15, -16, -50, -128, -1000, 1000])
    want = [0, 1, 17, 7, 23, 8, 24, 9, 10, 13, 15, 15, 31]
    np.testing.assert_array_equal(relative_bucket(rel, True, 32, 128), want)
    # a decoder's: keys after the query all fall in bucket 0
    np.testing.assert_array_equal(relative_bucket(np.array([5, 0, -3, -20]), False, 32, 128),
                                  [0, 0, 3, 17])  # fmt: skip


# Forward: against NumPy by hand and the reference ----------------------------------------


@pytest.mark.parametrize("bidirectional", [True, False])
def test_scores_add_the_table_entry_of_each_bucket(bidirectional):
    s = relative(n=7, relative_bidirectional=bidirectional, relative_buckets=6,
                 relative_max_distance=4)  # fmt: skip
    r = compute(s)
    np.testing.assert_allclose(np.asarray(r.weights), by_hand(s), rtol=0, atol=1e-13)
    assert_matches_reference(s)


def test_cross_attention_and_bottom_right_use_the_key_minus_the_query_position():
    s = relative(n=3, m=7, mask="causal", causal_alignment="bottom-right", scale=True)
    assert_matches_reference(s)
    s = relative(n=5, m=2, causal_alignment="top-left")
    assert_matches_reference(s)


def test_a_zero_table_changes_nothing():
    s = relative()
    zero = dataclasses.replace(s, relative_bias=np.zeros_like(s.relative_bias))
    plain = zero.with_settings(positional="none")
    np.testing.assert_array_equal(compute(zero).final, compute(plain).final)


# Backward: the table's gradient against autograd and finite differences ------------------


@pytest.mark.parametrize("kind", ["target", "next-token", "cell"])
def test_the_gradient_of_the_table_is_autograds(kind):
    torch = pytest.importorskip("torch")
    import backward_reference as ref

    s = relative(n=6, H=4, G=2, mask="causal", softcap=3.0, sinks=(0.1, -1.0, 0.5, 2.0))
    loss = {
        "target": Loss("target", np.random.default_rng(4).normal(size=(s.n, s.d_model))),
        "next-token": Loss("next-token"),
        "cell": Loss("cell", cell=(5, 2)),
    }[kind]
    leaves, inter = ref.forward(s, None)
    L = ref.loss_of(s, inter["final"], leaves["X"], loss.kind, loss.target, loss.cell)
    L.backward()
    g = gradients(s, loss)
    want = leaves["relative_bias"].grad.numpy()
    assert want.shape == (8, 4) and np.abs(want).max() > 1e-3
    np.testing.assert_allclose(g.inputs["relative_bias"], want, rtol=0,
                               atol=1e-12 * np.abs(want).max())  # fmt: skip
    for name in ("X", "W_Q", "W_K"):
        theirs = leaves[name].grad.numpy()
        bound = 1e-12 * max(1.0, float(np.abs(theirs).max()))
        np.testing.assert_allclose(g.inputs[name], theirs, rtol=0, atol=bound)
    assert torch.is_tensor(L)


def test_the_gradient_of_the_table_is_the_finite_differences():
    s = relative(n=5, H=2, G=2, relative_buckets=6, relative_max_distance=3)
    loss = Loss("target", np.random.default_rng(1).normal(size=(s.n, s.d_model)))
    g = gradients(s, loss)
    step = 1e-6
    for b, h in np.ndindex(s.relative_bias.shape):
        values = []
        for delta in (step, -step):
            table = np.array(s.relative_bias)
            table[b, h] += delta
            values.append(gradients(dataclasses.replace(s, relative_bias=table), loss).loss)
        want = (values[0] - values[1]) / (2 * step)
        largest = float(np.abs(g.inputs["relative_bias"]).max())  # (differences' rounding)
        assert g.inputs["relative_bias"][b, h] == pytest.approx(want, abs=1e-5 * largest)


# The torch engine, the KV cache, the tiled pass -----------------------------------------


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_the_torch_engine_agrees(dtype):
    pytest.importorskip("torch")
    from attnviz.core.maths.torch_engine import compute_torch, cross_check

    s = relative(n=6, H=4, G=2, mask="causal", relative_bidirectional=False)
    check = cross_check(s, dtype=dtype)
    assert check.ok, check.culprit
    got = compute_torch(s, dtype=dtype)
    bound = 1e-13 if dtype == "float64" else 1e-5
    want = np.asarray(compute(s).weights)
    np.testing.assert_allclose(np.asarray(got.weights), want, rtol=0, atol=bound)


def test_the_kv_cache_steps_are_the_full_causal_pass():
    s = relative(n=7, H=4, G=2, mask="causal", scale=True)
    full = compute(s)
    for step in KVCache.start(s):
        t = step.t
        np.testing.assert_allclose(step.weights, np.asarray(full.weights)[:, t, : t + 1],
                                   rtol=0, atol=1e-13)  # fmt: skip
        assert step.max_diff < 1e-12


@pytest.mark.parametrize(("block_q", "block_k"), [(1, 1), (2, 3), (4, 4)])
def test_the_tiled_pass_is_the_dense_one(block_q, block_k):
    s = relative(n=7, m=9, H=4, G=2, mask="causal")
    r = compute(s)
    for h in range(4):
        t = tiles(s, h, block_q, block_k)
        np.testing.assert_allclose(t.output, r.heads[h].output, rtol=0, atol=1e-13)
        np.testing.assert_allclose(t.weights_from_lse, r.heads[h].weights, rtol=0, atol=1e-13)


# The Inspector -----------------------------------------------------------------------------


def test_the_inspector_names_the_bias_and_its_bucket():
    s = relative(n=6, H=2, G=2, relative_buckets=8, relative_max_distance=3)
    r = compute(s)
    i, j, h = 5, 1, 1  # j − i = −4: distance 4 ≥ 2 exact ones, bucket min(2 + ⌊…⌋, 3) = 3
    bucket = t5_bucket(j - i, True, 8, 3)
    assert bucket == 3
    e = explain(s, r, "scaled", h, i, j)
    steps = {step.label: step.value for step in e.steps}
    assert steps[f"relative_bias[bucket {bucket + 1}, head {h + 1}]"] == s.relative_bias[bucket, h]
    assert e.value == pytest.approx(float(r.heads[h].scaled[i, j]), abs=1e-12)
    assert "j − i = -4" in e.note and f"bucket {bucket + 1} of 8" in e.note
    assert "relative_bias[bucket(j − i), h]" in e.formula
    w = explain(s, r, "weights", h, i, j)
    assert "includes relative_bias" in w.note


# Files: version 6, round trips, refusals ---------------------------------------------------


@pytest.mark.parametrize("suffix", [".attn.json", ".attn.npz"])
def test_the_table_round_trips_through_files(tmp_path, suffix):
    s = relative(n=5, m=3, relative_bidirectional=False, relative_buckets=7)
    path = tmp_path / f"t5{suffix}"
    save_scenario(path, s)
    back = load_scenario(path)
    assert back.settings == s.settings
    np.testing.assert_array_equal(back.relative_bias, s.relative_bias)
    np.testing.assert_array_equal(compute(back).final, compute(s).final)
    snap = tmp_path / "snap.npz"
    save_snapshot(snap, s)
    np.testing.assert_array_equal(load_snapshot(snap).relative_bias, s.relative_bias)


def test_a_file_with_the_bias_is_version_6_and_one_without_is_not(tmp_path):
    path = tmp_path / "t5.attn.json"
    save_scenario(path, relative())
    data = json.loads(path.read_text())
    assert data["version"] == 6
    assert data["settings"]["relative_buckets"] == 8
    assert len(data["settings"]["relative_bias"]) == 8
    save_scenario(path, make())
    assert json.loads(path.read_text())["version"] < 6


def edited_file(tmp_path, change) -> str:
    path = tmp_path / "t5.attn.json"
    save_scenario(path, relative(H=2, G=2))
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))
    return str(path)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.update(version=5), "needs version 6"),
        (lambda d: d["settings"].pop("relative_bias"), "relative_bias: missing"),
        (lambda d: d["settings"].update(positional="alibi"), "only for positional relative-bias"),
        (lambda d: d["settings"]["relative_bias"].pop(), r"relative_bias: expected 8×2"),
        (lambda d: d["settings"]["relative_bias"][2].__setitem__(1, math.inf), r"\[3,2\]"),
        (lambda d: d["settings"].update(relative_buckets=10**6), "relative_buckets"),
        (lambda d: d["settings"].update(relative_max_distance=2), "relative_max_distance"),
        (lambda d: d["settings"].update(relative_bidirectional="yes"), "relative_bidirectional"),
    ],
)
def test_a_bad_file_is_refused_naming_the_problem(tmp_path, change, message):
    with pytest.raises(FileFormatError, match=message):
        load_scenario(edited_file(tmp_path, change))


# Hostile input ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"relative_buckets": 10**9}, r"relative_buckets: expected a whole number from 4 to 1024"),
        ({"relative_buckets": 3}, "relative_buckets"),
        ({"relative_buckets": 2.5}, "relative_buckets"),
        ({"relative_buckets": True}, "relative_buckets"),
        ({"relative_max_distance": 8, "relative_buckets": 32}, "beyond the 8"),
        ({"relative_max_distance": 2**40}, "relative_max_distance"),
        ({"relative_bidirectional": 1}, "relative_bidirectional: expected true or false"),
    ],
)
def test_bad_settings_are_refused(settings, message):
    with pytest.raises(ScenarioError, match=message):
        Settings(positional="relative-bias", **settings)


@pytest.mark.parametrize(
    ("table", "message"),
    [
        (np.zeros((7, 4)), r"relative_bias: expected 8×4 \(buckets × heads\), got 7×4"),
        (np.zeros((8, 3)), "expected 8×4"),
        (np.zeros((8, 4, 1)), "expected 8×4"),
        (np.full((8, 4), np.nan), r"relative_bias\[1,1\]: nan is not a finite number"),
        (np.full((8, 4), 1e300), "exceeds"),
    ],
)
def test_a_bad_table_is_refused(table, message):
    s = relative()
    with pytest.raises(ScenarioError, match=message):
        dataclasses.replace(s, relative_bias=table)


# Edits keep the table -----------------------------------------------------------------------


def test_resizing_and_token_edits_keep_the_table():
    s = relative(n=4, H=4, G=2)
    longer = resized(s, n=9)
    np.testing.assert_array_equal(longer.relative_bias, s.relative_bias)
    assert_matches_reference(longer)
    more = resized(s, heads=6, kv_heads=2)
    np.testing.assert_array_equal(more.relative_bias[:, :4], s.relative_bias)
    assert (more.relative_bias[:, 4:] == 0).all()
    np.testing.assert_array_equal(insert_token(s, 1).relative_bias, s.relative_bias)
    np.testing.assert_array_equal(remove_token(s, 1).relative_bias, s.relative_bias)
    fewer = s.with_settings(relative_buckets=6)
    np.testing.assert_array_equal(fewer.relative_bias, s.relative_bias[:6])
    assert_matches_reference(fewer)


def test_choosing_the_bias_starts_from_a_zero_table_and_leaving_it_keeps_it():
    s = make(H=2, G=2).with_settings(positional="relative-bias")
    assert s.relative_bias.shape == (32, 2) and not s.relative_bias.any()
    t = relative()
    away = t.with_settings(positional="rope")
    np.testing.assert_array_equal(away.relative_bias, t.relative_bias)
    np.testing.assert_array_equal(away.with_settings(positional="relative-bias").relative_bias,
                                  t.relative_bias)  # fmt: skip


def test_every_cell_the_inspector_explains_is_the_engines():
    from attnviz.core.maths.explain import EXPLAINABLE

    for s in (relative(n=5, H=2, G=1, softcap=2.0, scale=True),
              relative(n=3, m=6, H=2, G=2, mask="causal", causal_alignment="bottom-right",
                       relative_bidirectional=False)):  # fmt: skip
        r = compute(s)
        for name in EXPLAINABLE:
            for head in [None] if name in ("X", "concat", "final") else range(r.n_heads):
                M = r.matrix(name, head)
                for i, j in np.ndindex(M.shape):
                    e = explain(s, r, name, head, i, j)
                    assert e.value == pytest.approx(M[i, j], abs=1e-12), (name, head, i, j)
