"""Hostile files are refused by cheap counts before Python objects are built for them.

Deterministic: each refusal is checked by its message and by the parser it skips
(json.loads, str.split), monkeypatched to fail. The peak-memory figures on large files
are measured by tests/perf/bench_parse_memory.py.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from attnviz.core import files as F
from attnviz.core.files import FileFormatError, scenario_from_json, scenario_to_json
from attnviz.core.scenario import LIMITS, Scenario


@pytest.fixture
def no_json(monkeypatch: pytest.MonkeyPatch) -> None:
    def loads(*args: object, **kwargs: object) -> None:
        raise AssertionError("json.loads ran")

    monkeypatch.setattr(F.json, "loads", loads)


HEAD = '{"format": "attnviz-scenario", "version": 1, "X": ['


def test_many_empty_lists_are_refused_before_json_is_parsed(no_json: None) -> None:
    n = F._most_containers()
    text = HEAD + "[]," * n + "[]]}"
    with pytest.raises(FileFormatError, match=f"{n + 3:,} lists and objects; .* at most {n:,}"):
        scenario_from_json(text)
    with pytest.raises(FileFormatError, match="lists and objects"):
        scenario_from_json(text.encode())


def test_deep_nesting_is_refused_before_json_is_parsed(no_json: None) -> None:
    depth = F._most_containers() + 1
    with pytest.raises(FileFormatError, match="lists and objects"):
        scenario_from_json("[" * depth + "]" * depth)


def test_many_strings_are_refused_before_json_is_parsed(no_json: None) -> None:
    n = F._most_quotes() // 2 + 1
    with pytest.raises(FileFormatError, match=r"quotation marks; .* at most"):
        scenario_from_json(HEAD + '["ab",' * n + "]]}")


@pytest.mark.parametrize("char", ["[", "{", '"'])
def test_the_counts_allow_the_largest_scenario_and_any_labels(char: str) -> None:
    n = LIMITS.tokens
    heads, d_model, d_k = 2, 1, 1
    s = Scenario(
        tokens=tuple(char * (LIMITS.token_chars - 4) + f"{i:04}" for i in range(n)),
        X=np.zeros((n, d_model)),
        W_Q=np.zeros((heads, d_model, d_k)),
        W_K=np.zeros((heads, d_model, d_k)),
        W_V=np.zeros((heads, d_model, d_k)),
        W_O=np.zeros((heads * d_k, d_model)),
    )
    assert scenario_from_json(scenario_to_json(s)).tokens == s.tokens


def test_the_container_count_covers_every_matrix_row_at_the_limits() -> None:
    lim = LIMITS
    rows = lim.tokens + 3 * lim.heads * lim.d_model + lim.heads * lim.d_k
    assert F._most_containers() >= rows + 3 * lim.heads + 2 + lim.tokens * lim.token_chars
    doc = json.dumps({"X": [[0]] * 3, "heads": [{"W_Q": [[0]]}]})
    assert doc.count("[") + doc.count("{") <= F._most_containers()
