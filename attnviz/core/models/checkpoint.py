"""What a model folder's weights are, read from the safetensors headers alone, and the
checks made with them before any weight is loaded: the memory they need, the layers
they hold against the layers config.json describes, and each tensor's shape against the
shape the config gives it."""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnviz.core.io.files import FileFormatError, open_regular
from attnviz.core.maths.scenario import ScenarioError
from attnviz.core.system import available_memory

_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I8": 1, "U8": 1}
MAX_HEADER = 2**27  # bytes of one file's JSON header
# "encoder.layer.3.", "h.3.", "model.layers.3.", "transformer.layer.3.": the layer's number
LAYER_INDEX = re.compile(r"(?:^|\.)(?:layer|layers|h|block|blocks)\.(\d+)\.")
SHOWN = 3  # mismatched tensors named in a message


@dataclass(frozen=True)
class Tensor:
    shape: tuple[int, ...]
    numbers: int


def tensors(folder: Path) -> dict[str, Tensor]:
    """Every tensor of the folder's safetensors files, by name, from their headers."""
    held: dict[str, Tensor] = {}
    for path in sorted(folder.glob("*.safetensors")):
        held.update(_header(path))
    return held


def _header(path: Path) -> dict[str, Tensor]:
    problem = f"{path.name}: not a safetensors file"
    try:
        with open_regular(path) as f:  # a pipe or a device is refused, never waited on
            head = f.read(8)
            if len(head) < 8:
                raise ScenarioError(f"{problem} (shorter than its header)")
            (size,) = struct.unpack("<Q", head)
            if size > MAX_HEADER:
                raise ScenarioError(f"{problem} (header of {size:,} bytes)")
            header = json.loads(f.read(size))
        return {
            str(name): _tensor(entry) for name, entry in header.items() if name != "__metadata__"
        }
    except FileFormatError as e:
        raise ScenarioError(str(e)) from None
    except (OSError, ValueError, TypeError, KeyError, AttributeError, RecursionError) as e:
        raise ScenarioError(f"{problem} ({type(e).__name__}: {e})") from e


def _tensor(entry: Any) -> Tensor:
    start, end = (int(x) for x in entry["data_offsets"])
    shape = tuple(int(x) for x in entry["shape"])
    return Tensor(shape, (end - start) // _BYTES.get(str(entry.get("dtype")), 4))


def check_memory(held: dict[str, Tensor], dtype: str) -> None:
    """Refuse weights that in ``dtype`` would not fit in the free memory."""
    params = sum(t.numbers for t in held.values())
    needed = params * (8 if dtype == "float64" else 4)
    free = available_memory()
    if free and needed > 0.8 * free:
        raise ScenarioError(
            f"the model has {params / 1e6:,.0f} M parameters: about {needed / 2**30:.1f} GiB "
            f"in {dtype}, and {free / 2**30:.1f} GiB of memory are free"
            + ("; try float32" if dtype == "float64" else "")
        )


def check_layers(layers: int, names: Iterable[str]) -> None:
    """Refuse a config whose layer count is not the number of layers the weights hold
    (before a model of a million layers is built for weights of two)."""
    found = {int(m.group(1)) for name in names if (m := LAYER_INDEX.search(name))}
    if found and layers != max(found) + 1:
        raise ScenarioError(
            f"config.json describes {_count(layers, 'layer')} and the weights hold "
            f"{_count(max(found) + 1, 'layer')}: they are not one model's files"
        )


def _count(n: int, what: str) -> str:
    return f"{n:,} {what}" + ("" if n == 1 else "s")


def check_shapes(
    expected: dict[str, tuple[int, ...]], held: dict[str, Tensor], prefix: str
) -> None:
    """Refuse tensors whose shape is not the one the config gives them, naming them.
    ``expected``: the model's own names and shapes; a checkpoint may put ``prefix.``
    (the base model's name) before them."""
    wrong = []
    for name, tensor in held.items():
        own = name.removeprefix(f"{prefix}.") if prefix else name
        shape = expected.get(own)
        if shape is not None and shape != tensor.shape:
            wrong.append(
                f"{name} has shape {_shape(tensor.shape)}, the config gives {_shape(shape)}"
            )
    if wrong:
        more = f"; and {len(wrong) - SHOWN} more" if len(wrong) > SHOWN else ""
        raise ScenarioError(
            "the weights do not have the shapes config.json describes: "
            + "; ".join(wrong[:SHOWN])
            + more
        )


def _shape(shape: tuple[int, ...]) -> str:
    return " × ".join(map(str, shape)) if shape else "() (one number)"
