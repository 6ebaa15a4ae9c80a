"""Several layers of one model run in one ``.attn.npz`` (version 5): ``Layers`` to and
from a file.

The archive's document is the member ``layers.json`` (instead of ``scenario.json``):

```
{"format": "attnviz-scenario", "version": 5,
 "run": {"source", "kind", "model_type", "layers", "text", "token_ids", "files", "tokens"},
 "stored": [0, 1, 2],                 the layer numbers held, increasing
 "dtype": "float64",                  the precision the layers were imported in
 "layers": [<a version 1-4 scenario document, its arrays named "layers.K.X", …>, …],
 "weights": ["layers.0.weights", …],  weights only: each layer's heads × n × n, float32
 "overview": "overview",              every layer × head (float32), when not all are stored
 "native": {"dtype": "bfloat16", "weights": ["layers.0.native", …]}   float32
}
```

A full file has ``layers`` (each with its provenance, whose model weights are the
layer's); a weights-only file (``--weights-only``) has ``weights`` and no matrices, so
it can be looked at but not edited or computed. Everything is read through the bounded
reader of ``npz_files`` and checked field by field.
"""

from __future__ import annotations

import os
from typing import Any, BinaryIO

import numpy as np

from attnviz.core.io.checks import FileFormatError, clip, expect_shape, key_text, number
from attnviz.core.io.npz_files import (
    LAYERS_DOCUMENT,
    _Archive,
    member_writer,
    scenario_from_document,
    scenario_to_npz_parts,
    write_npz,
)
from attnviz.core.io.provenance_files import provenance_fields
from attnviz.core.io.scenario_document import FORMAT, tokens_field
from attnviz.core.layers import NATIVE_DTYPES, Layers, LayersError, Run, spans
from attnviz.core.maths.scenario import Scenario

VERSION = 5
KEYS = ("format", "version", "run", "stored", "dtype", "layers", "weights", "overview", "native")
DTYPES = ("float64", "float32")


