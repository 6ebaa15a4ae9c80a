"""A file of several layers (.attn.npz version 5): the round trip, bit for bit, and one
clear message for each thing wrong in one."""

from __future__ import annotations

import dataclasses
import json
import zipfile

import numpy as np
import pytest

from attnviz.core.io.files import FileFormatError, load_scenario, save_scenario
from attnviz.core.io.layers_files import holds_layers, layers_to_npz_parts, load_layers, save_layers
from attnviz.core.io.npz_files import LAYERS_DOCUMENT, write_npz
from attnviz.core.layers import Layers, LayersError, Run, parse_layers, spans
from attnviz.core.maths.forward import compute
from attnviz.core.presets import make_preset
from attnviz.core.provenance import Provenance

MODEL_LAYERS = 4


def run_of(s) -> Run:
    return Run("org/model", "cache", "bert", MODEL_LAYERS, "she saw the cat", tuple(range(s.n)),
               s.tokens, (("model.safetensors", "ab" * 32),))  # fmt: skip


def layer(k: int):
    """A layer k: the worked example with its own X, its provenance its own numbers."""
    s = make_preset("worked-example")
    s = dataclasses.replace(s, X=s.X + 0.1 * k, b_Q=np.full_like(s.b_Q, -0.0))
    r = compute(s)
    run = run_of(s)
    p = Provenance(run.source, run.kind, run.model_type, k, MODEL_LAYERS, run.text,
                   run.token_ids, r.weights, r.final, run.files)  # fmt: skip
    return dataclasses.replace(s, provenance=p)


def stack(stored=(0, 1, 2, 3), weights_only=False, native=False, overview=True):
    scenarios = tuple(layer(k) for k in range(MODEL_LAYERS))
    every = np.stack([s.provenance.model_weights for s in scenarios]).astype(np.float32)
    weights = tuple(scenarios[k].provenance.model_weights for k in stored)
    return Layers(
        run=run_of(scenarios[0]),
        stored=stored,
        weights=weights,
        scenarios=() if weights_only else tuple(scenarios[k] for k in stored),
        overview=every if overview else None,
        native="bfloat16" if native else "",
        native_weights=tuple(np.round(w, 2) for w in weights) if native else (),
    )


def same(a: Layers, b: Layers) -> None:
    assert (a.run, a.stored, a.dtype, a.native) == (b.run, b.stored, b.dtype, b.native)
    for x, y in zip(a.weights + a.native_weights, b.weights + b.native_weights, strict=True):
        assert x.dtype == y.dtype and x.tobytes() == y.tobytes()
    for s, t in zip(a.scenarios, b.scenarios, strict=True):
        for name in ("X", "W_Q", "W_K", "W_V", "W_O", "b_Q", "b_O"):
            assert np.asarray(getattr(s, name)).tobytes() == np.asarray(getattr(t, name)).tobytes()
        assert s.provenance.model_output.tobytes() == t.provenance.model_output.tobytes()
    assert (a.every_layer() is None) == (b.every_layer() is None)
    if a.every_layer() is not None:
        assert a.every_layer().tobytes() == b.every_layer().tobytes()


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"stored": (1, 3)}, {"weights_only": True}, {"stored": (2,), "weights_only": True},
     {"native": True}, {"stored": (0, 2), "overview": False}],
    ids=["all", "some", "weights-only", "one-weights-only", "native", "no-overview"],
)  # fmt: skip
def test_a_file_of_layers_round_trips_every_bit(tmp_path, kwargs):
    original = stack(**kwargs)
    path = tmp_path / "l.attn.npz"
    save_layers(path, original)
    assert holds_layers(path)
    same(load_layers(path), original)
    with np.load(path) as archive:  # a plain NumPy archive; the overview only when needed
        assert ("overview" in archive.files) == (
            original.overview is not None and not original.covers_the_model
        )


