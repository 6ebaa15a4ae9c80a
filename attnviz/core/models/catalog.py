"""The models already on this machine: installed packages that bundle one, and the models
in the local Hugging Face cache, each with its type and whether attnviz would import it.

``available_models()`` reads package metadata, zip directories and each model's
``config.json``: never a weight, never the network, never torch or transformers. An
installed distribution counts when it ships a model the importer would find by the
distribution's name (``sources.locate``): a folder holding ``config.json`` and weights, or
a ``.zip`` whose model folder does (read without unpacking it). A cache entry
(``models--org--name/snapshots/<revision>/``) counts when a snapshot holds
``config.json``; its source is the model id when ``refs/main`` names that snapshot (as
the importer looks it up), otherwise the snapshot folder itself. At most ``limit`` cache
entries are read, so that a large cache answers quickly.
"""

from __future__ import annotations

import csv
import importlib.metadata
import json
import os
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from attnviz.core.maths.scenario import ScenarioError
from attnviz.core.models import importer, vocab_files
from attnviz.core.models.sources import MODEL_ID, NEEDED, model_problem

MAX_CACHED = 200  # cache entries read at most
WEIGHTS = (".safetensors", ".bin", ".pt")
PACKAGE, CACHE = "package", "cache"


@dataclass(frozen=True)
class Available:
    """A model on this machine, as the Import dialog offers it."""

    source: str  # what to give the importer (a package name, a model id or a folder)
    kind: str  # PACKAGE or CACHE
    where: Path  # the bundled archive or folder, or the cache snapshot
    model_type: str  # config.json's model_type ('?' when it has none or is unreadable)
    layers: int | None
    size: int  # bytes on disk: the archive, or the model folder's files
    problem: str  # why importing it would be refused ('' when attnviz imports it)


def available_models(limit: int = MAX_CACHED) -> list[Available]:
    """The installed model packages, then the models in the Hugging Face cache."""
    return [*installed_packages(), *cached_models(limit)]


def hub_cache() -> Path:
    """The local Hugging Face cache, as huggingface_hub finds it from the environment."""
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
        "huggingface",
    )
    default = os.environ.get("HUGGINGFACE_HUB_CACHE") or os.path.join(home, "hub")
    root = os.environ.get("HF_HUB_CACHE") or default
    return Path(os.path.expandvars(os.path.expanduser(root)))


def installed_packages() -> list[Available]:
    """Installed distributions that bundle a model, by name (the first of a name on the
    path, as ``importlib.metadata.distribution`` finds it)."""
    seen: set[str] = set()
    found = []
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"] or ""
        key = re.sub(r"[-_.]+", "-", name).lower()
        if not name or key in seen:
            continue
        seen.add(key)
        entry = _bundled(dist, name)
        if entry is not None:
            found.append(entry)
    return sorted(found, key=lambda a: a.source.lower())


def cached_models(limit: int = MAX_CACHED) -> list[Available]:
    """The models in the local Hugging Face cache (the first ``limit`` entries by name)."""
    try:
        repos = sorted(p for p in hub_cache().iterdir() if p.name.startswith("models--"))
    except OSError:  # no cache yet
        return []
    found = []
    for repo in repos[:limit]:
        entry = _cached(repo)
        if entry is not None:
            found.append(entry)
    return found


def _bundled(dist: importlib.metadata.Distribution, name: str) -> Available | None:
    try:
        files = [Path(str(dist.locate_file(f))) for f in _candidates(dist)]
    except (OSError, ValueError, UnicodeDecodeError):  # an unreadable RECORD
        return None
    for f in files:
        if f.name == "config.json" and _has_weights(f.parent):
            return _folder_entry(name, PACKAGE, f.parent, f.parent)
    for f in files:
        if f.suffix == ".zip" and f.is_file():
            entry = _zipped(name, f)
            if entry is not None:
                return entry
    return None


def _candidates(dist: importlib.metadata.Distribution) -> list[str]:
    """The distribution's files named config.json or *.zip. RECORD is scanned as text:
    ``dist.files`` makes a path object for each of the tens of thousands of files that
    torch and the like install, which takes the better part of a second."""
    record = dist.read_text("RECORD")
    if record is None:  # an older layout (installed-files.txt)
        paths = [str(f) for f in dist.files or ()]
    else:
        lines = [ln for ln in record.splitlines() if "config.json" in ln or ".zip" in ln]
        paths = [row[0] for row in csv.reader(lines) if row]
    return [p for p in paths if PurePosixPath(p).name == "config.json" or p.endswith(".zip")]


