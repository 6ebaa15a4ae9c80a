"""The ``.attn.npz`` form, for large layers: an uncompressed NumPy ``.npz`` archive (it
opens with ``np.load(path, allow_pickle=False)``) whose members are

- ``scenario.json``: a 1-D uint8 array, the UTF-8 bytes of the same JSON document as
  the text form, except that each matrix is the name of the member that holds it;
- the matrices, float64, C order, named by their place in the document:
  ``X`` (n × d_model), ``X_kv`` (m × d_model), ``W_O`` (H·d_k × d_model), ``b_O``
  (d_model); ``heads`` is an object of per-head stacks instead of a list of heads:
  ``heads.W_Q`` (H × d_model × d_k), ``heads.W_K`` and ``heads.W_V`` (the same), and the
  vectors ``heads.b_Q``, ``heads.q_norm``, … (H × d_k); with shared key/value heads
  ``kv_heads.W_K``, ``kv_heads.W_V`` (G × d_model × d_k) and ``kv_heads.b_K``, … (G × d_k);
  ``settings.mask_matrix`` (n × m of 0.0 and 1.0); ``provenance.model_weights``
  (heads × n × n) and ``provenance.model_output`` (n × d_model).

For example ``{"X": "X", "heads": {"W_Q": "heads.W_Q", "W_K": "heads.W_K", "W_V":
"heads.W_V"}, "W_O": "W_O", ...}``. Every member is named exactly once. The reader reads
each member's ``.npy`` header before its data (a 20-byte member cannot ask for
terabytes), checks sizes against ``MAX_NPZ_BYTES`` before reading anything, and refuses
members nobody names. Optional arrays are written when they differ bit for bit from
their neutral value, so the binary form round-trips every bit (−0.0 too).
"""

from __future__ import annotations

import io
import json
import math
import os
import struct
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, BinaryIO

import numpy as np

from attnviz.core.io.checks import (
    MAX_MATRIX_CELLS,
    FileFormatError,
    clip,
    expect_shape,
    key_text,
    reason,
    shape_text,
    size_text,
)
from attnviz.core.io.json_files import check_counts, no_duplicates, parse_constant
from attnviz.core.io.provenance_files import (
    make_provenance,
    provenance_fields,
    provenance_shapes,
    provenance_to_dict,
)
from attnviz.core.io.scenario_document import (
    FORMAT,
    HEAD_KEYS,
    KV_HEAD_KEYS,
    Q_HEAD_KEYS,
    V1_HEAD_KEYS,
    VECTORS,
    check_document,
    document_settings,
    head_keys,
    in_use,
    settings_to_dict,
    tokens_field,
    version_for,
)
from attnviz.core.maths.scenario import LIMITS, WEIGHT_NAMES, Scenario, ScenarioError

NPZ_SUFFIX = ".attn.npz"
MAX_NPZ_BYTES = 2 * 2**30  # the file, and its members unpacked, together
MAX_NPZ_MEMBERS = 32
MAX_LAYERS_MEMBERS = 4096  # an .attn.npz of several layers (version 5): a member per array
MAX_NPZ_DOCUMENT = 16 * 2**20  # scenario.json (or layers.json) of an .attn.npz
_DOCUMENT = "scenario.json"
LAYERS_DOCUMENT = "layers.json"  # the document of an .attn.npz of several layers
_NPY_HEADER_MOST = 16 * 2**10  # bytes: numpy itself refuses headers over 10,000
_ZIP_INDEX_MOST = 2**20  # bytes of central directory: MAX_NPZ_MEMBERS entries need far less
_EPOCH = (1980, 1, 1, 0, 0, 0)  # every member's date: the same scenario, the same bytes


def member_writer(members: dict[str, np.ndarray]) -> Callable[[str, np.ndarray], str]:
    """A matrix writer for a document whose arrays are members (here and in snapshots):
    keeps the array in members and returns its name, which stands in its place."""

    def put(name: str, array: np.ndarray) -> str:
        members[name] = array
        return name

    return put


