"""Scenario validation, edits and resizing; presets; cost formulas."""

import copy
import dataclasses
import pickle

import numpy as np
import pytest
import reference as ref

from attnviz.core.maths.cost import Cost, human_bytes, human_count
from attnviz.core.maths.scenario import (
    LIMITS,
    Scenario,
    ScenarioError,
    Settings,
    insert_token,
    move_token,
    remove_token,
    resized,
)
from attnviz.core.presets import PRESETS, make_preset, random_scenario, worked_example


def test_worked_example_matches_brief():
    s = worked_example()
    assert s.tokens == ("she", "saw", "the", "cat")
    np.testing.assert_array_equal(s.X, ref.X)
    np.testing.assert_array_equal(s.W_K, ref.W_K)
    np.testing.assert_array_equal(s.W_O, ref.W_O)
    assert (s.n, s.d_model, s.n_heads, s.d_k) == (4, 4, 2, 2)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"mask": "sideways"}, "settings.mask"),
        ({"positional": "learned"}, "settings.positional"),
        ({"scale": 1}, "settings.scale"),
        ({"dropout": 1.0}, "settings.dropout"),
        ({"dropout": -0.1}, "settings.dropout"),
        ({"dropout_seed": -1}, "settings.dropout_seed"),
    ],
)
def test_bad_settings_name_the_field(change, message):
    with pytest.raises(ScenarioError, match=message):
        Settings(**change)


def test_bad_values_name_the_cell():
    s = worked_example()
    with pytest.raises(ScenarioError, match=r"heads\[2\]\.W_K\[3,1\]: nan"):
        s.with_cells("W_K", 1, 2, 0, np.array([[np.nan]]))
    with pytest.raises(ScenarioError, match=r"X\[1,2\].*exceeds"):
        s.with_cells("X", None, 0, 1, np.array([[1e7]]))
    with pytest.raises(ScenarioError, match="does not fit"):
        s.with_cells("W_O", None, 3, 3, np.zeros((2, 1)))


def test_with_cells_changes_only_that_block():
    s = worked_example()
    t = s.with_cells("W_Q", 1, 1, 0, np.array([[9.0, 8.0]]))
    assert t.W_Q[1, 1].tolist() == [9.0, 8.0]
    assert s.W_Q[1, 1].tolist() == [-0.2, -0.8]  # the original is untouched
    assert t.X is s.X and t.W_K is s.W_K  # untouched matrices are shared


def test_a_weight_edit_copies_only_its_head():
    s = random_scenario(n=6, d_model=16, heads=4, d_k=8)
    t = s.with_cells("W_K", 2, 5, 3, np.array([[7.0]]))
    assert t.matrix("W_K", 2)[5, 3] == 7.0 and s.W_K[2, 5, 3] != 7.0
    for h in (0, 1, 3):  # the other heads are the very memory of the stack before
        assert np.shares_memory(t.matrix("W_K", h), s.W_K.array())
    assert not np.shares_memory(t.matrix("W_K", 2), s.W_K.array())
    assert (t.n_heads, t.kv_heads, t.d_k, t.weight_count) == (4, 4, 8, 3 * 4 * 16 * 8 + 32 * 16)
    for name in ("W_Q", "W_V"):
        for h in range(4):
            assert np.shares_memory(t.matrix(name, h), s.matrix(name, h))
    # edit after edit, each head not edited stays the memory it was
    u = t.with_cells("W_K", 0, 0, 0, np.array([[1.0]]))
    assert np.shares_memory(u.matrix("W_K", 3), s.W_K.array())
    assert np.shares_memory(u.matrix("W_K", 2), t.matrix("W_K", 2))
    for name in ("X", "W_Q", "W_K", "W_V", "W_O"):
        assert not np.asarray(getattr(u, name)).flags.writeable


def test_edits_of_every_matrix_give_the_values_set_and_leave_the_original():
    s = random_scenario(n=5, d_model=12, heads=3, d_k=4, seed=1)
    expected = {name: np.array(getattr(s, name)) for name in ("X", "W_Q", "W_K", "W_V", "W_O")}
    rng = np.random.default_rng(2)
    t = s
    for _ in range(40):
        name = ("X", "W_Q", "W_K", "W_V", "W_O")[rng.integers(5)]
        target = expected[name]
        head = int(rng.integers(3)) if target.ndim == 3 else None
        block = target[head] if head is not None else target
        row, col = int(rng.integers(block.shape[0])), int(rng.integers(block.shape[1]))
        value = np.round(rng.standard_normal((1, 2)), 3)[:, : block.shape[1] - col]
        block[row : row + 1, col : col + value.shape[1]] = value
        t = t.with_cells(name, head, row, col, value)
    for name, want in expected.items():
        assert np.array_equal(getattr(t, name), want), name
    assert np.array_equal(s.W_Q, random_scenario(n=5, d_model=12, heads=3, d_k=4, seed=1).W_Q)