def _has_weights(folder: Path) -> bool:
    try:
        return any(p.suffix in WEIGHTS for p in folder.iterdir())
    except OSError:
        return False


def _folder_entry(source: str, kind: str, folder: Path, where: Path) -> Available:
    problem = model_problem(folder)
    try:
        config = importer._read_config(folder)
    except ScenarioError as e:
        return Available(source, kind, where, "?", None, _size(folder), problem or str(e))
    return _entry(source, kind, where, config, _size(folder), problem)


def _zipped(name: str, path: Path) -> Available | None:
    """The model in a bundled zip, judged from its directory and its config.json."""
    try:
        with zipfile.ZipFile(path) as archive:
            infos = [i for i in archive.infolist() if not i.is_dir()]
            configs = [i for i in infos if PurePosixPath(i.filename).name == "config.json"]
            if not configs:
                return None
            info = min(configs, key=lambda i: i.filename.count("/"))  # as the importer picks
            root = PurePosixPath(info.filename).parent
            names = [
                PurePosixPath(i.filename).name
                for i in infos
                if PurePosixPath(i.filename).parent == root
            ]
            if not any(PurePosixPath(n).suffix in WEIGHTS for n in names):
                return None
            size = path.stat().st_size
            if info.file_size > importer.MAX_CONFIG:
                return Available(name, PACKAGE, path, "?", None, size, "config.json too large")
            data = archive.read(info)
    except (zipfile.BadZipFile, OSError, RuntimeError):  # not a zip, or encrypted
        return None
    try:
        config = json.loads(data.decode("utf-8"))
        if not isinstance(config, dict):
            raise ValueError("expected a JSON object")
    except (ValueError, RecursionError) as e:
        return Available(name, PACKAGE, path, "?", None, size, f"config.json: not readable ({e})")
    return _entry(name, PACKAGE, path, config, size, _lacks(names))


def _lacks(names: list[str]) -> str:
    if not any(n.endswith(".safetensors") for n in names):
        return "has only pickled weights (.bin/.pt); attnviz reads safetensors weights"
    missing = [n for n in NEEDED if n not in names]
    tokenizer = vocab_files.lacking(set(names))
    if tokenizer:
        missing.append(tokenizer)
    return f"lacks {', '.join(missing)}" if missing else ""


def _cached(repo: Path) -> Available | None:
    model_id = "/".join(repo.name.removeprefix("models--").split("--"))
    snapshots = repo / "snapshots"
    try:
        revision = (repo / "refs" / "main").read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        revision = ""
    main = snapshots / revision if revision and "/" not in revision else None
    if main is not None and (main / "config.json").is_file() and MODEL_ID.fullmatch(model_id):
        return _folder_entry(model_id, CACHE, main, main)
    try:  # no main revision: the newest snapshot, as a folder
        folders = [p for p in snapshots.iterdir() if (p / "config.json").is_file()]
    except OSError:
        return None
    if not folders:
        return None
    newest = max(folders, key=lambda p: (p / "config.json").stat().st_mtime)
    return _folder_entry(str(newest), CACHE, newest, newest)


def _entry(
    source: str, kind: str, where: Path, config: dict[str, Any], size: int, problem: str
) -> Available:
    model_type = config.get("model_type")
    return Available(
        source,
        kind,
        where,
        model_type if isinstance(model_type, str) and model_type else "?",
        importer._layers_of(config),
        size,
        problem or _refusal(config),
    )


def _refusal(config: dict[str, Any]) -> str:
    """Why the importer refuses this config ('' when it does not); a config that breaks
    the check is named, never raised, so that one odd model does not hide the others."""
    try:
        return importer._unsupported(config)
    except ScenarioError as e:
        return str(e)
    except Exception as e:  # a value of an unexpected type in the config
        return f"config.json could not be checked ({type(e).__name__}: {e})"


def _size(folder: Path) -> int:
    """The bytes of the folder's files (a cache snapshot's links followed to their blobs)."""
    total = 0
    try:
        for p in folder.iterdir():
            try:
                if p.is_file():
                    total += p.stat().st_size
            except OSError:
                continue
    except OSError:
        pass
    return total