def test_every_layer_s_overview_is_its_weights_when_all_are_stored(tmp_path):
    path = tmp_path / "a.attn.npz"
    save_layers(path, stack(overview=False))
    expected = np.stack([layer(k).provenance.model_weights for k in range(MODEL_LAYERS)])
    np.testing.assert_array_equal(load_layers(path).every_layer(), expected.astype(np.float32))


def test_one_stored_layer_loads_as_a_scenario_and_older_files_still_load(tmp_path):
    path = tmp_path / "one.attn.npz"
    save_layers(path, stack(stored=(2,)))
    s = load_scenario(path)
    assert s.provenance.layer == 2 and s.X.tobytes() == layer(2).X.tobytes()
    old = tmp_path / "old.attn.npz"
    save_scenario(old, layer(1))
    assert not holds_layers(old) and load_scenario(old).provenance.layer == 1
    with pytest.raises(FileFormatError, match="holds one layer, not several"):
        load_layers(old)


def rewritten(tmp_path, change):
    """A file of layers whose document change(document, members) altered."""
    document, members = layers_to_npz_parts(stack(stored=(1, 3)))
    change(document, members)
    path = tmp_path / "bad.attn.npz"
    with open(path, "wb") as f:
        write_npz(f, document, members, LAYERS_DOCUMENT)
    with pytest.raises(FileFormatError) as e:
        load_layers(path)
    message = str(e.value)
    assert message.startswith("bad.attn.npz: ") and "\n" not in message
    return message.removeprefix("bad.attn.npz: ")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d, m: d.update(version=4), "version: 4; a file of layers is 5"),
        (lambda d, m: d.update(extra=1), "extra: unknown field"),
        (lambda d, m: d.update(stored=[1, 9]), "stored[2]: expected"),
        (lambda d, m: d.update(stored=[3, 1]), "stored layers [3, 1]: expected increasing"),
        (lambda d, m: d.update(dtype="int8"), "dtype: 'int8'; expected one of float64, float32"),
        (lambda d, m: d["run"].update(kind="web"), "run.kind"),
        (lambda d, m: d["run"].update(tokens=["a"]), "run.token_ids: 4 ids for 1 tokens"),
        (lambda d, m: d.update(weights=[]), "expected either layers (scenarios) or weights"),
        (lambda d, m: d["layers"][1].update(X="layers.1.X"), "layers[2].X: names 'layers.1.X'"),
        (lambda d, m: m.update({"stray": np.zeros(2)}), "member 'stray': not named by layers."),
        (lambda d, m: m.update({"overview": m["overview"].astype(np.float64)}),
         "overview: holds float64 values; expected float32"),
        (lambda d, m: d["layers"][0]["provenance"].update(layer=2),
         "layer 1: its scenario is not that layer of this run"),
    ],
)  # fmt: skip
def test_each_problem_in_a_file_of_layers_is_named_in_one_line(tmp_path, change, message):
    assert message in rewritten(tmp_path, change)


def test_only_a_file_of_layers_may_hold_many_members(tmp_path):
    path = tmp_path / "many.attn.npz"
    save_layers(path, stack())
    with zipfile.ZipFile(path) as z:
        assert 32 < len(z.namelist()) <= 4096  # four full layers: more than one layer's 32
    assert len(load_layers(path).scenarios) == MODEL_LAYERS


def test_layer_lists_and_their_short_form():
    assert parse_layers("all", 3) == (0, 1, 2)
    assert parse_layers(" 4 ", 6) == (4,)
    assert parse_layers("0-2,5,1", 6) == (0, 1, 2, 5)
    for text, message in [
        ("2-1", "backwards"),
        ("x", "expected all"),
        ("", "expected all"),
        ("-1", "expected all"),
        ("6", "layer 6: the model has layers 0 to 5"),
    ]:
        with pytest.raises(LayersError, match=message):
            parse_layers(text, 6)
    assert spans((0, 1, 2, 5, 7, 8)) == "0-2, 5, 7-8"
    with pytest.raises(LayersError, match="expected increasing"):
        dataclasses.replace(stack(), stored=(1, 0, 2, 3))
    json.dumps(layers_to_npz_parts(stack())[0])  # the document is plain JSON
