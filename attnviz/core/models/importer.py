"""Import one attention layer of a pretrained model: find it, tokenize, run, check.

``import_model_layer(Request(source, text, layer))`` finds the model (``sources``), reads
its tokenizer (``tokens``), loads it with transformers on the CPU in float64 (or float32
when asked), runs it once on the text and returns the layer as a scenario carrying its
``Provenance``, every layer's weights for the overview, and the agreement between
attnviz's computation and the model's own. A layer whose agreement is not at rounding
level is refused: nothing approximate is ever shown as the model. Steps report progress
and can be cancelled between steps (and during a download). The last model loaded is
kept, so that the next or previous layer imports with one run of the model.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from attnviz.core.io.files import FileFormatError, open_regular, printable, read_file
from attnviz.core.layers import NATIVE_DTYPES, Layers, LayersError, Run, parse_layers
from attnviz.core.maths.scenario import LIMITS, Scenario, ScenarioError
from attnviz.core.models import checkpoint
from attnviz.core.models.sources import Cancelled, Located, locate
from attnviz.core.models.tokens import Tokens, load_tokenizer, tokenize
from attnviz.core.provenance import Provenance
from attnviz.core.system import available_memory

DTYPES = ("float64", "float32")
TOLERANCE = {"float64": 1e-10, "float32": 1e-5}  # refuse beyond this; expect 1e-12 / 1e-6
# transformers' own eager attention against the run the import compares with: the Llama
# family's code keeps the rotary angles in float32 even in a float64 model (about 1e-7).
OWN_EAGER_TOLERANCE = 1e-5
LAYER_KEYS = (
    "num_hidden_layers",
    "n_layer",
    "n_layers",
    "num_layers",
)  # config.json's names for it
OVERVIEW_CELLS = 2**25  # layers × heads × n × n kept for the overview (float32)
MAX_CONFIG = 2**24  # bytes of config.json
# the model types whose positions start after the padding index (RoBERTa's code)

Report = Callable[[str, float], None]  # what is happening, fraction done (0 to 1)


@dataclass(frozen=True)
class Request:
    """What to import."""

    source: str
    text: str
    layer: int = 0
    dtype: str = "float64"


@dataclass(frozen=True, eq=False)
class Imported:
    """An imported layer."""

    scenario: Scenario  # with its provenance
    tokens: Tokens
    overview: np.ndarray | None  # (layers, heads, n, n) float32, None when too large
    agreement_weights: float  # max |attnviz − model| over the layer's attention weights
    agreement_output: float  # … and over its attention output
    seconds: float
    dtype: str

    @property
    def provenance(self) -> Provenance:
        assert self.scenario.provenance is not None
        return self.scenario.provenance


_lock = threading.Lock()
_loaded: dict[tuple[object, ...], Any] = {}  # (folder, dtype, files' stamps) → the model
_hashes: dict[tuple[str, int, int], str] = {}


@dataclass(frozen=True)
class Peek:
    """What a model on this machine makes of a text, before importing (a live preview)."""

    model_type: str
    layers: int
    tokens: Tokens | None  # None when the text is empty
    problem: str  # why importing would be refused ('' when it would not)
    max_tokens: int = 0  # the most tokens an import takes (the model's positions, capped)


def peek(source: str, text: str) -> Peek:
    """The model's type, layer count and the tokens of ``text``; nothing is downloaded
    and no weights are read. Raises ScenarioError when the model is not on this machine."""
    folder = locate(source, download=False).folder
    config = _read_config(folder)
    problem = _unsupported(config)
    layers = _layers_of(config) or 0
    tokens = None
    if text.strip():
        try:
            tokens = tokenize(load_tokenizer(folder), text, _most_tokens(config))
        except ScenarioError as e:
            problem = problem or str(e)
    return Peek(str(config.get("model_type", "?")), layers, tokens, problem, _most_tokens(config))


def import_model_layer(
    request: Request,
    *,
    report: Report | None = None,
    cancelled: Callable[[], bool] | None = None,
) -> Imported:
    """Import ``request.layer`` of the model; raises ScenarioError (a clear message) or
    ``Cancelled``."""
    started = time.perf_counter()
    if request.dtype not in DTYPES:
        raise ScenarioError(f"dtype {request.dtype!r}: expected one of {', '.join(DTYPES)}")

    step = _stepper(report, cancelled)
    located, config, tokens = _found(request, step, cancelled)
    _check_layers(config, request.layer)
    step("Loading the weights", 0.45)
    with _lock:
        model = _model(located, request.dtype, _layers_of(config) or 0)
        _check_attention_memory(model, len(tokens.ids), request.dtype)
        step("Running the model", 0.7)
        layer = _import(model, tokens, request.layer)
        step("Checking against the model", 0.85)
        same_as_own(_attentions(model, tokens)[layer.layer], layer.model_weights)
    scenario, agreement = _checked(layer, request.dtype)
    run = Run(
        located.source, located.kind, layer.model_type, layer.layers, request.text,
        tokens.ids, tokens.labels, _file_hashes(located.folder),
    )  # fmt: skip
    step("Done", 1.0)
    return Imported(
        scenario=replace(scenario, provenance=_provenance(run, layer)),
        tokens=tokens,
        overview=_overview(layer.every_layer),
        agreement_weights=agreement[0],
        agreement_output=agreement[1],
        seconds=time.perf_counter() - started,
        dtype=request.dtype,
    )


@dataclass(frozen=True, eq=False)
class ImportedLayers:
    """Several layers of one run of the model."""

    layers: Layers
    agreement: tuple[tuple[float, float], ...]  # per imported layer: weights, output
    seconds: float

    @property
    def worst(self) -> float:
        """The largest difference between attnviz and the model over every checked layer."""
        return max((max(pair) for pair in self.agreement), default=0.0)


def import_model_layers(
    request: Request,
    layers: str = "all",
    *,
    weights_only: bool = False,
    report: Report | None = None,
    cancelled: Callable[[], bool] | None = None,
) -> ImportedLayers:
    """Import the layers ``layers`` names ('all', '3', '0-5', '1,3-4') from one load of
    the model: each layer checked as ``import_model_layer`` checks one. ``request.dtype``
    'model' imports in float64 and also runs the model in the checkpoint's own precision
    (config.json's ``dtype``/``torch_dtype``), keeping that run's attention weights.
    With ``weights_only`` the attention weights are kept (float32) without the layers'
    matrices. Raises ScenarioError (a clear message) or ``Cancelled``."""
    started = time.perf_counter()
    dtype = "float64" if request.dtype == "model" else request.dtype
    if dtype not in DTYPES:
        raise ScenarioError(
            f"dtype {request.dtype!r}: expected one of {', '.join((*DTYPES, 'model'))}"
        )
    step = _stepper(report, cancelled)
    located, config, tokens = _found(request, step, cancelled)
    _check_layers(config, 0)
    count = _layers_of(config) or 0
    try:
        stored = parse_layers(layers, count)
    except LayersError as e:
        raise ScenarioError(str(e)) from None
    native = _native_dtype(config) if request.dtype == "model" else ""
    with _lock:
        natives: list[np.ndarray] = []
        if native:
            step(f"Running the model in {native}", 0.42)
            natives = _attentions(_model(located, native, count), tokens)
        step("Loading the weights", 0.45)
        model = _model(located, dtype, count)
        _check_attention_memory(model, len(tokens.ids), dtype)
        own = _attentions(model, tokens)
        imported = []
        for i, k in enumerate(stored[:1] if weights_only else stored):
            step(f"Running layer {k}", 0.5 + 0.3 * i / len(stored))
            layer = _import(model, tokens, k)
            same_as_own(own[k], layer.model_weights)
            imported.append(layer)
    checks = []
    for i, layer in enumerate(imported):
        step(f"Checking layer {layer.layer} against the model", 0.8 + 0.2 * i / len(imported))
        checks.append(_checked(layer, dtype))
    files = _file_hashes(located.folder)
    first = imported[0]
    run = Run(
        located.source, located.kind, first.model_type, first.layers, request.text,
        tokens.ids, tokens.labels, files,
    )  # fmt: skip
    every = first.every_layer
    for k in stored:
        same_as_own(own[k], every[k])
    stack = Layers(
        run=run,
        stored=stored,
        weights=tuple(every[k] if weights_only else imported[i].model_weights
                      for i, k in enumerate(stored)),
        scenarios=() if weights_only else tuple(
            replace(scenario, provenance=_provenance(run, layer))
            for (scenario, _), layer in zip(checks, imported, strict=True)
        ),
        overview=_overview(every),
        dtype=dtype,
        native=native,
        native_weights=tuple(natives[k] for k in stored) if native else (),
    )  # fmt: skip
    step("Done", 1.0)
    return ImportedLayers(stack, tuple(a for _, a in checks), time.perf_counter() - started)


def _found(
    request: Request, step: Report, cancelled: Callable[[], bool] | None
) -> tuple[Located, dict[str, Any], Tokens]:
    """The model (found, fetched or unpacked as needed), its config.json (checked) and
    the text's tokens (checked against its vocabulary)."""
    step("Finding the model", 0.0)
    located = locate(request.source, progress=_copying(step), cancelled=cancelled)
    config = _config(located.folder)
    step("Reading the tokenizer", 0.4)
    tokens = tokenize(load_tokenizer(located.folder), request.text, _most_tokens(config))
    _check_vocabulary(tokens, config)
    return located, config, tokens


def _stepper(report: Report | None, cancelled: Callable[[], bool] | None) -> Report:
    def step(what: str, fraction: float) -> None:
        if cancelled is not None and cancelled():
            raise Cancelled
        if report is not None:
            report(what, fraction)

    return step


def _copying(step: Report) -> Callable[[str, int, int], None]:
    def copying(what: str, done: int, total: int) -> None:  # unpacking or fetching
        step(f"{what} the model ({bytes_done(done, total)})", 0.4 * done / max(total, 1))

    return copying


def _native_dtype(config: dict[str, Any]) -> str:
    """The checkpoint's own precision: config.json's dtype (torch_dtype before
    transformers 5), float32 when it names none."""
    value = config.get("dtype") or config.get("torch_dtype") or "float32"
    name = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32"}.get(
        str(value), str(value)
    )
    if name not in NATIVE_DTYPES:
        raise ScenarioError(
            f"config.json: dtype {value!r}; --dtype model runs {', '.join(NATIVE_DTYPES)}"
        )
    return name


