"""Hostile files and folders: pipes, devices, sockets, undecodable names, killed saves.

Every read path accepts only regular files and never blocks; saves never replace a device;
a save that was killed leaves a temporary file that the next save of that file removes.
"""

from __future__ import annotations

import io
import json
import os
import select
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from hang_guard import within

from attnviz.cli import main
from attnviz.core.io import files as F
from attnviz.core.io.files import FileFormatError
from attnviz.core.maths.scenario import ScenarioError, Settings
from attnviz.core.presets import worked_example

pytestmark = pytest.mark.skipif(os.name != "posix", reason="pipes, sockets and signals: POSIX")

ROOT = Path(__file__).resolve().parent.parent
UNDECODABLE = os.fsdecode(b"caf\xe9 \xff.attn.json")  # Latin-1 é and a stray byte


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A folder with a short path (a Unix socket's path must fit in about 100 bytes)."""
    with tempfile.TemporaryDirectory(prefix="av-") as d:
        yield Path(d)


def make_special(kind: str, path: Path) -> Path:
    """A named pipe, directory, socket or character device at path.

    The device is a fresh node like /dev/null, made here so that a regression can never
    replace a real device; without the right to make one, the test is skipped.
    """
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    elif kind == "socket":
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(path))
        s.close()
    elif kind == "device":
        try:
            os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))
        except OSError:
            pytest.skip("cannot make a device node here")
    return path


KINDS = {
    "fifo": "a named pipe",
    "directory": "a directory",
    "socket": "a socket",
    "device": "a character device",
}
READERS: dict[str, Callable[[Path], object]] = {
    "scenario": F.load_scenario,
    "matrix": F.load_matrix,
    "snapshot": F.load_snapshot,
    "bytes": F.read_file,
}


# Reading -------------------------------------------------------------------------------


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("kind", KINDS)
def test_every_reader_refuses_what_is_not_a_regular_file_at_once(short_dir, kind, reader):
    suffix = ".csv" if reader == "matrix" else ".attn.json"
    path = make_special(kind, short_dir / f"x{suffix}")
    with within(5), pytest.raises(FileFormatError) as e:
        READERS[reader](path)
    assert str(e.value) == f"{path}: cannot read: {KINDS[kind]}, not a regular file"


def test_a_pipe_swapped_in_after_the_check_is_refused_on_the_descriptor(tmp_path, monkeypatch):
    regular = tmp_path / "regular.attn.json"
    regular.write_text("{}", "utf-8")
    pipe = tmp_path / "pipe.attn.json"
    os.mkfifo(pipe)
    real_stat = os.stat
    # The first look sees a regular file; by the time of open() it is a pipe.
    monkeypatch.setattr(F.os, "stat", lambda p, *a, **k: real_stat(regular if p == pipe else p))
    with within(5), pytest.raises(FileFormatError, match="a named pipe, not a regular file"):
        F.load_scenario(pipe)


def test_a_name_with_a_nul_byte_is_a_file_format_error():
    with pytest.raises(FileFormatError, match="not a valid file name"):
        F.read_file("a\0b")


def test_files_that_say_they_hold_nothing_are_read_whole():
    data = F.read_file("/proc/self/status") if os.path.exists("/proc/self/status") else b"x"
    assert data


def test_read_file_keeps_its_size_limit(tmp_path):
    path = tmp_path / "big"
    path.write_bytes(b"x" * 3000)
    assert F.read_file(path, limit=3000) == b"x" * 3000
    with pytest.raises(FileFormatError, match="larger than 2 KiB"):
        F.read_file(path, limit=2048)


@pytest.mark.parametrize("command", ["compute", "export"])
def test_cli_refuses_a_pipe_in_one_line(tmp_path, capsys, command):
    pipe = tmp_path / "in.attn.json"
    os.mkfifo(pipe)
    argv = [command, str(pipe)]
    if command == "export":
        argv += ["--view", "weights", "--out", str(tmp_path / "out.svg")]
    with within(10):
        rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2
    assert err == f"attnviz: {pipe}: cannot read: a named pipe, not a regular file\n"


# Writing -------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["fifo", "directory", "socket", "device"])
def test_saving_over_what_is_not_a_regular_file_is_refused(short_dir, kind):
    path = make_special(kind, short_dir / "x.attn.json")
    before = os.stat(path)
    with within(5), pytest.raises(OSError) as e:
        F.save_scenario(path, worked_example())
    assert e.value.strerror == f"{KINDS[kind]}, not a regular file"
    after = os.stat(path)
    assert (after.st_mode, after.st_ino) == (before.st_mode, before.st_ino)
    assert os.listdir(short_dir) == ["x.attn.json"]