def test_an_edited_scenario_survives_copies():
    s = random_scenario(n=4, d_model=8, heads=2, d_k=4)
    t = s.with_cells("W_V", 1, 2, 1, np.array([[3.0]]))
    for copied in (pickle.loads(pickle.dumps(t)), copy.deepcopy(t)):
        assert np.array_equal(copied.W_V, t.W_V) and copied.W_V[1, 2, 1] == 3.0
    u = t.with_settings(mask="none")  # a new scenario, its matrices shared
    assert np.array_equal(u.W_V, t.W_V) and u.settings.mask == "none"


def test_new_settings_share_the_matrices_and_check_what_depends_on_them():
    """A panel asks for the document under another mask after every edit: the matrices
    are shared; what the settings must agree with (ablated heads, sinks per head, RoPE's
    width, a custom mask) is checked."""
    s = (
        random_scenario(n=6, d_model=8, heads=2, d_k=4)
        .with_cells("W_K", 1, 0, 0, np.array([[0.5]]))
        .with_cells("W_Q", 0, 1, 1, np.array([[0.25]]))
    )
    u = s.with_settings(mask="causal-zero", sinks=(0.5, 1.0))
    assert u.settings.mask == "causal-zero"
    for name in ("W_Q", "W_K", "W_V"):
        assert all(np.shares_memory(u.matrix(name, h), s.matrix(name, h)) for h in (0, 1))
    assert np.shares_memory(u.X, s.X) and np.shares_memory(u.W_O, s.W_O)
    with pytest.raises(ScenarioError, match="head 3 does not exist"):
        s.with_settings(ablated=(2,))
    with pytest.raises(ScenarioError, match="3 numbers for 2 query heads"):
        s.with_settings(sinks=(0.1, 0.2, 0.3))
    with pytest.raises(ScenarioError, match="rope_dims: 6 is more than d_k 4"):
        s.with_settings(rope_dims=6)
    custom = s.with_settings(mask="custom")  # made causal to start from
    np.testing.assert_array_equal(custom.mask_matrix, np.tril(np.ones((6, 6))))
    np.testing.assert_array_equal(
        custom.with_settings(mask="none").mask_matrix, np.tril(np.ones((6, 6)))
    )


def test_numbers_given_as_a_stack_are_checked_once_they_enter_a_scenario():
    from attnviz.core.maths.head_stack import HeadStack

    bad = np.ones((2, 8, 4))
    bad[1, 3, 2] = np.nan
    s = random_scenario(n=6, d_model=8, heads=2, d_k=4)
    with pytest.raises(ScenarioError, match=r"heads\[2\]\.W_K\[4,3\]: nan is not a finite number"):
        dataclasses.replace(s, W_K=HeadStack.of(bad))
    with pytest.raises(ScenarioError, match=r"heads\[1\]\.W_Q\[1,2\]: 10000000.0 exceeds"):
        s.with_cells("W_Q", 0, 0, 1, np.array([[1e7]]))


def test_shape_errors():
    s = worked_example()
    with pytest.raises(ScenarioError, match="W_O: expected 4×4"):
        Scenario(s.tokens, s.X, s.W_Q, s.W_K, s.W_V, np.zeros((3, 4)))
    with pytest.raises(ScenarioError, match="tokens: 3 labels for 4 rows"):
        Scenario(s.tokens[:3], s.X, s.W_Q, s.W_K, s.W_V, s.W_O)
    with pytest.raises(ScenarioError, match="heads"):
        resized(s, heads=LIMITS.heads + 1)


def test_resize_keeps_values_and_pads_with_zeros():
    s = worked_example()
    big = resized(s, n=5, d_model=5, heads=3, d_k=3)
    np.testing.assert_array_equal(big.X[:4, :4], ref.X)
    assert big.X[4].tolist() == [0.0] * 5 and big.tokens[-1] == "t5"
    np.testing.assert_array_equal(big.W_Q[:2, :4, :2], ref.W_Q)
    # Each head's block of W_O stays with its head: head 2's rows move from 2–3 to 3–4.
    np.testing.assert_array_equal(big.W_O[3:5, :4], ref.W_O[2:4])
    np.testing.assert_array_equal(big.W_O[2], np.zeros(5))
    small = resized(big, n=4, d_model=4, heads=2, d_k=2)
    np.testing.assert_array_equal(small.W_O, ref.W_O)
    np.testing.assert_array_equal(small.X, ref.X)


def test_insert_remove_move_tokens():
    s = worked_example()
    t = insert_token(s, 1, "a", [1, 2, 3, 4])
    assert t.tokens == ("she", "a", "saw", "the", "cat")
    assert t.X[1].tolist() == [1, 2, 3, 4]
    assert remove_token(t, 1).tokens == s.tokens
    m = move_token(s, 3, 0)
    assert m.tokens == ("cat", "she", "saw", "the")
    np.testing.assert_array_equal(m.X[0], ref.X[3])
    with pytest.raises(ScenarioError):
        remove_token(resized(s, n=1), 0)


