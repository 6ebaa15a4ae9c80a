"""No command writes over what it reads, over a file of another kind, into the model folder
it imports, or silently over a file the user did not name; a full disk or an interrupt ends
in one line, never a traceback, and never exit 0 with a truncated output."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from attnviz.cli import main
from attnviz.core.io.files import save_scenario
from attnviz.core.presets import make_preset

pytest.importorskip("transformers")

from offline_hub import offline  # noqa: F401  (autouse)
from tiny_models import save_tiny


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return save_tiny("gpt2", tmp_path_factory.mktemp("m") / "gpt2")


def kept(folder) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


@pytest.mark.parametrize("name", ["config.json", "tokenizer.json", "x.attn.json"])
def test_import_never_writes_into_the_model_folder(model, capsys, name):
    before = kept(model)
    args = ["import", str(model), "--text", "the cat", "--out", str(model / name)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "nothing was written" in err
    assert "Finding the model" not in err  # refused before any work
    assert kept(model) == before


def test_import_without_out_never_replaces_a_file(model, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    args = ["import", str(model), "--text", "the cat"]
    assert main(args) == 0
    first = sorted(p.name for p in tmp_path.glob("*.attn.*"))
    assert first == ["gpt2-layer0.attn.json"]
    edited = b'{"edited": true}'
    (tmp_path / first[0]).write_bytes(edited)
    assert main(args) == 0
    out = capsys.readouterr().out
    assert (tmp_path / first[0]).read_bytes() == edited  # the user's file, untouched
    assert (tmp_path / "gpt2-layer0-2.attn.json").is_file() and "gpt2-layer0-2" in out


def test_import_names_the_source_in_one_line_without_terminal_codes(tmp_path, monkeypatch, capsys):
    folder = save_tiny("gpt2", tmp_path / "red\x1b[31mmodel")
    monkeypatch.chdir(tmp_path)
    assert main(["import", str(folder), "--text", "the cat", "--out", "m.attn.json"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\\x1b[31m" in out


@pytest.mark.parametrize(
    ("out", "fmt"),
    [("mine.attn.json", "svg"), ("mine.attn.json", None), ("x.attn.npz", "png"), ("x.png", "svg")],
)
def test_export_never_writes_an_image_over_a_scenario_or_its_input(tmp_path, capsys, out, fmt):
    scenario = tmp_path / "mine.attn.json"
    save_scenario(scenario, make_preset("worked-example"))
    target = tmp_path / out
    if not target.exists():
        target.write_bytes(b"not an image")
    before = target.read_bytes()
    args = ["export", str(scenario), "--view", "weights", "--out", str(target)]
    assert main([*args, *(["--format", fmt] if fmt else [])]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--out {target}" in err
    assert target.read_bytes() == before


def test_empty_example_name_is_refused(capsys):
    assert main(["compute", "--example", ""]) == 2
    assert "--example" in capsys.readouterr().err


def run(args: list[str], **kwargs) -> subprocess.CompletedProcess:
    code = "import sys; from attnviz.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run(
        [sys.executable, "-c", code, *args], stderr=subprocess.PIPE, timeout=120, **kwargs
    )


@pytest.mark.parametrize("unbuffered", ["", "1"])
@pytest.mark.parametrize("args", [["code"], ["compute", "--format", "json"], ["compute"]])
def test_a_full_disk_on_stdout_is_one_line_and_a_failure(args, unbuffered):
    env = {**os.environ, "PYTHONUNBUFFERED": unbuffered}
    with open("/dev/full", "wb") as full:
        done = run(args, stdout=full, env=env)
    err = done.stderr.decode()
    assert done.returncode not in (0, 2), err
    assert err.count("\n") == 1 and "Traceback" not in err and "incomplete" in err


def test_an_interrupt_is_one_line_and_exit_130(tmp_path, monkeypatch, capsys):
    import attnviz.cli as cli

    def interrupted(*_args, **_kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "load_source", interrupted)
    out = tmp_path / "w.svg"
    assert main(["export", "--view", "weights", "--out", str(out)]) == 130
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "interrupted" in err and not out.exists()


def test_a_folder_that_cannot_be_written_is_found_before_the_import(model, tmp_path, capsys):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        if os.access(locked, os.W_OK):
            pytest.skip("running as a user who writes anywhere")
        args = ["import", str(model), "--text", "the cat", "--out", str(locked / "m.attn.json")]
        assert main(args) == 2
        err = capsys.readouterr().err
        assert "cannot be written" in err and "Finding the model" not in err
    finally:
        locked.chmod(0o700)


def test_tiles_refuses_a_pass_of_millions_of_tiles_before_allocating():
    args = ["tiles", "--preset", "gpt2-small", "--n", "2048", "--block-q", "1", "--block-k", "1"]
    code = "import sys; from attnviz.cli import main; sys.exit(main(sys.argv[1:]))"
    done = subprocess.run(
        ["bash", "-c", 'ulimit -v 3000000; exec "$@"', "-", sys.executable, "-c", code, *args],
        capture_output=True,
        timeout=120,
    )
    err = done.stderr.decode()
    assert done.returncode == 2 and err.count("\n") == 1, err
    assert "4,194,304 tiles" in err  # 2048 × 2048 tiles of one score each