def test_cli_export_refuses_to_replace_a_device(short_dir, capsys):
    device = make_special("device", short_dir / "null.svg")
    assert main(["export", "--view", "weights", "--out", str(device)]) == 2
    assert "a character device, not a regular file" in capsys.readouterr().err
    assert stat.S_ISCHR(os.stat(device).st_mode)


# Names that are not UTF-8 ----------------------------------------------------------------


def test_undecodable_names_save_load_and_show_recognisably(tmp_path):
    path = tmp_path / UNDECODABLE
    F.save_scenario(path, worked_example())
    assert os.listdir(os.fsencode(tmp_path)) == [b"caf\xe9 \xff.attn.json"]
    assert F.load_scenario(path).tokens == worked_example().tokens
    assert F.printable(path.name) == "caf\ufffd \ufffd.attn.json"
    path.write_text("[]", "utf-8")
    with pytest.raises(FileFormatError) as e:
        F.load_scenario(path)
    assert str(e.value).startswith("caf\ufffd \ufffd.attn.json: ")
    str(e.value).encode("utf-8")  # a message is always valid text


# Temporary files of killed saves ---------------------------------------------------------


def temp_name(target: str, pid: int, random: str = "abcd1234") -> str:
    return f".{target}.attnviz-{pid}-{random}.tmp"


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_temporary_files_are_named_after_their_target(tmp_path, monkeypatch):
    seen = []
    real_replace = os.replace
    monkeypatch.setattr(
        F.os, "replace", lambda src, dst: (seen.append(src), real_replace(src, dst))
    )
    F.save_scenario(tmp_path / "s.attn.json", worked_example())
    name = os.path.basename(seen[0])
    assert name.startswith(f".s.attn.json.attnviz-{os.getpid()}-") and name.endswith(".tmp")


def test_stale_temporary_files_are_removed_and_nobody_elses(tmp_path):
    target = tmp_path / "s.attn.json"
    target.write_bytes(b"old")
    gone, live = dead_pid(), os.getppid()
    stale = [
        temp_name("s.attn.json", gone),  # its process is gone
        temp_name("s.attn.json", live, "old12345"),  # written before this process started
    ]
    kept = [
        temp_name("s.attn.json", os.getpid()),  # a save of ours in progress
        temp_name("s.attn.json", live, "new12345"),  # another process's save in progress
        temp_name("other.attn.json", gone),  # another file's
        temp_name("s.attn.json", gone, "short"),  # not a name we write
        f"s.attn.json.attnviz-{gone}-abcd1234.tmp",  # not hidden: not ours
        f".s.attn.json.attnviz-{gone}-abcd1234.tmp.txt",
        ".attnviz-abcd1234.tmp",
        "notes.txt",
    ]
    for name in stale + kept:
        (tmp_path / name).write_bytes(b"x" * 100)
    old = F.STARTED - 3600
    os.utime(tmp_path / stale[1], (old, old))
    (tmp_path / temp_name("s.attn.json", gone, "folder12")).mkdir()  # not a file: kept
    os.symlink(tmp_path / "notes.txt", tmp_path / temp_name("s.attn.json", gone, "link1234"))
    kept += [temp_name("s.attn.json", gone, "folder12"), temp_name("s.attn.json", gone, "link1234")]

    assert sorted(F.remove_stale_temps(target)) == sorted(stale)
    assert sorted(os.listdir(tmp_path)) == sorted([*kept, "s.attn.json"])
    F.save_scenario(target, worked_example())  # saving again removes nothing else
    assert sorted(os.listdir(tmp_path)) == sorted([*kept, "s.attn.json"])


CHILD = """
import os, sys, time
from attnviz.core.io import files

def stall(src, dst):
    print("written", flush=True)
    time.sleep(120)

os.replace = stall
files.atomic_write(sys.argv[1], b"x" * 20_000_000)
"""


@pytest.mark.parametrize("name", ["s.attn.json", UNDECODABLE])
def test_a_save_killed_midway_leaves_a_temp_file_the_next_save_removes(tmp_path, name):
    target = tmp_path / name
    target.write_bytes(b"the previous contents\n")
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, os.fsencode(target)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
    )
    try:
        assert child.stdout is not None
        assert select.select([child.stdout], [], [], 60)[0], "the child never wrote"
        assert child.stdout.readline() == b"written\n"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    leftovers = [n for n in os.listdir(tmp_path) if n != name]
    assert leftovers == [temp_name(name, child.pid, leftovers[0][-12:-4])]
    assert (tmp_path / leftovers[0]).stat().st_size == 20_000_000
    assert target.read_bytes() == b"the previous contents\n"  # never corrupted

    F.save_scenario(target, worked_example())
    assert os.listdir(tmp_path) == [name]
    assert F.load_scenario(target).tokens == worked_example().tokens