def _neutral_bits(s: Scenario, name: str) -> bool:
    """Whether an optional array holds its neutral value (0.0, or 1.0 for norm weights)
    bit for bit, so that leaving it out loses nothing (−0.0 is not neutral here)."""
    array = np.asarray(getattr(s, name))
    return bool(array.tobytes() == np.full(array.shape, 1.0 if "norm" in name else 0.0).tobytes())


def scenario_to_npz_parts(
    s: Scenario, prefix: str = ""
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The document of an .attn.npz (each matrix replaced by its member's name) and the
    members by name, each name after ``prefix`` (``layers.3.`` in a file of layers)."""
    members: dict[str, np.ndarray] = {}
    keep = member_writer(members)

    def put(name: str, array: np.ndarray) -> str:
        return keep(prefix + name, array)

    shared = s.kv_heads != s.n_heads
    optional = False  # an optional array is written: version 2 at least (−0.0 biases too)

    def stacks(where: str, names: tuple[str, ...]) -> dict[str, str]:
        nonlocal optional
        out = {}
        for name in names:
            array = np.asarray(getattr(s, name))
            if name not in WEIGHT_NAMES:
                if not in_use(s, name) and _neutral_bits(s, name):
                    continue
                optional, array = True, array[:, 0, :]
            out[name] = put(f"{where}.{name}", array)
        return out

    d: dict[str, Any] = {"format": FORMAT, "version": 1, "tokens": list(s.tokens)}
    d["X"] = put("X", s.X)
    if s.X_kv is not None:
        d["kv_tokens"], d["X_kv"] = list(s.key_tokens), put("X_kv", s.X_kv)
    d["heads"] = stacks("heads", Q_HEAD_KEYS if shared else HEAD_KEYS)
    if shared:
        d["kv_heads"] = stacks("kv_heads", KV_HEAD_KEYS)
    d["W_O"] = put("W_O", s.W_O)
    if not _neutral_bits(s, "b_O"):
        optional = True
        d["b_O"] = put("b_O", s.b_O[0])
    d["settings"] = settings_to_dict(s.settings)
    if s.settings.mask == "custom" and s.mask_matrix is not None:
        d["settings"]["mask_matrix"] = put("settings.mask_matrix", s.mask_matrix)
    if s.settings.loss_target == "custom" and s.target is not None:
        d["settings"]["target"] = put("settings.target", s.target)
    if s.settings.positional == "relative-bias" and s.relative_bias is not None:
        d["settings"]["relative_bias"] = put("settings.relative_bias", s.relative_bias)
    if s.provenance is not None:
        d["provenance"] = provenance_to_dict(s.provenance, put)
    d["version"] = max(version_for(s), 2 if optional else 1)
    return d, members


def write_npz(
    f: BinaryIO,
    document: dict[str, Any],
    members: dict[str, np.ndarray],
    name: str = _DOCUMENT,
) -> None:
    """Stream an uncompressed .npz to f: each array goes from memory to the file once;
    the document is the member ``name``."""
    text = json.dumps(document, ensure_ascii=False).encode("utf-8")
    arrays = {name: np.frombuffer(text, dtype=np.uint8), **members}
    with zipfile.ZipFile(f, "w", zipfile.ZIP_STORED) as archive:
        for name, array in arrays.items():
            info = zipfile.ZipInfo(name + ".npy", date_time=_EPOCH)
            info.external_attr = 0o644 << 16
            data = np.ascontiguousarray(array)
            with archive.open(info, "w", force_zip64=True) as member:
                header = np.lib.format.header_data_from_array_1_0(data)
                np.lib.format.write_array_header_1_0(member, header)
                member.write(data.data.cast("B"))


@dataclass(frozen=True)
class _Member:
    """One array of an .attn.npz: its zip entry and its .npy header."""

    key: str  # the entry's name less ".npy": what the document names
    info: zipfile.ZipInfo
    start: int  # where a stored entry's bytes begin in the file; -1 for deflated ones
    header: bytes  # the .npy header, magic included
    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    fortran: bool


def _member_text(key: str) -> str:
    return f"member {clip(key)}"


class _Archive:
    """An .attn.npz open for reading. Opening checks the zip index, the entries' sizes
    (unpacked, against MAX_NPZ_BYTES) and every .npy header against its entry's size, all
    before any array's data is read; ``take`` checks what the document names."""

    def __init__(self, f: BinaryIO) -> None:
        self.f = f
        self.size = f.seek(0, os.SEEK_END)
        if self.size > MAX_NPZ_BYTES:
            raise FileFormatError(f"larger than {size_text(MAX_NPZ_BYTES)}")
        f.seek(0)
        magic = f.read(4)
        if magic.lstrip(b"\xef\xbb\xbf \t\r\n")[:1] == b"{":
            raise FileFormatError("JSON text, not an .npz archive: name it .attn.json to open it")
        if magic not in (b"PK\x03\x04", b"PK\x05\x06"):
            raise FileFormatError("not an .attn.npz archive (not a zip file)")
        self._check_index()
        try:
            self.zip = zipfile.ZipFile(f)
            infos = self.zip.infolist()
        except Exception as e:  # zipfile can raise almost anything on a damaged index
            raise FileFormatError(f"damaged: not a readable zip archive ({reason(e)})") from None
        self.layers = any(info.filename == LAYERS_DOCUMENT + ".npy" for info in infos)
        if len(infos) > (MAX_LAYERS_MEMBERS if self.layers else MAX_NPZ_MEMBERS):
            raise FileFormatError(  # more entries than the end record counted, or one layer
                f"{len(infos):,} members; an .attn.npz holds at most {MAX_NPZ_MEMBERS}"
                + (f" ({MAX_LAYERS_MEMBERS:,} with several layers)" if self.layers else "")
            )
        total = 0
        for info in infos:  # sizes first: nothing is read from a zip bomb
            total += info.file_size
            if info.file_size > MAX_NPZ_BYTES or total > MAX_NPZ_BYTES:
                raise FileFormatError(
                    f"{_member_text(info.filename.removesuffix('.npy'))}: unpacks to "
                    f"{size_text(info.file_size)}; "
                    f"an .attn.npz unpacks to at most {size_text(MAX_NPZ_BYTES)} in all"
                )
        self.members: dict[str, _Member] = {}
        for info in infos:
            if not info.filename.endswith(".npy"):
                raise FileFormatError(
                    f"{_member_text(info.filename)}: not an .npy array (an .attn.npz holds "
                    f"{LAYERS_DOCUMENT if self.layers else _DOCUMENT} and the arrays it names)"
                )
            key = info.filename[:-4]
            if key in self.members:
                raise FileFormatError(f"{_member_text(key)}: appears twice")
            self.members[key] = self._header(key, info)
        self.named: dict[str, str] = {}  # member key: the field that names it

    def _check_index(self) -> None:
        """Refuse, before zipfile reads it, an index that is missing or too large: the
        classic end record's counts, and those of a zip64 end record where there is one
        (zipfile believes the zip64 record, so a small classic one proves nothing)."""
        tail = min(self.size, 22 + 0xFFFF)  # the end record and the longest comment
        self.f.seek(self.size - tail)
        data = self.f.read(tail)
        at = data.rfind(b"PK\x05\x06")
        if at < 0 or len(data) - at < 22:
            raise FileFormatError("damaged or cut short: the zip index at its end is missing")
        entries, index_bytes = struct.unpack_from("<HL", data, at + 10)
        self._check_counts(entries, index_bytes)
        end = self.size - tail + at  # where the end record starts in the file
        if end < 20:
            return
        self.f.seek(end - 20)
        locator = self.f.read(20)
        if locator[:4] != b"PK\x06\x07":
            return
        (record,) = struct.unpack_from("<Q", locator, 8)
        # zipfile reads the zip64 record just before the locator; the locator points at it
        for start in {end - 20 - 56, record}:
            if 0 <= start <= self.size - 56:
                self.f.seek(start)
                zip64 = self.f.read(56)
                if zip64[:4] == b"PK\x06\x06":
                    here, entries, index_bytes = struct.unpack_from("<QQQ", zip64, 24)
                    self._check_counts(max(here, entries), index_bytes)

    @staticmethod
    def _check_counts(entries: int, index_bytes: int) -> None:
        if entries > MAX_LAYERS_MEMBERS:
            raise FileFormatError(
                f"{entries:,} members; an .attn.npz holds at most {MAX_NPZ_MEMBERS} "
                f"({MAX_LAYERS_MEMBERS:,} with several layers)"
            )
        if index_bytes > _ZIP_INDEX_MOST:
            raise FileFormatError(f"damaged: its zip index says it is {index_bytes:,} bytes")

    def _start(self, key: str, info: zipfile.ZipInfo) -> int:
        """Where a stored entry's bytes begin, from its local header."""
        self.f.seek(info.header_offset)
        local = self.f.read(30)
        if len(local) < 30 or local[:4] != b"PK\x03\x04":
            raise FileFormatError(f"{_member_text(key)}: damaged (its zip entry is missing)")
        name_bytes, extra_bytes = struct.unpack_from("<HH", local, 26)
        start: int = info.header_offset + 30 + name_bytes + extra_bytes
        if info.compress_size != info.file_size:
            raise FileFormatError(f"{_member_text(key)}: damaged (a stored entry of two sizes)")
        if start + info.compress_size > self.size:
            raise FileFormatError(f"{_member_text(key)}: cut short")
        return start

    def _header(self, key: str, info: zipfile.ZipInfo) -> _Member:
        """Read and check a member's .npy header: its shape must fit the entry's size."""
        name = _member_text(key)
        if info.flag_bits & 0x1:
            raise FileFormatError(f"{name}: encrypted")
        most = min(info.file_size, _NPY_HEADER_MOST)
        if info.compress_type == zipfile.ZIP_STORED:
            start = self._start(key, info)
            self.f.seek(start)
            prefix = self.f.read(most)
        elif info.compress_type == zipfile.ZIP_DEFLATED:
            start = -1
            try:
                with self.zip.open(info) as entry:
                    prefix = entry.read(most)
            except Exception as e:  # a damaged entry fails in zipfile or zlib
                raise FileFormatError(f"{name}: damaged ({reason(e)})") from None
        else:
            raise FileFormatError(
                f"{name}: compressed by method {info.compress_type}; attnviz reads "
                "stored and deflated members"
            )
        f = io.BytesIO(prefix)
        try:
            version = np.lib.format.read_magic(f)
            width = {(1, 0): 2, (2, 0): 4}.get(version)
            if width is None:
                raise ValueError(f"format version {version[0]}.{version[1]} is not supported")
            length = int.from_bytes(prefix[8 : 8 + width], "little")
            if length > 10_000:
                raise ValueError(f"a header of {length:,} bytes (at most 10,000)")
            read_header = (
                np.lib.format.read_array_header_1_0
                if version == (1, 0)
                else np.lib.format.read_array_header_2_0
            )
            shape, fortran, dtype = read_header(f)
        except Exception as e:  # numpy's header parser can raise almost anything on junk
            raise FileFormatError(f"{name}: not a .npy array: {reason(e)}") from None
        if dtype.hasobject:
            raise FileFormatError(f"{name}: holds Python objects (pickles are never loaded)")
        if not all(type(d) is int and d >= 0 for d in shape):
            raise FileFormatError(f"{name}: not a .npy array: shape {clip(shape)}")
        header = prefix[: f.tell()]
        declared = math.prod(shape) * dtype.itemsize
        if declared != info.file_size - len(header):
            raise FileFormatError(
                f"{name}: its header declares {shape_text(shape)} {dtype} values "
                f"({declared:,} bytes), the member holds {info.file_size - len(header):,}"
            )
        return _Member(key, info, start, header, shape, dtype, bool(fortran))

    def document(self, name: str = _DOCUMENT) -> Any:
        """The parsed scenario.json (or the document named)."""
        m = self.members.get(name)
        if m is None:
            raise FileFormatError(f"no {name} member: not an attnviz scenario archive")
        if m.dtype != np.uint8 or len(m.shape) != 1:
            raise FileFormatError(
                f"{name}: expected UTF-8 bytes (a 1-D uint8 array), "
                f"got {m.dtype} values of shape {clip(m.shape)}"
            )
        if m.info.file_size > MAX_NPZ_DOCUMENT:
            raise FileFormatError(f"{name}: larger than {size_text(MAX_NPZ_DOCUMENT)}")
        raw = self.read(m).tobytes()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise FileFormatError(f"{name}: not UTF-8 text (byte {e.start + 1})") from None
        check_counts(text)
        try:
            return json.loads(text, parse_constant=parse_constant, object_pairs_hook=no_duplicates)
        except json.JSONDecodeError as e:
            raise FileFormatError(
                f"{name}: not valid JSON: {e.msg} at line {e.lineno}, column {e.colno}"
            ) from None
        except RecursionError:
            raise FileFormatError(f"{name}: nested too deeply to be a scenario") from None
        except ValueError as e:
            if isinstance(e, FileFormatError):
                raise
            raise FileFormatError(f"{name}: not valid JSON: {e}") from None

    def take(self, where: str, ref: Any, axes: str, itemsize: int = 8) -> _Member:
        """The float64 (float32 with itemsize 4) member that field where names, with
        len(axes) dimensions."""
        if not isinstance(ref, str):
            raise FileFormatError(
                f"{where}: expected the name of an array in the archive, got {clip(ref)}"
            )
        if ref in (_DOCUMENT, LAYERS_DOCUMENT):
            raise FileFormatError(f"{where}: names {ref}, the document, not an array")
        m = self.members.get(ref)
        if m is None:
            raise FileFormatError(f"{where}: names {clip(ref)}, which the archive does not hold")
        if ref in self.named:
            raise FileFormatError(f"{where}: names {clip(ref)}, as {self.named[ref]} does")
        self.named[ref] = where
        if m.dtype.kind != "f" or m.dtype.itemsize != itemsize:
            expected = f"float{8 * itemsize}"
            raise FileFormatError(f"{where}: holds {m.dtype} values; expected {expected}")
        ndim = axes.count("×") + 1
        if len(m.shape) != ndim:
            got = shape_text(m.shape) if m.shape else "a single number"
            raise FileFormatError(f"{where}: expected {ndim}-D ({axes}), got {got}")
        if 0 in m.shape:
            raise FileFormatError(f"{where}: a {shape_text(m.shape)} array holds no numbers")
        cells = math.prod(m.shape[-2:])
        if cells > MAX_MATRIX_CELLS:
            per = " per head" if ndim == 3 else ""
            raise FileFormatError(
                f"{where}: {shape_text(m.shape)} is over {MAX_MATRIX_CELLS} cells{per}"
            )
        return m

    def check_all_named(self) -> None:
        document = LAYERS_DOCUMENT if self.layers else _DOCUMENT
        unnamed = sorted(set(self.members) - set(self.named) - {document})
        if unnamed:
            raise FileFormatError(
                f"{_member_text(unnamed[0])}: not named by {document} (an .attn.npz holds "
                "only the arrays its document names)"
            )

    def read(self, m: _Member) -> np.ndarray:
        """A member's array, read-only, C order, native byte order; the CRC is checked."""
        count = math.prod(m.shape)
        if m.start >= 0:
            array = np.empty(count, dtype=m.dtype)
            view = array.data.cast("B")
            self.f.seek(m.start + len(m.header))
            done = 0
            while done < len(view):
                got = self.f.readinto(view[done:])  # type: ignore[attr-defined]
                if not got:
                    raise FileFormatError(f"{_member_text(m.key)}: cut short")
                done += got
            if zlib.crc32(view, zlib.crc32(m.header)) != m.info.CRC:
                raise FileFormatError(
                    f"{_member_text(m.key)}: damaged (its CRC-32 checksum does not match)"
                )
        else:
            try:
                with self.zip.open(m.info) as entry:
                    raw = entry.read()  # zipfile stops at file_size and checks the CRC
            except Exception as e:
                raise FileFormatError(f"{_member_text(m.key)}: damaged ({reason(e)})") from None
            if len(raw) != m.info.file_size:
                raise FileFormatError(f"{_member_text(m.key)}: cut short")
            array = np.frombuffer(raw, dtype=m.dtype, count=count, offset=len(m.header))
        array = array.reshape(m.shape, order="F" if m.fortran else "C")
        if m.fortran or not m.dtype.isnative:
            array = np.ascontiguousarray(array, dtype=m.dtype.newbyteorder("="))
        array.flags.writeable = False  # so that the Scenario keeps it without a copy
        return array


def _npz_heads(
    archive: _Archive,
    where: str,
    value: Any,
    names: tuple[tuple[str, ...], tuple[str, ...]],
    version: int,
    d_model: int,
    d_k: int | None,
) -> tuple[dict[str, _Member], int, int]:
    """The per-head stacks an .attn.npz document names: (members, heads, d_k)."""
    required, allowed = names
    if not isinstance(value, dict):
        raise FileFormatError(
            f"{where}: expected an object naming the per-head stacks, e.g. "
            f'{{"W_Q": "{where}.W_Q", ...}}'
        )
    newer = [k for k in value if k in HEAD_KEYS and k not in V1_HEAD_KEYS]
    if version < 2 and newer:
        raise FileFormatError(f"{where}.{newer[0]}: needs version 2 (the file says 1)")
    extra = sorted(set(value) - set(allowed))
    missing = [n for n in required if n not in value]
    if extra or missing:
        problem = f"{key_text(extra[0])}: unknown field" if extra else f"{missing[0]}: missing"
        raise FileFormatError(f"{where}.{problem}")
    stacks: dict[str, _Member] = {}
    count = None
    for name in sorted((n for n in allowed if n in value), key=lambda n: n in VECTORS):
        at = f"{where}.{name}"
        if name in VECTORS:
            m = archive.take(at, value[name], "heads × d_k")
            assert count is not None and d_k is not None  # a matrix came first
            expect_shape(at, m.shape, (count, d_k))
        else:
            m = archive.take(at, value[name], "heads × d_model × d_k")
            count = m.shape[0] if count is None else count
            d_k = m.shape[2] if d_k is None else d_k
            if m.shape[0] > LIMITS.heads:
                raise FileFormatError(f"{at}: {m.shape[0]} heads; the limit is {LIMITS.heads}")
            expect_shape(at, m.shape, (count, d_model, d_k))
        stacks[name] = m
    assert count is not None and d_k is not None
    return stacks, count, d_k


def _scenario_from_archive(archive: _Archive) -> Scenario:
    if archive.layers:
        from attnviz.core.io.layers_files import one_scenario

        return one_scenario(archive)
    return scenario_from_document(archive, archive.document(), check_all=True)


def scenario_from_document(archive: _Archive, data: Any, check_all: bool) -> Scenario:
    """The scenario a document names the arrays of (the archive's own, or one layer's of
    a file of layers); every member must be named when check_all."""
    version = check_document(data)
    take = archive.take
    tokens = tokens_field("tokens", data["tokens"])
    n = len(tokens)
    plan = {"X": take("X", data["X"], "n × d_model")}
    d_model = plan["X"].shape[1]
    expect_shape("X", plan["X"].shape, (n, d_model))
    labels: dict[str, Any] = {}
    if ("kv_tokens" in data) != ("X_kv" in data):
        raise FileFormatError("X_kv: cross-attention needs both kv_tokens and X_kv")
    m = n
    if "X_kv" in data:
        labels["kv_tokens"] = tuple(tokens_field("kv_tokens", data["kv_tokens"]))
        m = len(labels["kv_tokens"])
        plan["X_kv"] = take("X_kv", data["X_kv"], "m × d_model")
        expect_shape("X_kv", plan["X_kv"].shape, (m, d_model))
    shared = "kv_heads" in data
    keys = head_keys(version, shared)
    heads, h, d_k = _npz_heads(archive, "heads", data["heads"], keys, version, d_model, None)
    plan.update(heads)
    if shared:
        names = (("W_K", "W_V"), KV_HEAD_KEYS)
        kv, g, _ = _npz_heads(archive, "kv_heads", data["kv_heads"], names, version, d_model, d_k)
        if h % g:
            raise FileFormatError(f"kv_heads: {g} key/value heads do not divide {h} query heads")
        plan.update(kv)
    plan["W_O"] = take("W_O", data["W_O"], "heads·d_k × d_model")
    expect_shape("W_O", plan["W_O"].shape, (h * d_k, d_model))
    if "b_O" in data:
        plan["b_O"] = take("b_O", data["b_O"], "d_model")
        expect_shape("b_O", plan["b_O"].shape, (d_model,))
    settings, settings_value = document_settings(data, version)
    if settings.mask == "custom":
        mask = take("settings.mask_matrix", settings_value["mask_matrix"], "n × m")
        expect_shape("settings.mask_matrix", mask.shape, (n, m))
        plan["mask_matrix"] = mask
    if settings.loss_target == "custom":
        target = take("settings.target", settings_value["target"], "n × d_model")
        expect_shape("settings.target", target.shape, (n, d_model))
        plan["target"] = target
    if settings.positional == "relative-bias":
        table = take("settings.relative_bias", settings_value["relative_bias"], "buckets × heads")
        expect_shape("settings.relative_bias", table.shape, (settings.relative_buckets, h))
        plan["relative_bias"] = table
    model = None
    if "provenance" in data:
        fields = provenance_fields(data["provenance"])
        cube = take("provenance.model_weights", data["provenance"]["model_weights"], "h × n × n")
        out = take("provenance.model_output", data["provenance"]["model_output"], "n × d_model")
        provenance_shapes(cube.shape, out.shape)
        model = (fields, cube, out)
    if check_all:
        archive.check_all_named()

    arrays: dict[str, Any] = {name: archive.read(member) for name, member in plan.items()}
    for name in VECTORS:
        if name in arrays:  # stored as heads × d_k (d_model for b_O), held as heads × 1 × d_k
            a = arrays[name]
            arrays[name] = a.reshape(1, -1) if a.ndim == 1 else a.reshape(a.shape[0], 1, -1)
    provenance = None
    if model is not None:
        fields, cube, out = model
        provenance = make_provenance(fields, archive.read(cube), archive.read(out))
    try:
        return Scenario(
            tokens=tuple(tokens), settings=settings, provenance=provenance, **labels, **arrays
        )
    except ScenarioError as e:
        raise FileFormatError(str(e)) from None


def snapshot_arrays(f: BinaryIO) -> dict[str, np.ndarray]:
    """Every array of an autosave snapshot (``np.savez`` of plain arrays), by name, read
    within the bounds of an .attn.npz: the zip index, the members' unpacked sizes and
    .npy headers are checked first, and a member that is neither text (within
    MAX_NPZ_DOCUMENT) nor float64 matrices (within MAX_MATRIX_CELLS each) is refused,
    all before any data is read."""
    archive = _Archive(f)
    for key, m in archive.members.items():
        name = _member_text(key)
        if m.dtype.kind == "U":  # a JSON text, or token labels
            if m.info.file_size > MAX_NPZ_DOCUMENT:
                raise FileFormatError(f"{name}: text larger than {size_text(MAX_NPZ_DOCUMENT)}")
            if len(m.shape) > 1 or math.prod(m.shape) > LIMITS.tokens:
                raise FileFormatError(
                    f"{name}: {shape_text(m.shape)} texts; expected one, or a label per "
                    f"token (at most {LIMITS.tokens})"
                )
        elif m.dtype.kind != "f" or m.dtype.itemsize != 8:
            raise FileFormatError(f"{name}: holds {m.dtype} values; expected float64 or text")
        elif not 1 <= len(m.shape) <= 3 or math.prod(m.shape[-2:]) > MAX_MATRIX_CELLS:
            raise FileFormatError(
                f"{name}: {shape_text(m.shape)}; expected matrices of at most "
                f"{MAX_MATRIX_CELLS} cells"
            )
    return {key: archive.read(m) for key, m in archive.members.items()}


def scenario_from_npz(f: BinaryIO) -> Scenario:
    """Read and check an .attn.npz from a binary file open for reading (seekable)."""
    try:
        return _scenario_from_archive(_Archive(f))
    except OSError as e:
        raise FileFormatError(f"cannot read: {e.strerror or e}") from None