def own_attentions(model: Any, input_ids: Any) -> list[np.ndarray]:
    """transformers' own eager attention weights of every layer, the model unchanged but
    for its attention implementation (eager, the one that gives weights), as float64, on
    ``input_ids`` (1 × n)."""
    import torch

    config = model.config
    was = config._attn_implementation
    try:
        config._attn_implementation = "eager"
        with torch.no_grad():
            out = model(input_ids=input_ids, output_attentions=True)
        return [a[0].detach().to("cpu").double().numpy() for a in out.attentions]
    except Exception as e:
        raise ScenarioError(f"the model failed on this text ({_first(e)})") from e
    finally:
        config._attn_implementation = was


def _attentions(model: Any, tokens: Tokens) -> list[np.ndarray]:
    import torch

    return own_attentions(model, torch.tensor([list(tokens.ids)]))


def same_as_own(own: np.ndarray, weights: np.ndarray) -> None:
    """transformers' own eager attention, run unchanged, must give the import's weights to
    OWN_EAGER_TOLERANCE: the import's exact run may differ from it by rounding only."""
    gap = float(np.abs(own - weights).max())
    if not gap <= OWN_EAGER_TOLERANCE:
        raise ScenarioError(
            f"transformers' own attention differs from the import's run by {gap:.2g} "
            f"(expected at most {OWN_EAGER_TOLERANCE:g}): this model does something the "
            "import does not reproduce, so it is not shown as the model"
        )