def layers_to_npz_parts(stack: Layers) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The document (layers.json) and the members of a file of several layers."""
    run = stack.run
    members: dict[str, np.ndarray] = {}
    put = member_writer(members)
    d: dict[str, Any] = {
        "format": FORMAT,
        "version": VERSION,
        "run": {
            "source": run.source,
            "kind": run.kind,
            "model_type": run.model_type,
            "layers": run.layers,
            "text": run.text,
            "token_ids": list(run.token_ids),
            "files": dict(run.files),
            "tokens": list(run.tokens),
        },
        "stored": list(stack.stored),
        "dtype": stack.dtype,
    }
    if stack.weights_only:
        d["weights"] = [
            put(f"layers.{k}.weights", w) for k, w in zip(stack.stored, stack.weights, strict=True)
        ]
    else:
        d["layers"] = []
        for k, s in zip(stack.stored, stack.scenarios, strict=True):
            document, arrays = scenario_to_npz_parts(s, f"layers.{k}.")
            d["layers"].append(document)
            members.update(arrays)
    if stack.overview is not None and not stack.covers_the_model:
        d["overview"] = put("overview", stack.overview)
    if stack.native:
        names = [
            put(f"layers.{k}.native", w)
            for k, w in zip(stack.stored, stack.native_weights, strict=True)
        ]
        d["native"] = {"dtype": stack.native, "weights": names}
    return d, members


def write_layers(f: BinaryIO, stack: Layers) -> None:
    document, members = layers_to_npz_parts(stack)
    write_npz(f, document, members, LAYERS_DOCUMENT)


def layers_from_npz(f: BinaryIO) -> Layers:
    """Read and check a file of several layers (version 5)."""
    try:
        archive = _Archive(f)
        if not archive.layers:
            raise FileFormatError("holds one layer, not several: open it as a scenario")
        return _layers_from_archive(archive)
    except OSError as e:
        raise FileFormatError(f"cannot read: {e.strerror or e}") from None


def is_layers_file(f: BinaryIO) -> bool:
    """Whether an .attn.npz holds several layers (its zip index names layers.json)."""
    try:
        return _Archive(f).layers
    except FileFormatError:
        return False


def one_scenario(archive: _Archive) -> Scenario:
    """What load_scenario makes of a file of layers: the layer when it holds one, else a
    message saying what to do instead."""
    stack = _layers_from_archive(archive)
    if stack.weights_only:
        raise FileFormatError(
            f"holds the attention weights of layers {spans(stack.stored)} only (written with "
            "--weights-only): there are no matrices to compute or edit; open it in the window "
            "to look at it"
        )
    if len(stack.stored) > 1:
        raise FileFormatError(
            f"holds layers {spans(stack.stored)} of {stack.run.source}: open it in the window "
            "(its layer stepper moves between them), or import one layer (--layer N)"
        )
    return stack.scenarios[0]


def _run(value: Any) -> tuple[Run, list[str]]:
    if not isinstance(value, dict):
        raise FileFormatError("run: expected an object")
    if "tokens" not in value:
        raise FileFormatError("run.tokens: missing")
    rest = {k: v for k, v in value.items() if k != "tokens"}
    try:  # the provenance's checks, less its per-layer fields
        fields = provenance_fields({**rest, "layer": 0, "model_weights": 0, "model_output": 0})
    except FileFormatError as e:
        raise FileFormatError(str(e).replace("provenance.", "run.", 1)) from None
    tokens = tokens_field("run.tokens", value["tokens"])
    keep = ("source", "kind", "model_type", "layers", "text", "token_ids", "files")
    run = Run(**{k: fields[k] for k in keep}, tokens=tuple(tokens))
    if len(run.token_ids) != len(tokens):
        raise FileFormatError(f"run.token_ids: {len(run.token_ids)} ids for {len(tokens)} tokens")
    return run, tokens


def _names(
    archive: _Archive, where: str, value: Any, count: int, heads: int | None, n: int
) -> list[Any]:
    """A list of count float32 members, each heads × n × n."""
    if not isinstance(value, list) or len(value) != count:
        raise FileFormatError(f"{where}: expected a list of {count} array names, one per layer")
    members = []
    for i, ref in enumerate(value):
        m = archive.take(f"{where}[{i + 1}]", ref, "heads × n × n", itemsize=4)
        heads = m.shape[0] if heads is None else heads
        expect_shape(f"{where}[{i + 1}]", m.shape, (heads, n, n))
        members.append(m)
    return members


def _layers_from_archive(archive: _Archive) -> Layers:  # noqa: C901 (a field a branch)
    data = archive.document(LAYERS_DOCUMENT)
    if not isinstance(data, dict):
        raise FileFormatError(f"{LAYERS_DOCUMENT}: expected a JSON object at the top")
    if data.get("format") != FORMAT:
        raise FileFormatError(f"format: expected {FORMAT!r}, got {clip(data.get('format'))}")
    if data.get("version") != VERSION:
        raise FileFormatError(f"version: {clip(data.get('version'), 20)}; a file of layers is 5")
    unknown = sorted(set(data) - set(KEYS))
    if unknown:
        raise FileFormatError(f"{key_text(unknown[0])}: unknown field")
    run, tokens = _run(data.get("run"))
    n = len(tokens)
    stored = data.get("stored")
    if not isinstance(stored, list) or not stored or len(stored) > run.layers:
        raise FileFormatError(f"stored: expected a list of 1 to {run.layers} layer numbers")
    stored = [number(k, f"stored[{i + 1}]", 0, run.layers - 1, True) for i, k in enumerate(stored)]
    dtype = data.get("dtype")
    if dtype not in DTYPES:
        raise FileFormatError(f"dtype: {clip(dtype)}; expected one of {', '.join(DTYPES)}")
    if ("layers" in data) == ("weights" in data):
        raise FileFormatError("expected either layers (scenarios) or weights (weights only)")
    scenarios: list[Scenario] = []
    weights: list[Any] = []
    if "layers" in data:
        docs = data["layers"]
        if not isinstance(docs, list) or len(docs) != len(stored):
            raise FileFormatError(f"layers: expected {len(stored)} scenario documents")
        for i, doc in enumerate(docs):
            try:
                scenarios.append(scenario_from_document(archive, doc, check_all=False))
            except FileFormatError as e:
                raise FileFormatError(f"layers[{i + 1}].{e}") from None
        heads = scenarios[0].n_heads
    else:
        weights = _names(archive, "weights", data["weights"], len(stored), None, n)
        heads = weights[0].shape[0]
    overview = None
    if "overview" in data:
        overview = archive.take("overview", data["overview"], "layers × heads × n × n", 4)
        expect_shape("overview", overview.shape, (run.layers, heads, n, n))
    native, native_weights = "", []
    if "native" in data:
        value = data["native"]
        if not isinstance(value, dict) or set(value) != {"dtype", "weights"}:
            raise FileFormatError('native: expected {"dtype": …, "weights": […]}')
        native = value["dtype"]
        if native not in NATIVE_DTYPES:
            raise FileFormatError(
                f"native.dtype: {clip(native)}; expected one of {', '.join(NATIVE_DTYPES)}"
            )
        native_weights = _names(archive, "native.weights", value["weights"], len(stored), heads, n)
    archive.check_all_named()
    read = archive.read
    try:
        return Layers(
            run=run,
            stored=tuple(stored),
            weights=tuple(read(w) for w in weights)
            or tuple(s.provenance.model_weights for s in scenarios),  # type: ignore[union-attr]
            scenarios=tuple(scenarios),
            overview=None if overview is None else read(overview),
            dtype=dtype,
            native=native,
            native_weights=tuple(read(w) for w in native_weights),
        )
    except LayersError as e:
        raise FileFormatError(str(e)) from None


def load_layers(path: str | os.PathLike[str]) -> Layers:
    """Read a file of several layers; FileFormatError naming the file and the problem."""
    from attnviz.core.io.files import _with_path, open_regular

    with open_regular(path) as f:
        return _with_path(path, lambda: layers_from_npz(f))  # type: ignore[no-any-return]


def save_layers(path: str | os.PathLike[str], stack: Layers) -> None:
    """Write a file of several layers atomically (an .attn.npz)."""
    from attnviz.core.io.files import atomic_write, is_binary

    if not is_binary(path):
        raise FileFormatError(f"{os.fspath(path)}: several layers are saved as .attn.npz")
    atomic_write(path, lambda f: write_layers(f, stack))


def holds_layers(path: str | os.PathLike[str]) -> bool:
    """Whether path is an .attn.npz of several layers (False for anything unreadable)."""
    from attnviz.core.io.files import is_binary, open_regular

    if not is_binary(path):
        return False
    try:
        with open_regular(path) as f:
            return is_layers_file(f)
    except (OSError, FileFormatError):
        return False
