"""The Python API (attnviz.api, re-exported by attnviz): scenarios from arrays, figures,
files, and layers from torch modules and transformers models, each against NumPy or the
module's own numbers."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import numpy as np
import pytest

import attnviz
from attnviz.core.maths.scenario import ScenarioError


def softmax_rows(s: np.ndarray) -> np.ndarray:
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def test_from_qkv_attends_with_exactly_those_q_k_v():
    rng = np.random.default_rng(0)
    Q, K, V = rng.normal(size=(3, 2, 5, 3))  # 2 heads, 5 tokens, d_k 3
    c = attnviz.compute(attnviz.from_qkv(Q, K, V, mask="causal"))
    scores = Q @ K.transpose(0, 2, 1) / np.sqrt(3)
    scores[:, np.triu_indices(5, k=1)[0], np.triu_indices(5, k=1)[1]] = -np.inf
    expected = softmax_rows(scores)
    np.testing.assert_allclose(c.weights, expected, rtol=0, atol=1e-14)
    np.testing.assert_allclose(c.head_outputs, expected @ V, rtol=0, atol=1e-14)
    # the heads' outputs side by side, in the output's first columns
    np.testing.assert_allclose(c.output[:, :6], np.concatenate(expected @ V, axis=1), atol=1e-14)


def test_from_qkv_cross_attention_with_a_mask_and_a_scale():
    rng = np.random.default_rng(1)
    Q, K, V = rng.normal(size=(3, 2)), rng.normal(size=(4, 2)), rng.normal(size=(4, 2))
    allowed = np.array([[1, 1, 0, 0], [1, 1, 1, 0], [0, 1, 1, 1]])
    s = attnviz.from_qkv(Q, K, V, mask=allowed, scale=0.5, tokens=["a", "b", "c"])
    weights = attnviz.compute(s).weights[0]
    scores = np.where(allowed == 1, 0.5 * Q @ K.T, -np.inf)
    np.testing.assert_allclose(weights, softmax_rows(scores), rtol=0, atol=1e-14)
    assert s.tokens == ("a", "b", "c") and s.m == 4


def test_from_weights_packs_heads_as_linear_layers_do():
    rng = np.random.default_rng(2)
    n, d, heads = 4, 6, 3
    X, Wq, Wk, Wv, Wo = (rng.normal(size=shape) for shape in [(n, d), *[(d, d)] * 4])
    bq = rng.normal(size=d)
    s = attnviz.from_weights(X, Wq, Wk, Wv, Wo, heads=heads, biases={"b_Q": bq}, mask="causal")
    c = attnviz.compute(s)
    split = lambda A: A.reshape(n, heads, 2).transpose(1, 0, 2)  # noqa: E731
    q, k, v = split(X @ Wq + bq), split(X @ Wk), split(X @ Wv)
    scores = q @ k.transpose(0, 2, 1) / np.sqrt(2) + np.triu(np.full((n, n), -np.inf), 1)
    w = softmax_rows(scores)
    np.testing.assert_allclose(c.weights, w, rtol=0, atol=1e-13)
    concat = (w @ v).transpose(1, 0, 2).reshape(n, d)
    np.testing.assert_allclose(c.output, concat @ Wo, rtol=0, atol=1e-13)


def test_wrong_shapes_are_refused_in_one_line():
    with pytest.raises(ScenarioError, match="K and V: expected one shape"):
        attnviz.from_qkv(np.ones((2, 2)), np.ones((2, 2)), np.ones((3, 2)))
    with pytest.raises(ScenarioError, match="W_Q: expected d_model × \\(heads · d_k\\)"):
        attnviz.from_weights(np.ones((2, 4)), np.ones((4, 5)), *[np.ones((4, 4))] * 3, heads=2)
    with pytest.raises(ScenarioError, match="mask: expected 0"):
        attnviz.from_qkv(np.ones((2, 2)), np.ones((2, 2)), np.ones((2, 2)), mask=[[2, 1], [1, 1]])


def test_files_round_trip(tmp_path):
    s = attnviz.preset("llama-style")
    for name in ("a.attn.json", "b.attn.npz"):
        back = attnviz.load(attnviz.save(s, tmp_path / name))
        np.testing.assert_array_equal(attnviz.compute(back).weights, attnviz.compute(s).weights)
    assert "worked-example" in attnviz.presets()


def test_figure_is_svg_inline_and_saves_svg_and_png(tmp_path):
    s = attnviz.preset()
    fig = attnviz.figure(s, view="weights", head=2)
    root = ET.fromstring(fig._repr_svg_())
    assert root.tag.endswith("svg") and fig.title == "head 2 · weights (softmax)"
    # each cell is titled with its value: head 2's weights, computed here in NumPy
    titles = [t.text or "" for t in root.iter("{http://www.w3.org/2000/svg}title")]
    shown = np.array([float(t.rsplit(": ", 1)[1]) for t in titles]).reshape(4, 4)
    X = np.asarray(s.X)
    scores = (X @ s.W_Q[1]) @ (X @ s.W_K[1]).T / np.sqrt(2) + np.triu(np.full((4, 4), -np.inf), 1)
    np.testing.assert_allclose(shown, softmax_rows(scores), rtol=0, atol=1e-15)
    assert attnviz.figure(attnviz.compute(s), "final").title.startswith("output")
    svg = fig.save(tmp_path / "w.svg")
    assert ET.parse(svg).getroot().tag.endswith("svg")
    png = fig.save(tmp_path / "w.png", scale=1.0).read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert fig.to_png(1.0)[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ScenarioError, match="head 3: the scenario has heads 1 to 2"):
        attnviz.figure(s, head=3)
    with pytest.raises(ScenarioError, match="view 'attention'"):
        attnviz.figure(s, view="attention")
    with pytest.raises(ValueError, match=r"expected a \.svg or \.png"):
        fig.save(tmp_path / "w.jpg")


def test_a_computation_shows_every_heads_weights_inline():
    html = attnviz.compute(attnviz.preset())._repr_html_()
    assert html.count("<svg") == 2 and "head 1 · weights" in html and "head 2 · weights" in html