def _provenance(run: Run, layer: Any) -> Provenance:
    return Provenance(
        source=run.source,
        kind=run.kind,
        model_type=run.model_type,
        layer=layer.layer,
        layers=run.layers,
        text=run.text,
        token_ids=run.token_ids,
        model_weights=layer.model_weights,
        model_output=layer.model_output,
        files=run.files,
    )


def bytes_done(done: int, total: int) -> str:
    """'12 of 87 MB' (one decimal under 10 MB), or '12 MB' while the total is not known."""

    def mb(n: int) -> str:
        x = n / 10**6
        return f"{x:.1f}" if x < 10 else f"{x:.0f}"

    return f"{mb(done)} of {mb(total)} MB" if total else f"{mb(done)} MB"


def _read_config(folder: Path) -> dict[str, Any]:
    path = folder / "config.json"
    try:
        config = json.loads(read_file(path, MAX_CONFIG).decode("utf-8"))
    except FileFormatError as e:
        raise ScenarioError(str(e)) from None
    except RecursionError:
        raise ScenarioError(f"{printable(path)}: nested too deeply to be a config") from None
    except ValueError as e:
        raise ScenarioError(f"{printable(path)}: not readable JSON ({e})") from e
    if not isinstance(config, dict):
        raise ScenarioError(f"{folder / 'config.json'}: expected a JSON object")
    return config