def test_presets():
    for name, p in PRESETS.items():
        s = make_preset(name) if not p.sized else make_preset(name, n=8, seed=1)
        assert s.n >= 3 and s.m >= 4, name  # cross-attention: 3 queries over 5 keys
    assert make_preset("stage-1-simple").settings.projections is False
    llama = make_preset("llama-style")
    assert (llama.n_heads, llama.kv_heads, llama.settings.positional) == (4, 2, "rope")
    cross = make_preset("cross-attention")
    assert (cross.n, cross.m, cross.key_tokens[0]) == (3, 5, "le")
    assert make_preset("sinks").settings.sinks == (0.5, 2.0)
    assert make_preset("alibi").settings.positional == "alibi"
    assert make_preset("stage-1-simple").settings.scale is False
    g = make_preset("gpt2-small")
    assert (g.n, g.d_model, g.n_heads, g.d_k) == (64, 768, 12, 64)
    np.testing.assert_array_equal(make_preset("gpt2-small", seed=3).X, random_scenario(seed=3).X)
    assert not np.array_equal(make_preset("gpt2-small", seed=3).X, make_preset("gpt2-small").X)
    with pytest.raises(ScenarioError, match="does not exist"):
        make_preset("nope")
    with pytest.raises(ScenarioError, match="fixed size"):
        make_preset("worked-example", n=8)


def test_random_scenario_has_unit_variance_projections():
    s = random_scenario(n=256, seed=0)
    Q = s.X @ s.W_Q
    assert 0.8 < Q.var() < 1.2


def test_cost_formulas():
    c = Cost(n=131072, heads=1, d_k=64)
    assert c.scores_per_head == 131072**2  # about 17 billion
    assert human_count(c.scores) == "17.2 billion"
    assert c.flops == 4 * 131072**2 * 64
    assert Cost(n=131072, heads=1, d_k=64, causal=True).flops == 2 * 131072**2 * 64
    g = Cost(n=1024, heads=12, d_k=64)
    assert g.score_bytes("float32") == 12 * 1024 * 1024 * 4
    assert g.kv_cache_numbers == 2 * 1024 * 768
    assert g.kv_cache_bytes("float16") == 2 * 1024 * 768 * 2
    assert human_bytes(1536) == "1.5 KiB"
    with pytest.raises(ValueError, match="n"):
        Cost(n=0, heads=1, d_k=1)


def test_kv_cache_per_token_of_real_models_by_hand():
    from attnviz.core.maths.cost import REAL_MODELS, KVShape, sharing_options

    models = {m.name: m for m in REAL_MODELS}
    # Llama-3-8B: 32 layers × 8 KV heads × 128 × (K and V) × 2 bytes = 128 KiB a token.
    llama = models["Llama-3-8B"]
    assert llama.bytes_per_token() == 32 * 8 * 128 * 2 * 2 == 131072
    assert llama.cache_bytes(131072) == 16 * 2**30 and llama.kind == "GQA, 4 per group"
    # The same model with a key/value head per query head would need 4× as much.
    assert KVShape("mha", 32, 32, 128, 32).bytes_per_token() == 4 * 131072
    # Mistral's window keeps 4096 tokens: 512 MiB however long the sequence.
    mistral = models["Mistral-7B v0.1"]
    assert mistral.cache_bytes(131072) == mistral.cache_bytes(4096) == 4096 * 131072
    assert mistral.cache_bytes(100) == 100 * 131072
    # Falcon-7B (MQA): 32 layers × 1 × 64 × 2 × 2 = 8 KiB; GPT-2 small (MHA) 36 KiB.
    assert models["Falcon-7B"].bytes_per_token() == 8192 and models["Falcon-7B"].kind == "MQA"
    assert models["GPT-2 small"].bytes_per_token() == 12 * 12 * 64 * 2 * 2
    assert [o.kv_heads for o in sharing_options(12, 64)] == [12, 6, 4, 3, 2, 1]
    assert [o.bytes_per_token("float32") for o in sharing_options(2, 4)] == [64, 32]
    with pytest.raises(ValueError, match="do not divide"):
        KVShape("bad", 12, 5, 64)


def test_ablated_heads_are_checked_and_follow_resizes():
    s = worked_example(Settings(ablated=(1,)))
    with pytest.raises(ScenarioError, match=r"settings\.ablated"):
        Settings(ablated=(1, 1))
    with pytest.raises(ScenarioError, match="head 3 does not exist"):
        s.with_settings(ablated=(2,))
    assert resized(s, heads=1).settings.ablated == ()
    assert resized(s, heads=3).settings.ablated == (1,)
