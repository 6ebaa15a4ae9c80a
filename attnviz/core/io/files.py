"""Reading and writing attnviz's files: scenarios by suffix, matrices, snapshots.

The forms live beside this module: ``json_files`` (``.attn.json``, the default: text, one
matrix row per line) and ``npz_files`` (``.attn.npz``, binary, for large layers) share
the document of ``scenario_document``, whose version-3 ``provenance`` is read and written
by ``provenance_files``; ``checks`` holds ``FileFormatError`` and the checks they all
share. Everything other modules use is importable from here.

Here: ``load_scenario`` and ``save_scenario`` choose the form by the suffix
(``is_binary``); matrices as CSV or ``.npy``; the window's autosave snapshots. Loading
never executes anything from a file (no pickles), checks every shape and number, and
raises ``FileFormatError`` (one type for every bad file) whose message names the problem
and where, e.g. ``heads[2].W_K: expected 4×2, got 4×3``; nothing is returned half-loaded.
Every read goes through ``open_regular``: only regular files are read, so a named pipe
or a device never blocks the program. Writes are atomic (``atomic_write``): a temporary
file named after the target in the same folder, then a rename; the temporary files of a
save that was killed are removed before the next save of the same file.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import math
import os
import re
import stat
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from attnviz.core.io.checks import (
    MAX_FILE_BYTES,
    MAX_MATRIX_CELLS,
    FileFormatError,
    check_numbers,
    clip,
    reason,
    shape_text,
    size_text,
)
from attnviz.core.io.json_files import (
    SUFFIX,
    _most_containers,
    _most_quotes,
    scenario_from_dict,
    scenario_from_json,
    scenario_to_dict,
    scenario_to_json,
)
from attnviz.core.io.npz_files import (
    MAX_NPZ_BYTES,
    NPZ_SUFFIX,
    member_writer,
    scenario_from_npz,
    scenario_to_npz_parts,
    snapshot_arrays,
    write_npz,
)
from attnviz.core.io.provenance_files import (
    make_provenance,
    provenance_fields,
    provenance_shapes,
    provenance_to_dict,
)
from attnviz.core.io.scenario_document import (
    FORMAT,
    VERSION,
    settings_from_dict,
    settings_to_dict,
)
from attnviz.core.io.text import parse_table
from attnviz.core.maths.scenario import MATRIX_NAMES, Scenario
from attnviz.core.provenance import Provenance

__all__ = [
    "FORMAT",
    "MAX_FILE_BYTES",
    "MAX_MATRIX_CELLS",
    "MAX_NPZ_BYTES",
    "NPZ_SUFFIX",
    "STARTED",
    "SUFFIX",
    "VERSION",
    "FileFormatError",
    "_most_containers",  # the bounds on JSON text, for the tests
    "_most_quotes",
    "atomic_write",
    "clip",
    "is_binary",
    "load_matrix",
    "load_scenario",
    "load_snapshot",
    "matrix_from_csv",
    "matrix_to_csv",
    "not_a_file",
    "open_regular",
    "printable",
    "read_file",
    "remove_stale_temps",
    "save_matrix",
    "save_scenario",
    "save_snapshot",
    "scenario_from_dict",
    "scenario_from_json",
    "scenario_from_npz",
    "scenario_to_dict",
    "scenario_to_json",
]


# Paths: names for messages, reading regular files only ---------------------------------

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a named pipe"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)
_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)


def printable(path: str | os.PathLike[str]) -> str:
    """A path as text for messages, titles and menus: bytes that are not UTF-8 show as "�"."""
    return os.fsencode(path).decode("utf-8", "replace")


def not_regular(mode: int) -> str:
    """What a file of this mode is, when it is not a regular file ("" when it is)."""
    if stat.S_ISREG(mode):
        return ""
    kind = next((name for is_kind, name in _KINDS if is_kind(mode)), "a special file")
    return f"{kind}, not a regular file"


def not_a_file(path: str | os.PathLike[str]) -> str:
    """Why path cannot be read as a file, in the words of ``open_regular`` ("no such
    file", "cannot read: a named pipe, not a regular file", …); "" for a regular file."""
    try:
        kind = not_regular(os.stat(path).st_mode)
        return f"cannot read: {kind}" if kind else ""
    except FileNotFoundError:
        return "no such file"
    except OSError as e:
        return f"cannot read: {e.strerror or e}"
    except ValueError:  # a NUL byte in the name
        return "cannot read: not a valid file name"


def open_regular(path: str | os.PathLike[str]) -> BinaryIO:
    """Open path for reading if it is a regular file; FileFormatError naming it otherwise.

    Never blocks: the file is opened non-blocking and checked on the opened descriptor,
    so a pipe swapped in after the first check is refused too.
    """
    name = printable(path)
    try:
        kind = not_regular(os.stat(path).st_mode)  # a device is not even opened
        fd = -1 if kind else os.open(path, _OPEN_FLAGS)
    except OSError as e:
        raise FileFormatError(f"{name}: cannot read: {e.strerror or e}") from None
    except ValueError:  # a NUL byte in the name
        raise FileFormatError(f"{name}: cannot read: not a valid file name") from None
    if kind:
        raise FileFormatError(f"{name}: cannot read: {kind}")
    try:
        kind = not_regular(os.fstat(fd).st_mode)
        if kind:
            raise FileFormatError(f"{name}: cannot read: {kind}")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_file(path: str | os.PathLike[str], limit: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of a regular file of at most limit bytes; FileFormatError otherwise."""
    with open_regular(path) as f:
        try:
            size = os.fstat(f.fileno()).st_size
            chunks = [] if size > limit else [f.read(size + 1)]
            while chunks and chunks[-1] and sum(map(len, chunks)) <= limit:
                chunks.append(f.read(2**20))  # it grew, or says 0 bytes as /proc files do
        except OSError as e:
            raise FileFormatError(f"{printable(path)}: cannot read: {e.strerror or e}") from None
    data = b"".join([c for c in chunks if c])  # one chunk is returned as is, not copied
    if size > limit or len(data) > limit:
        raise FileFormatError(f"{printable(path)}: larger than {size_text(limit)}")
    return data


def _with_path(path: str | os.PathLike[str], load: Callable[[], Any]) -> Any:
    try:
        return load()
    except FileFormatError as e:
        raise FileFormatError(f"{printable(Path(path).name)}: {e}") from None


# Atomic writes, and the temporary files of killed saves ---------------------------------

STARTED = time.time()  # temporary files older than this process are no save of ours
_TEMP_TAIL = re.compile(r"([1-9][0-9]{0,9})-[a-z0-9_]{8}\.tmp")


def _temp_prefix(path: str | os.PathLike[str]) -> str:
    """ ".<name>.attnviz-": how every temporary file written for path starts."""
    name = os.fsencode(os.path.basename(os.path.abspath(path)))[:120]  # room in NAME_MAX
    return "." + os.fsdecode(name) + ".attnviz-"


def _alive(pid: int) -> bool:
    """Whether a process with this id runs (assumed so where that cannot be asked)."""
    if pid == os.getpid() or os.name != "posix":  # on Windows os.kill would end it
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (OSError, OverflowError):
        return True  # e.g. another user's process
    return True


def remove_stale_temps(path: str | os.PathLike[str]) -> list[str]:
    """Remove what killed saves of path left: our temporary files (named after path,
    regular, ours) whose process is gone or that are older than this process.

    Returns the names removed; anything else in the folder is never touched.
    """
    folder = os.path.dirname(os.path.abspath(path))
    prefix = _temp_prefix(path)
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    removed = []
    for name in names:
        tail = _TEMP_TAIL.fullmatch(name[len(prefix) :]) if name.startswith(prefix) else None
        if tail is None:
            continue
        full = os.path.join(folder, name)
        with contextlib.suppress(OSError):
            st = os.lstat(full)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != getattr(os, "getuid", lambda: 0)():
                continue
            if _alive(int(tail[1])) and st.st_mtime >= STARTED:
                continue  # a save in progress
            os.unlink(full)
            removed.append(name)
    return removed


def _mode_for(path: str | os.PathLike[str]) -> int:
    """Keep an existing file's permissions; a new file gets the usual 0o666 less the umask."""
    try:
        return os.stat(path).st_mode & 0o777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def atomic_write(path: str | os.PathLike[str], data: bytes | Callable[[BinaryIO], None]) -> None:
    """Write data (bytes, or what ``data(file)`` writes) to a temporary file in the same
    folder, then rename it over path.

    Refuses (OSError) a path that is a directory, device or pipe: the rename would replace it.
    """
    try:
        kind = not_regular(os.stat(path).st_mode)
    except (OSError, ValueError):
        kind = ""  # a new file, or a name that open will refuse below
    if kind:
        raise OSError(errno.EINVAL, kind, os.fspath(path))
    folder = os.path.dirname(os.path.abspath(path))
    remove_stale_temps(path)
    prefix = f"{_temp_prefix(path)}{os.getpid()}-"
    fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=".tmp", dir=folder)
    try:
        os.fchmod(fd, _mode_for(path))
        with os.fdopen(fd, "wb") as f:
            if isinstance(data, bytes):
                f.write(data)
            else:
                data(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


# Scenario files: the form by the suffix ------------------------------------------------


def is_binary(path: str | os.PathLike[str]) -> bool:
    """Whether path names the binary form: any name ending in .npz (as .attn.npz does)."""
    return os.fsdecode(os.fspath(path)).lower().endswith(".npz")


BINARY_WEIGHTS = 2**20  # a scenario with more weights is proposed as .attn.npz


def file_name_for(stem: str, s: Scenario) -> str:
    """The file name to propose for s: the stem made safe (letters, digits, ._-), then
    .attn.json, or .attn.npz when s has over a million weights (a text file would be
    tens of megabytes)."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "-", stem).strip("-.") or "scenario"
    return safe + (NPZ_SUFFIX if s.weight_count > BINARY_WEIGHTS else SUFFIX)


def load_scenario(path: str | os.PathLike[str]) -> Scenario:
    """Read a scenario file, .attn.npz (binary) or .attn.json (text) by its suffix;
    raises FileFormatError naming the file and the problem."""
    if is_binary(path):
        with open_regular(path) as f:
            return _with_path(path, lambda: scenario_from_npz(f))  # type: ignore[no-any-return]
    data = read_file(path)
    return _with_path(path, lambda: scenario_from_json(data))  # type: ignore[no-any-return]


def save_scenario(path: str | os.PathLike[str], s: Scenario) -> None:
    """Write s atomically, as .attn.npz (binary) or .attn.json (text) by the suffix."""
    if is_binary(path):
        document, members = scenario_to_npz_parts(s)
        atomic_write(path, lambda f: write_npz(f, document, members))
    else:
        atomic_write(path, scenario_to_json(s).encode("utf-8"))


# Matrices: CSV and .npy ---------------------------------------------------------------


def matrix_from_csv(text: str) -> np.ndarray:
    """Comma-separated rows of numbers (blank lines ignored) as a float64 array.

    ``text.parse_table`` reads it, with sep "," and rows named by their line in the file;
    rows and columns are counted before any line is split, so a file larger than any
    matrix a scenario holds is refused without building objects for its cells. Any
    problem is a FileFormatError.
    """
    try:
        return parse_table(text, sep=",", max_cells=MAX_MATRIX_CELLS, by_line=True)
    except ValueError as e:
        raise FileFormatError(str(e)) from None


def matrix_to_csv(a: np.ndarray) -> str:
    """Rows of comma-separated numbers that read back exactly."""
    return "".join(",".join(repr(float(v)) for v in row) + "\n" for row in np.asarray(a))


def _npy(data: bytes) -> np.ndarray:
    f = io.BytesIO(data)
    try:
        version = np.lib.format.read_magic(f)
        header = (
            np.lib.format.read_array_header_1_0(f)
            if version == (1, 0)
            else np.lib.format.read_array_header_2_0(f)
        )
    except Exception as e:  # numpy's header parser can raise almost anything on junk
        raise FileFormatError(f"not a .npy array: {reason(e)}") from None
    shape, _, dtype = header
    if not all(type(d) is int for d in shape):
        raise FileFormatError(f"not a .npy array: shape {clip(shape)}")
    if dtype.hasobject:
        raise FileFormatError("holds Python objects (pickles are never loaded)")
    if dtype.kind not in "fiu":
        raise FileFormatError(f"holds {dtype} values; expected real numbers")
    if len(shape) != 2:
        raise FileFormatError(f"expected a 2-D matrix, got shape {shape}")
    if 0 in shape:
        raise FileFormatError(f"a {shape_text(shape)} matrix holds no numbers")
    if math.prod(shape) > MAX_MATRIX_CELLS:
        raise FileFormatError(f"{shape_text(shape)} is over {MAX_MATRIX_CELLS} cells")
    try:
        f.seek(0)
        array = np.load(f, allow_pickle=False)
    except (ValueError, OSError, EOFError) as e:
        raise FileFormatError(f"cannot read the array: {reason(e)}") from None
    numbers: np.ndarray = array.astype(np.float64)
    check_numbers("matrix", numbers)
    return numbers


def load_matrix(path: str | os.PathLike[str]) -> np.ndarray:
    """A matrix from .csv or .npy (chosen by suffix); FileFormatError on any problem."""
    suffix = Path(path).suffix.lower()
    if suffix not in (".csv", ".npy"):
        raise FileFormatError(f"{Path(path).name}: expected a .csv or .npy file")
    data = read_file(path)
    if suffix == ".npy":
        return _with_path(path, lambda: _npy(data))  # type: ignore[no-any-return]

    def csv() -> np.ndarray:
        try:
            return matrix_from_csv(data.decode("utf-8-sig"))
        except UnicodeDecodeError as e:
            raise FileFormatError(f"not UTF-8 text (byte {e.start + 1})") from None

    return _with_path(path, csv)  # type: ignore[no-any-return]


def save_matrix(path: str | os.PathLike[str], a: np.ndarray) -> None:
    """Write a matrix as .csv or .npy (chosen by suffix), atomically; never a pickle."""
    suffix = Path(path).suffix.lower()
    if suffix == ".npy":
        buffer = io.BytesIO()
        np.save(buffer, np.asarray(a, dtype=np.float64), allow_pickle=False)
        atomic_write(path, buffer.getvalue())
    elif suffix == ".csv":
        atomic_write(path, matrix_to_csv(a).encode("utf-8"))
    else:
        raise FileFormatError(f"{Path(path).name}: expected a .csv or .npy file")


# Snapshots: the window's autosave, binary so that large scenarios save in milliseconds ---


def save_snapshot(path: str | os.PathLike[str], s: Scenario) -> None:
    """Write s as an .npz archive of plain arrays (no pickles), atomically."""
    buffer = io.BytesIO()
    settings = settings_to_dict(s.settings)
    labels: dict[str, Any] = {"tokens": np.array(s.tokens, dtype=np.str_)}
    if s.kv_tokens is not None:
        labels["kv_tokens"] = np.array(s.kv_tokens, dtype=np.str_)
    arrays: dict[str, Any] = {**labels, **s.arrays()}
    if s.provenance is not None:
        provenance = provenance_to_dict(s.provenance, member_writer(arrays))
        arrays["provenance"] = np.array(json.dumps(provenance))
    np.savez(buffer, settings=np.array(json.dumps(settings)), **arrays)
    atomic_write(path, buffer.getvalue())


def load_snapshot(path: str | os.PathLike[str]) -> Scenario:
    """Read a snapshot written by save_snapshot, within the size limits of an .attn.npz
    (``snapshot_arrays``); FileFormatError on any problem."""
    name = printable(Path(path).name)
    with open_regular(path) as f:
        try:
            if f.read(4) != b"PK\x03\x04":
                raise FileFormatError("not an attnviz snapshot (not an .npz archive)")
            archive = snapshot_arrays(f)
            arrays: dict[str, Any] = {k: archive[k] for k in MATRIX_NAMES if k in archive}
            labels = {
                k: tuple(str(t) for t in archive[k].tolist())
                for k in ("tokens", "kv_tokens")
                if k in archive
            }
            if "settings" not in archive:
                raise FileFormatError("no settings member: not an attnviz snapshot")
            settings = settings_from_dict(json.loads(str(archive["settings"])))
            provenance = None
            if "provenance" in archive:
                provenance = _snapshot_provenance(archive)
            return Scenario(
                settings=settings,
                provenance=provenance,
                **labels,  # type: ignore[arg-type]
                **arrays,
            )
        except FileFormatError as e:
            raise FileFormatError(f"{name}: {e}") from None
        except Exception as e:  # a damaged archive can fail in zipfile, numpy or json
            raise FileFormatError(f"{name}: not a readable snapshot: {reason(e)}") from None


def _snapshot_provenance(archive: dict[str, np.ndarray]) -> Provenance:
    """The provenance a snapshot holds: a JSON member naming the arrays beside it."""
    value = json.loads(str(archive["provenance"]))
    fields = provenance_fields(value)
    arrays = []
    for key in ("model_weights", "model_output"):
        ref = value[key]
        if not isinstance(ref, str) or ref not in archive:
            raise FileFormatError(f"provenance.{key}: names {clip(ref)}, which is not there")
        arrays.append(np.asarray(archive[ref], dtype=np.float64))
    provenance_shapes(arrays[0].shape, arrays[1].shape)
    return make_provenance(fields, *arrays)
