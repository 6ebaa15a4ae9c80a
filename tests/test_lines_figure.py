"""The lines figure (BertViz's head view) as SVG: one line per weight above the threshold,
its opacity the weight; isolation; escaping.

Expected weights come from a few lines of NumPy here, never from attnviz's engine; the
figure is drawn from the engine's result, so the whole way from scenario to figure is
checked.
"""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from attnviz.core.figures.lines import THRESHOLD, Isolated, head_color, lines_svg
from attnviz.core.maths.forward import compute
from attnviz.core.maths.scenario import Scenario, Settings

SVG = "{http://www.w3.org/2000/svg}"
TOKENS = ("<s>", "a&b", 'say "hi"', "x>y", "ok")


def softmax_rows(s: np.ndarray) -> np.ndarray:
    e = np.exp(s - s.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def scenario(mask: str = "none", seed: int = 4) -> Scenario:
    """Five tokens, three heads; X large enough that some weights fall below 0.01."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((5, 4))
    W = rng.standard_normal((3, 3, 4, 2))
    W_O = rng.standard_normal((6, 4))
    return Scenario(TOKENS, X, W[0], W[1], W[2], W_O, settings=Settings(mask=mask))


def expected_weights(s: Scenario, causal: bool = False) -> np.ndarray:
    """heads × n × m, by hand: softmax((X_kv W_K)ᵀ-scored queries / √d_k)."""
    keys_in = s.X if s.X_kv is None else s.X_kv
    out = []
    for h in range(s.W_Q.shape[0]):
        scores = (s.X @ s.W_Q[h]) @ (keys_in @ s.W_K[h]).T / math.sqrt(s.W_Q.shape[2])
        if causal:
            scores[np.triu_indices(len(scores), k=1)] = -np.inf
        out.append(softmax_rows(scores))
    return np.array(out)


def parse(svg: str) -> ET.Element:
    root = ET.fromstring(svg)
    assert root.tag == f"{SVG}svg"
    return root


def drawn(root: ET.Element) -> dict[int, dict[tuple[int, int], float]]:
    """head (0-based) -> {(query, key): opacity} of the lines in the figure."""
    out: dict[int, dict[tuple[int, int], float]] = {}
    for group in root.iter(f"{SVG}g"):
        name = group.get("id", "")
        if not name.startswith("head-"):
            continue
        head = int(name.removeprefix("head-")) - 1
        lines = out.setdefault(head, {})
        for line in group:
            assert line.tag == f"{SVG}line"
            pair = int(line.get("data-query")), int(line.get("data-key"))
            assert pair not in lines, f"head {head + 1}: two lines for {pair}"
            lines[pair] = float(line.get("stroke-opacity"))
    return out


def labels(root: ET.Element, side: str) -> list[str]:
    group = next(g for g in root.iter(f"{SVG}g") if g.get("id") == f"{side}-labels")
    return [t.text or "" for t in group]


def test_one_line_per_weight_above_the_threshold_with_the_weight_as_opacity():
    s = scenario()
    expected = expected_weights(s)
    # The scenario must exercise the threshold: some weights fall below it, most do not.
    assert (expected < THRESHOLD).sum() >= 3 and (expected >= THRESHOLD).sum() >= 30
    r = compute(s)
    root = parse(lines_svg(r.tokens, r.keys, r.weights, [0, 2], title="two heads"))
    got = drawn(root)
    assert set(got) == {0, 2}
    for h in (0, 2):
        want = {
            (i, j): expected[h, i, j]
            for i in range(5)
            for j in range(5)
            if expected[h, i, j] >= THRESHOLD
        }
        assert set(got[h]) == set(want), h
        for pair, weight in want.items():
            assert got[h][pair] == pytest.approx(weight, abs=5e-5), (h, pair)
    colours = {g.get("id"): g.get("stroke") for g in root.iter(f"{SVG}g")}
    assert colours["head-1"] == head_color(0) != colours["head-3"] == head_color(2)


def test_lines_join_each_query_row_to_each_key_row():
    s = scenario()
    r = compute(s)
    root = parse(lines_svg(r.tokens, r.keys, r.weights, [1]))
    rows = {}
    for text in root.iter(f"{SVG}text"):
        rows.setdefault(text.text, []).append(float(text.get("y")))
    lines = [el for el in root.iter(f"{SVG}line")]
    assert lines
    for line in lines:
        i, j = int(line.get("data-query")), int(line.get("data-key"))
        # Each end sits beside its label (the label's baseline is a little lower).
        assert 0 < rows[TOKENS[i]][0] - float(line.get("y1")) < 8
        assert 0 < rows[TOKENS[j]][-1] - float(line.get("y2")) < 8
        assert float(line.get("x1")) < float(line.get("x2"))


def test_a_causal_mask_leaves_no_line_to_a_future_key():
    s = scenario("causal")
    expected = expected_weights(s, causal=True)
    r = compute(s)
    got = drawn(parse(lines_svg(r.tokens, r.keys, r.weights, [0, 1, 2])))
    for h in range(3):
        assert all(j <= i for i, j in got[h]), h
        want = {(i, j) for i, j in zip(*np.nonzero(expected[h] >= THRESHOLD), strict=True)}
        assert set(got[h]) == want


@pytest.mark.parametrize("side, index", [("query", 3), ("key", 1)])
def test_isolation_keeps_only_the_tokens_lines_and_prints_their_weights(side, index):
    s = scenario()
    expected = expected_weights(s)
    r = compute(s)
    svg = lines_svg(r.tokens, r.keys, r.weights, [0, 2], Isolated(side, index))
    root = parse(svg)
    got = drawn(root)
    for h in (0, 2):
        row = expected[h, index, :] if side == "query" else expected[h, :, index]
        want = {
            ((index, k) if side == "query" else (k, index)): w
            for k, w in enumerate(row)
            if w >= THRESHOLD
        }
        assert set(got[h]) == set(want)
        for pair, weight in want.items():
            assert got[h][pair] == pytest.approx(weight, abs=5e-5)
    # Beside every token of the other column, each head's weight to two decimals.
    printed = next(g for g in root.iter(f"{SVG}g") if g.get("id") == "weights")
    texts = [t.text for t in printed]
    assert len(texts) == 5 * 2
    for k in range(5):
        for c, h in enumerate((0, 2)):
            w = expected[h, index, k] if side == "query" else expected[h, k, index]
            assert texts[2 * k + c] == f"{w:.2f}", (k, h)
    # The isolated label is bold; its column's other labels are greyed.
    group = next(g for g in root.iter(f"{SVG}g") if g.get("id") == f"{side}-labels")
    weights = [t.get("font-weight") for t in group]
    assert weights[index] == "bold" and weights.count("bold") == 1


def test_tokens_and_title_with_xml_special_characters_are_escaped():
    s = scenario()
    r = compute(s)
    title = 'heads <1> & "2"'
    for isolated in (None, Isolated("query", 1), Isolated("key", 2)):
        svg = lines_svg(r.tokens, r.keys, r.weights, [0], isolated, title=title)
        root = parse(svg)  # well-formed although every label holds < & > or "
        assert labels(root, "query") == list(TOKENS)
        assert labels(root, "key") == list(TOKENS)
        assert title in [t.text for t in root.iter(f"{SVG}text")]
        assert "<s>" not in svg and "a&b" not in svg


def test_cross_attention_draws_queries_against_the_key_tokens():
    rng = np.random.default_rng(9)
    s = Scenario(
        ("the", "cat"),
        rng.standard_normal((2, 4)),
        *rng.standard_normal((3, 2, 4, 2)),
        rng.standard_normal((4, 4)),
        settings=Settings(mask="none"),
        kv_tokens=("le", "chat", "<eos>"),
        X_kv=rng.standard_normal((3, 4)),
    )
    expected = expected_weights(s)
    assert expected.shape == (2, 2, 3)
    r = compute(s)
    root = parse(lines_svg(r.tokens, r.keys, r.weights, [0, 1]))
    assert labels(root, "query") == ["the", "cat"]
    assert labels(root, "key") == ["le", "chat", "<eos>"]
    got = drawn(root)
    for h in (0, 1):
        assert {p: pytest.approx(w, abs=5e-5) for p, w in got[h].items()} == {
            (i, j): expected[h, i, j]
            for i in range(2)
            for j in range(3)
            if expected[h, i, j] >= THRESHOLD
        }


def test_no_heads_draws_no_lines_and_bad_shapes_are_refused():
    r = compute(scenario())
    assert drawn(parse(lines_svg(r.tokens, r.keys, r.weights, []))) == {}
    with pytest.raises(ValueError, match="head 4"):
        lines_svg(r.tokens, r.keys, r.weights, [3])
    with pytest.raises(ValueError, match="expected heads"):
        lines_svg(r.tokens[:4], r.keys, r.weights, [0])
    with pytest.raises(ValueError, match="key 6: there are 5"):
        lines_svg(r.tokens, r.keys, r.weights, [0], Isolated("key", 5))