def _unsupported(config: dict[str, Any]) -> str:
    """Why attnviz cannot import this model ('' when it can): its family's check of
    config.json, made before any weight is read."""
    from attnviz.core.models.families import unsupported

    return unsupported(config)


def _config(folder: Path) -> dict[str, Any]:
    config = _read_config(folder)
    problem = _unsupported(config)
    if problem:
        raise ScenarioError(problem)
    return config


def _most_tokens(config: dict[str, Any]) -> int:
    """The most tokens a text may have: the model's positions (capped at a scenario's)."""
    from attnviz.core.models.families import family_of
    from attnviz.core.models.families.base import positions

    family = family_of(config.get("model_type"))
    most = family.max_positions(config) if family is not None else positions(config)
    return LIMITS.tokens if most is None else min(LIMITS.tokens, most)


def _model(located: Located, dtype: str, layers: int) -> Any:
    """The model in ``dtype``, kept until another (or changed files) is asked for; every
    weight must come from the checkpoint (transformers would fill missing ones with
    random numbers), in the shape the config gives it, checked before any is loaded."""
    files = [*sorted(located.folder.glob("*.safetensors")), located.folder / "config.json"]
    key = (str(located.folder.resolve()), dtype, tuple(_stamp(f) for f in files))
    if key in _loaded:
        return _loaded[key]
    _loaded.clear()  # one model in memory at a time
    from attnviz.core.models.families import family_of

    model_type = str(_read_config(located.folder).get("model_type"))
    family = family_of(model_type)
    unused = family.not_loaded if family is not None else ()
    held = {k: t for k, t in checkpoint.tensors(located.folder).items() if not _any(unused, k)}
    checkpoint.check_layers(layers, held)
    checkpoint.check_memory(held, dtype)
    import torch
    import transformers
    from transformers.utils import logging

    logging.set_verbosity_error()  # its notes and progress bars would go to the terminal
    logging.disable_progress_bar()
    expected, prefix = _expected_shapes(located)
    checkpoint.check_shapes(expected, held, prefix)
    try:
        loader = getattr(transformers, family.model_class(model_type) if family else "AutoModel")
        model, info = loader.from_pretrained(
            str(located.folder),
            dtype=getattr(torch, dtype),
            attn_implementation="eager",
            local_files_only=True,
            use_safetensors=True,
            output_loading_info=True,
        )
    except Exception as e:  # transformers raises many kinds for a broken checkpoint
        raise ScenarioError(
            f"{located.source}: transformers could not load it ({_first(e)})"
        ) from e
    # BERT's pooler reads the output of the last layer, never the attention
    missing = sorted(k for k in info.get("missing_keys") or () if not k.startswith("pooler."))
    mismatched = sorted(str(k[0]) for k in info.get("mismatched_keys") or ())
    if missing or mismatched:
        raise ScenarioError(
            f"{located.source}: the checkpoint does not hold every weight the config describes "
            f"({'missing' if missing else 'of another shape'}: {_names(missing or mismatched)}); "
            "transformers would fill them with random numbers, so it is not imported"
        )
    family = family_of(model.config.model_type)
    stale = (*family.stale_buffers, *family.not_loaded) if family is not None else ()
    unexpected = _inside_layers(info.get("unexpected_keys") or (), stale)
    if unexpected:
        raise ScenarioError(
            f"{located.source}: the checkpoint's layers hold weights the model has no place "
            f"for ({_names(unexpected)}); transformers would drop them, computing another "
            "layer than the checkpoint's, so it is not imported"
        )
    if family is not None:
        family.prepare(model)
    model.eval()
    _loaded[key] = model
    return model


def _inside_layers(keys: Any, stale: tuple[str, ...]) -> list[str]:
    """The names among ``keys`` inside the layers, but for the ``stale`` buffers: task heads
    (lm_head, pooler, classifier, cls.…) lie outside the layers."""
    return sorted(
        str(k) for k in keys if checkpoint.LAYER_INDEX.search(str(k)) and not _any(stale, str(k))
    )


def _any(patterns: tuple[str, ...], name: str) -> bool:
    """Whether any of the regular expressions is found in name."""
    return any(re.search(p, name) for p in patterns)