# Messages ------------------------------------------------------------------------------------


def scenario_text(**changes: object) -> str:
    d = F.scenario_to_dict(worked_example())
    d.update(changes)
    return json.dumps(d)


def test_cut_values_end_in_an_ellipsis_and_close_their_quotes():
    with pytest.raises(FileFormatError) as e:
        F.scenario_from_json(scenario_text(version=10**30))
    assert (
        str(e.value)
        == "version: 1000000000000000000… is not supported (this attnviz reads 1, 2, 3, 4, 5 and 6)"
    )
    with pytest.raises(FileFormatError) as e:
        F.scenario_from_json(scenario_text(format="x" * 100))
    assert str(e.value) == f"format: expected 'attnviz-scenario', got '{'x' * 37}…'"
    with pytest.raises(FileFormatError) as e:
        F.scenario_from_json(scenario_text(tokens=["a", "b", "c", ["y" * 100]]))
    assert str(e.value).endswith("…") and len(str(e.value)) < 80
    assert F.clip("short") == "'short'" and F.clip(12) == "12"


def test_long_unknown_keys_are_cut():
    with pytest.raises(FileFormatError) as e:
        F.scenario_from_json(scenario_text(**{"k" * 10_000: 1}))
    assert str(e.value) == f"'{'k' * 37}…': unknown field"


@pytest.mark.parametrize(
    ("ablated", "message"),
    [
        ([200], "settings.ablated[1]: expected a whole number from 1 to 128, got 200"),
        ([1, 1], "settings.ablated: head numbers [1, 1] repeat"),
        ([3], "settings.ablated: head 3 does not exist (2 heads)"),
    ],
)
def test_ablated_heads_in_messages_count_from_one(ablated, message):
    d = F.scenario_to_dict(worked_example())
    d["settings"]["ablated"] = ablated
    with pytest.raises(FileFormatError) as e:
        F.scenario_from_json(json.dumps(d))
    assert str(e.value) == message


def test_ablated_settings_from_code_count_from_one_too():
    with pytest.raises(ScenarioError, match=r"^settings\.ablated: head 2 repeats$"):
        Settings(ablated=(1, 1))
    with pytest.raises(ScenarioError, match=r"^settings\.ablated: head 3 is out of order$"):
        Settings(ablated=(3, 2))
    with pytest.raises(ScenarioError, match=r"^settings\.ablated: head 129 is not between"):
        Settings(ablated=(128,))


def test_a_byte_order_mark_is_accepted_in_scenarios_and_csv(tmp_path):
    text = F.scenario_to_json(worked_example())
    path = tmp_path / "bom.attn.json"
    path.write_bytes(b"\xef\xbb\xbf" + text.encode("utf-8"))
    assert F.load_scenario(path).tokens == worked_example().tokens
    assert F.scenario_from_json("\ufeff" + text).tokens == worked_example().tokens
    csv = tmp_path / "bom.csv"
    csv.write_bytes(b"\xef\xbb\xbf1,2\n3,4\n")
    assert F.load_matrix(csv).tolist() == [[1.0, 2.0], [3.0, 4.0]]
    assert F.matrix_from_csv("\ufeff1,2\n").tolist() == [[1.0, 2.0]]


def npz_with_objects() -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:
        member = io.BytesIO()
        np.save(member, np.array([object()], dtype=object), allow_pickle=True)
        z.writestr("X.npy", member.getvalue())
    return buffer.getvalue()


@pytest.mark.parametrize(
    "content",
    [os.urandom(4096), b"\x80\x04random", npz_with_objects()],
    ids=["random", "pickle-opcode", "object-array"],
)
def test_a_bad_snapshot_never_suggests_loading_pickles(tmp_path, content):
    path = tmp_path / "autosave.npz"
    path.write_bytes(content)
    with pytest.raises(FileFormatError) as e:
        F.load_snapshot(path)
    assert str(e.value).startswith("autosave.npz: ")
    assert "allow_pickle" not in str(e.value)


def test_a_pickled_npy_matrix_never_suggests_loading_pickles(tmp_path):
    path = tmp_path / "m.npy"
    member = io.BytesIO()
    np.save(member, np.array([[object()]], dtype=object), allow_pickle=True)
    path.write_bytes(member.getvalue())
    with pytest.raises(FileFormatError) as e:
        F.load_matrix(path)
    assert "allow_pickle" not in str(e.value)


def test_reading_a_pipe_is_quick(tmp_path):
    pipe = tmp_path / "p"
    os.mkfifo(pipe)
    with within(5), pytest.raises(FileFormatError):
        F.read_file(pipe)