def _names(names: list[str]) -> str:
    """The first three names, and how many more."""
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def _expected_shapes(located: Located) -> tuple[dict[str, tuple[int, ...]], str]:
    """The shape of each weight of the model config.json describes, from a model built
    on the meta device (no memory), and the base model's name (a checkpoint's prefix)."""
    import torch
    from transformers import AutoConfig, AutoModel

    try:
        config = AutoConfig.from_pretrained(str(located.folder), local_files_only=True)
        with torch.device("meta"):
            model = AutoModel.from_config(config, attn_implementation="eager")
    except Exception as e:  # transformers raises many kinds for a broken config
        raise ScenarioError(
            f"{located.source}: transformers could not build it ({_first(e)})"
        ) from e
    shapes = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    return shapes, str(getattr(model, "base_model_prefix", ""))


def _stamp(path: Path) -> tuple[int, int]:
    stat = path.stat()
    return stat.st_size, stat.st_mtime_ns


def _first(e: BaseException) -> str:
    """An exception's first line, with its type."""
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0]}" if lines else type(e).__name__


def _layers_of(config: dict[str, Any]) -> int | None:
    """The layer count config.json gives, under any of its names."""
    return next((config[k] for k in LAYER_KEYS if isinstance(config.get(k), int)), None)


def _check_layers(config: dict[str, Any], layer: int) -> None:
    layers = _layers_of(config)
    if layers is None or layers < 1:
        raise ScenarioError(f"config.json: the number of layers is {layers!r}; expected 1 or more")
    if not 0 <= layer < layers:
        raise ScenarioError(f"layer {layer}: the model has layers 0 to {layers - 1}")


def _check_vocabulary(tokens: Tokens, config: dict[str, Any]) -> None:
    size = config.get("vocab_size")
    if not isinstance(size, int):
        return
    for label, i in zip(tokens.labels, tokens.ids, strict=True):
        if not 0 <= i < size:
            raise ScenarioError(
                f"token {label!r} has id {i}; the model's vocabulary has {size} ids "
                "(its tokenizer and its weights do not match)"
            )


def forget_models() -> None:
    """Drop the model kept in memory."""
    with _lock:
        _loaded.clear()


def _import(model: Any, tokens: Tokens, layer: int) -> Any:
    import torch

    from attnviz.core.models.hf_layer import import_layer

    ids = torch.tensor([list(tokens.ids)])
    try:
        return import_layer(model, ids, layer, tokens.labels)
    except ScenarioError:
        raise
    except Exception as e:  # the model failed on this input: say so, in one line
        raise ScenarioError(f"the model failed on this text ({_first(e)})") from e


def _checked(layer: Any, dtype: str) -> tuple[Scenario, tuple[float, float]]:
    from attnviz.core.maths.forward import compute

    scenario = layer.scenario
    r = compute(scenario)
    weights = float(np.abs(r.weights - layer.model_weights).max())
    output = float(np.abs(r.final - layer.model_output).max())
    worst = max(weights, output)
    if not worst <= TOLERANCE[dtype]:
        raise ScenarioError(
            f"attnviz's numbers differ from the model's by {worst:.2g} (expected at most "
            f"{TOLERANCE[dtype]:g} in {dtype}): this layer does something attnviz does not "
            "represent, so it is not shown as the model"
        )
    return scenario, (weights, output)


def _check_attention_memory(model: Any, n: int, dtype: str) -> None:
    """Every layer's n × n weights are kept by the model's run: refuse a text whose weights
    would not fit in the free memory."""
    config = model.config
    cells = config.num_hidden_layers * config.num_attention_heads * n * n
    needed = cells * (8 if dtype == "float64" else 4) * 2 + cells * 4  # the run, and ours
    free = available_memory()
    if free and needed > 0.5 * free:
        raise ScenarioError(
            f"{n} tokens: every layer's attention weights take about {needed / 2**30:.1f} GiB, "
            f"and {free / 2**30:.1f} GiB of memory are free; use a shorter text"
        )


def _overview(every_layer: tuple[np.ndarray, ...]) -> np.ndarray | None:
    cells = sum(a.size for a in every_layer)
    if cells > OVERVIEW_CELLS:
        return None
    return np.stack(every_layer).astype(np.float32)


def _file_hashes(folder: Path) -> tuple[tuple[str, str], ...]:
    """SHA-256 of each weights file (remembered by size and modification time)."""
    hashes = []
    for path in sorted(folder.glob("*.safetensors")):
        stat = path.stat()
        key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
        if key not in _hashes:
            digest = hashlib.sha256()
            with open_regular(path) as f:
                for block in iter(lambda: f.read(2**22), b""):
                    digest.update(block)
            _hashes[key] = digest.hexdigest()
        hashes.append((path.name, _hashes[key]))
    return tuple(hashes)
