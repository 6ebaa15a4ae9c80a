"""``attnviz bench``: JSON, CSV and table reports, --out, the progress bar, bad flags, and
the command line of a Config (attnviz.bench.config) read back as the same Config.

In-process runs go through ``attnviz.cli.main(["bench", ...])`` with the (slow, on a CPU)
matrix-multiply ceiling replaced by a fixed number; two runs use a fresh interpreter,
one of them without NumPy, as on a GPU machine that has torch only.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import subprocess
import sys
import textwrap
from dataclasses import fields
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from attnviz.bench import cli as bench_cli  # noqa: E402 (needs torch, after the skip)
from attnviz.bench import devices  # noqa: E402
from attnviz.bench import sweep as bench  # noqa: E402
from attnviz.bench.config import (  # noqa: E402
    DEFAULT_IMPLS,
    DEVICES,
    DTYPES,
    IMPLEMENTATIONS,
    MAX_DOCUMENTS,
    Config,
    config_from_argv,
    config_to_argv,
)
from attnviz.bench.report import Report  # noqa: E402
from attnviz.cli import main  # noqa: E402

GEMM = 0.5
ROOT = Path(__file__).resolve().parent.parent
TINY = [
    "bench",
    "--device",
    "cpu",
    "--heads",
    "2",
    "--d-head",
    "16",
    "--min-n",
    "64",
    "--max-n",
    "128",
    "--repeats",
    "1",
    "--impl",
    "naive,sdpa",
]
CELLS = [(i, n) for n in (64, 128) for i in ("naive", "sdpa")]
FIELDS = (
    "impl",
    "n",
    "time_ms",
    "peak_bytes",
    "predicted_bytes",
    "tflops",
    "share_of_gemm",
    "error",
    "status",
)


@pytest.fixture(autouse=True)
def fixed_gemm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(devices, "gemm_tflops", lambda device, dtype, repeats=5: GEMM)


def run_cli(argv: list[str]) -> int:
    """main()'s exit status, whether it returns it or argparse raises SystemExit."""
    try:
        return main(argv)
    except SystemExit as e:
        return int(e.code or 0)


def my_flops(n: int, heads: int = 2, d: int = 16) -> float:
    return 4.0 * heads * n * n * d


def my_naive_bytes(n: int, heads: int = 2, d: int = 16) -> int:
    return 2 * heads * n * n * 4 + heads * n * d * 4


def my_sdpa_bytes(n: int, heads: int = 2, d: int = 16) -> int:
    return heads * n * d * 4 + heads * n * 4


def check_json_report(data: dict) -> None:
    assert {"device", "gemm_tflops", "records"} <= set(data)
    assert data["device"]["type"] == "cpu"
    assert data["gemm_tflops"] == GEMM
    records = data["records"]
    assert [(r["impl"], r["n"]) for r in records] == CELLS
    for r in records:
        assert set(FIELDS) <= set(r)
        assert r["status"] == "ok"
        assert r["time_ms"] > 0 and r["peak_bytes"] > 0
        assert r["tflops"] == pytest.approx(my_flops(r["n"]) / r["time_ms"] * 1e-9, rel=1e-9)
        assert r["share_of_gemm"] == pytest.approx(r["tflops"] / GEMM, rel=1e-9)
        mine = my_naive_bytes if r["impl"] == "naive" else my_sdpa_bytes
        assert r["predicted_bytes"] == mine(r["n"])
        assert 0 < r["error"] < 1e-4


# The three formats ---------------------------------------------------------------------------


def test_json_report(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli([*TINY, "--format", "json"]) == 0
    out, err = capsys.readouterr()
    check_json_report(json.loads(out))  # one object, nothing else on stdout
    assert "#" in err and "/" in err  # the progress bar went to stderr
    assert "Traceback" not in err


def test_csv_report(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli([*TINY, "--format", "csv"]) == 0
    out, _ = capsys.readouterr()
    rows = list(csv.DictReader(io.StringIO(out)))
    assert set(FIELDS) <= set(rows[0])
    assert [(r["impl"], int(r["n"])) for r in rows] == CELLS
    for r in rows:
        assert r["status"] == "ok"
        time_ms, tflops = float(r["time_ms"]), float(r["tflops"])
        assert tflops == pytest.approx(my_flops(int(r["n"])) / time_ms * 1e-9, rel=1e-6)
        assert float(r["share_of_gemm"]) == pytest.approx(tflops / GEMM, rel=1e-6)
        mine = my_naive_bytes if r["impl"] == "naive" else my_sdpa_bytes
        assert int(r["predicted_bytes"]) == mine(int(r["n"]))
        assert int(r["peak_bytes"]) > 0
        assert 0 < float(r["error"]) < 1e-4


def test_table_report_lists_every_record(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli([*TINY, "--format", "table"]) == 0
    out, _ = capsys.readouterr()
    lines = out.splitlines()
    assert "cpu" in lines[0]  # the heading names the device
    rows = [line.split() for line in lines[1:] if line.split()[:1] in (["naive"], ["sdpa"])]
    assert [(w[0], int(w[1])) for w in rows] == CELLS
    for w in rows:
        impl, n = w[0], int(w[1])
        assert w[-1] == "ok"
        mine = my_naive_bytes if impl == "naive" else my_sdpa_bytes
        assert float(w[4]) == pytest.approx(mine(n) / 2**20, abs=0.051)  # predicted MiB


def test_table_is_the_default_format(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(TINY) == 0
    out, _ = capsys.readouterr()
    with pytest.raises(json.JSONDecodeError):
        json.loads(out)
    assert sum(1 for line in out.splitlines() if line.split()[:1] in (["naive"], ["sdpa"])) == 4


def test_unsupported_records_show_in_every_format(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    if torch.cuda.is_available():
        pytest.skip("the efficient backend exists on CUDA")
    argv = [*TINY[:-1], "naive,efficient"]
    assert run_cli([*argv, "--format", "json"]) == 0
    records = json.loads(capsys.readouterr().out)["records"]
    eff = [r for r in records if r["impl"] == "efficient"]
    assert len(eff) == 2
    assert all(r["status"].startswith("unsupported: ") and r["time_ms"] is None for r in eff)
    assert run_cli([*argv, "--format", "csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [r["time_ms"] for r in rows if r["impl"] == "efficient"] == ["", ""]
    assert run_cli([*argv, "--format", "table"]) == 0
    table = capsys.readouterr().out
    assert table.count("unsupported: ") == 2


# --out ------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["json", "csv", "table"])
def test_out_writes_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str], fmt: str) -> None:
    path = tmp_path / f"report.{fmt}"
    assert run_cli([*TINY, "--format", fmt, "--out", str(path)]) == 0
    out, err = capsys.readouterr()
    assert out == ""
    assert str(path) in err
    text = path.read_text(encoding="utf-8")
    if fmt == "json":
        check_json_report(json.loads(text))
    elif fmt == "csv":
        assert len(list(csv.DictReader(io.StringIO(text)))) == 4
    else:
        assert "naive" in text and "sdpa" in text


def test_out_to_a_folder_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_cli([*TINY, "--format", "json", "--out", str(tmp_path)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    last = err.strip().splitlines()[-1]  # after the progress bar
    assert last.startswith("attnviz bench: --out ") and str(tmp_path) in last
    assert "Traceback" not in err


# Bad flags: exit 2, one line on stderr, no traceback, no sweep ---------------------------------


@pytest.fixture
def no_sweep(monkeypatch: pytest.MonkeyPatch) -> list[Config]:
    """Replace the sweep by a spy that records the config it got and returns an empty report."""
    seen: list[Config] = []

    def spy(config, progress=None, cancelled=None, on_record=None):
        seen.append(config)
        return Report({"type": "cpu", "torch": torch.__version__}, config.to_dict(), 1.0)

    monkeypatch.setattr(bench_cli, "run", spy)
    return seen


BAD = [
    (["--min-n", "3"], "min_n"),
    (["--max-n", "100"], "max_n"),
    (["--min-n", "256", "--max-n", "128"], "min_n"),
    (["--impl", "foo"], "foo"),
    (["--impl", "naive,foo"], "foo"),
    (["--impl", ","], "impl"),
    (["--dtype", "float8"], "float8"),
    (["--repeats", "0"], "repeats"),
    (["--heads", "two"], "two"),
    (["--format", "xml"], "xml"),
    (["--device", "tpu"], "tpu"),
    (["--heads", "12", "--kv-heads", "5"], "kv_heads: 5 does not divide heads 12"),
    (["--kv-heads", "two"], "two"),
    (["--phase", "generate"], "generate"),
    (["--phase", "decode", "--window", "8"], "window"),
    (["--phase", "decode", "--documents", "2"], "documents"),
    (["--phase", "decode", "--backward"], "backward"),
    (["--documents", "3"], "documents"),
    (["--window", "-4"], "window"),
    (["--impl", "flex,naive,flexible"], "flexible"),
]


@pytest.mark.parametrize(("flags", "named"), BAD, ids=[" ".join(f) for f, _ in BAD])
def test_bad_flags_exit_2_with_one_line(
    capsys: pytest.CaptureFixture[str], no_sweep: list, flags: list[str], named: str
) -> None:
    argv = ["bench", "--device", "cpu", *flags]
    assert run_cli(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("attnviz bench: ")
    assert named in lines[0]
    assert no_sweep == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_cuda_exits_2_with_one_line(
    capsys: pytest.CaptureFixture[str], no_sweep: list
) -> None:
    assert run_cli(["bench", "--device", "cuda"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("attnviz bench: ") and "cuda" in lines[0]
    assert no_sweep == []


def test_max_n_zero_is_rejected(capsys: pytest.CaptureFixture[str], no_sweep: list) -> None:
    assert run_cli([*TINY[:9], "--max-n", "0"]) == 2
    assert no_sweep == []


def test_defaults_reach_the_config(no_sweep: list, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(["bench", "--device", "cpu", "--format", "json"]) == 0
    (config,) = no_sweep
    assert config.device == "cpu"
    assert config.max_n == 4096
    assert config.impls == ("naive", "sdpa", "flash", "efficient", "cudnn", "math")
    assert (config.phase, config.kv_heads, config.window, config.documents) == ("prefill", 0, 0, 0)
    assert (config.warmup, config.threads, config.repeats) == (1, 0, 5)
    assert not config.causal and not config.backward
    assert run_cli([*TINY, "--causal", "--backward", "--batch", "3", "--dtype", "bfloat16"]) == 0
    config = no_sweep[-1]
    assert (config.causal, config.backward, config.batch, config.dtype) == (
        True,
        True,
        3,
        "bfloat16",
    )
    assert (config.heads, config.d_head, config.min_n, config.max_n) == (2, 16, 64, 128)
    assert config.impls == ("naive", "sdpa")


# Fresh interpreters -----------------------------------------------------------------------


def python(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=ROOT,
    )


def test_bad_flag_from_the_command_line_exits_2() -> None:
    p = subprocess.run(
        [sys.executable, "-m", "attnviz", "bench", "--impl", "foo"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=ROOT,
    )
    assert p.returncode == 2
    assert p.stdout == ""
    assert len(p.stderr.strip().splitlines()) == 1 and "foo" in p.stderr
    assert "Traceback" not in p.stderr


def test_bench_runs_without_numpy() -> None:
    """``python -m attnviz bench`` where NumPy is absent, as on a torch-only GPU machine.

    NumPy is made absent the way the import system sees a missing package: None in
    sys.modules makes ``import numpy`` raise ModuleNotFoundError and
    ``importlib.util.find_spec("numpy")`` return None. (A meta-path finder that raises
    instead is not faithful: torch._dynamo calls find_spec("numpy") and expects None.)
    A meta-path finder still records any attempt to import a NumPy submodule.
    """
    p = python(
        """
        import importlib.abc, json, runpy, sys

        tried = []

        class Watch(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] == "numpy":
                    tried.append(name)
                return None

        sys.meta_path.insert(0, Watch())
        sys.modules["numpy"] = None
        sys.argv = ["attnviz", *sys.argv[1:]]
        try:
            runpy.run_module("attnviz", run_name="__main__", alter_sys=True)
        except SystemExit as e:
            code = e.code
        loaded = [m for m, v in sys.modules.items() if m.split(".")[0] == "numpy" and v]
        print("\\nCHILD " + json.dumps({"code": code, "loaded": loaded}), file=sys.stderr)
        """,
        "bench",
        "--device",
        "cpu",
        "--heads",
        "1",
        "--d-head",
        "8",
        "--min-n",
        "16",
        "--max-n",
        "32",
        "--repeats",
        "1",
        "--impl",
        "naive,sdpa",
        "--format",
        "json",
    )
    assert "Traceback" not in p.stderr, p.stderr
    child = json.loads(p.stderr.rsplit("CHILD ", 1)[1])
    assert child == {"code": 0, "loaded": []}
    data = json.loads(p.stdout)
    assert data["gemm_tflops"] > 0
    records = data["records"]
    assert [(r["impl"], r["n"]) for r in records] == [
        ("naive", 16),
        ("sdpa", 16),
        ("naive", 32),
        ("sdpa", 32),
    ]
    for r in records:
        assert r["status"] == "ok"
        assert r["tflops"] == pytest.approx(4.0 * r["n"] ** 2 * 8 / r["time_ms"] * 1e-9, rel=1e-9)
        assert r["share_of_gemm"] == pytest.approx(r["tflops"] / data["gemm_tflops"], rel=1e-9)
        assert 0 < r["error"] < 1e-4
        assert math.isfinite(r["time_ms"])


# --out is checked before any timing -------------------------------------------------------


def refused_out(capsys: pytest.CaptureFixture[str], out: str) -> str:
    """The one stderr line of a run refused for --out (exit 2, nothing on stdout)."""
    assert run_cli([*TINY, "--format", "json", "--out", out]) == 2
    stdout, err = capsys.readouterr()
    assert stdout == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err  # no progress bar: the sweep never started
    assert lines[0].startswith(f"attnviz bench: --out {out}: ")
    return lines[0]


def test_out_in_a_missing_folder_is_refused_before_the_sweep(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], no_sweep: list
) -> None:
    out = tmp_path / "missing" / "x.json"
    line = refused_out(capsys, str(out))
    assert line.endswith(f"the folder {out.parent} does not exist")
    assert no_sweep == [] and not out.parent.exists()


def test_out_under_a_file_is_refused_before_the_sweep(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], no_sweep: list
) -> None:
    (tmp_path / "file").write_text("keep", encoding="utf-8")
    line = refused_out(capsys, str(tmp_path / "file" / "x.json"))
    assert line.endswith(f"{tmp_path / 'file'} is not a folder")
    assert no_sweep == []
    assert (tmp_path / "file").read_text(encoding="utf-8") == "keep"


def test_out_naming_a_folder_is_refused_before_the_sweep(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], no_sweep: list
) -> None:
    assert refused_out(capsys, str(tmp_path)).endswith(": is a folder")
    assert no_sweep == []


@pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root may write anywhere"
)
def test_out_in_a_read_only_folder_is_refused_before_the_sweep(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], no_sweep: list
) -> None:
    folder = tmp_path / "locked"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        line = refused_out(capsys, str(folder / "x.json"))
    finally:
        folder.chmod(0o700)
    assert "cannot write there" in line
    assert no_sweep == [] and list(folder.iterdir()) == []


def test_a_good_out_leaves_no_trace_of_the_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], no_sweep: list
) -> None:
    out = tmp_path / "report.json"
    assert run_cli([*TINY, "--format", "json", "--out", str(out)]) == 0
    assert len(no_sweep) == 1
    assert [p.name for p in tmp_path.iterdir()] == ["report.json"]  # no probe file left
    assert json.loads(out.read_text(encoding="utf-8"))["records"] == []


def test_a_skipped_float64_check_is_said_in_the_table_and_json(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bench, "reference_bytes", lambda c, impl, device: {"cpu": 2**62})
    assert run_cli([*TINY, "--impl", "sdpa"]) == 0
    table = capsys.readouterr().out
    assert "sdpa: float64 check at n = 128 skipped: needs " in table
    assert run_cli([*TINY, "--impl", "sdpa", "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    (note,) = data["notes"]  # free memory may differ by now
    assert note.startswith("sdpa: float64 check at n = 128 skipped: needs 4294967296.0 GiB of CPU")
    assert all(r["status"] == "ok" and r["error"] is None for r in data["records"])


# Config ↔ argv: one command line for the window and the command ----------------------------

POWERS = [2**k for k in range(18)]  # 1 … 131072


@st.composite
def configs(draw: st.DrawFn) -> Config:
    """Any valid Config: every field drawn over its whole accepted range."""
    low, high = sorted(draw(st.lists(st.sampled_from(POWERS), min_size=2, max_size=2)))
    whole = {
        name: draw(st.integers(lo, hi))
        for name, lo, hi in (
            ("batch", 1, 1024),
            ("heads", 1, 1024),
            ("d_head", 1, 1024),
            ("repeats", 1, 1000),
            ("warmup", 0, 100),
            ("threads", 0, 1024),
        )
    }
    impls = draw(st.lists(st.sampled_from(IMPLEMENTATIONS), min_size=1, unique=True))
    heads = whole["heads"]
    kv_heads = draw(st.sampled_from([0, *(g for g in range(1, heads + 1) if heads % g == 0)]))
    decode = draw(st.booleans())
    masks = {"window": 0, "documents": 0}
    if not decode:
        documents = [0, *(2**k for k in range(8) if 2**k <= min(low, MAX_DOCUMENTS))]
        masks = {
            "window": draw(st.integers(0, POWERS[-1])),
            "documents": draw(st.sampled_from(documents)),
        }
    return Config(
        device=draw(st.sampled_from(DEVICES)),
        dtype=draw(st.sampled_from(DTYPES)),
        causal=draw(st.booleans()),
        backward=not decode and draw(st.booleans()),
        min_n=low,
        max_n=high,
        impls=tuple(impls),
        phase="decode" if decode else "prefill",
        kv_heads=kv_heads,
        **masks,
        **whole,
    )


@settings(max_examples=300, deadline=None)
@given(configs())
def test_config_to_argv_and_back_is_the_same_config(config: Config) -> None:
    config.check()
    argv = config_to_argv(config)
    assert all(isinstance(a, str) for a in argv)
    assert config_from_argv(argv) == config


# Every field away from its default (and from the command's defaults: all impls, max-n by
# device), one at a time and all at once: a flag that is dropped or misread shows.
CHANGED = {
    "device": "cpu",
    "dtype": "float16",
    "batch": 3,
    "heads": 5,
    "d_head": 24,
    "causal": True,
    "backward": True,
    "min_n": 32,
    "max_n": 1024,
    "impls": ("math", "naive"),
    "repeats": 7,
    "warmup": 4,
    "threads": 2,
    "phase": "decode",
    "kv_heads": 1,
    "window": 48,
    "documents": 4,
}
# All at once, as the command accepts them: decode allows no window, documents or backward.
PREFILL_ALL = Config(**(CHANGED | {"phase": "prefill"}))  # type: ignore[arg-type]
DECODE_ALL = Config(**(CHANGED | {"window": 0, "documents": 0, "backward": False}))  # type: ignore[arg-type]


def test_the_changed_values_cover_every_field() -> None:
    d, cli = Config(), config_from_argv([])
    assert set(CHANGED) == {f.name for f in fields(Config)}
    for name, value in CHANGED.items():
        assert value != getattr(d, name) and value != getattr(cli, name), name


CHANGED_CONFIGS = [Config(**{name: value}) for name, value in CHANGED.items()]
CHANGED_CONFIGS += [Config(**CHANGED), PREFILL_ALL, DECODE_ALL]  # type: ignore[arg-type]


@pytest.mark.parametrize("config", CHANGED_CONFIGS, ids=[*CHANGED, "all", "prefill", "decode"])
def test_every_field_round_trips(config: Config) -> None:
    assert config_from_argv(config_to_argv(config)) == config


@pytest.mark.parametrize("changed", list(CHANGED))
def test_the_command_runs_the_config_its_argv_describes(
    no_sweep: list, capsys: pytest.CaptureFixture[str], changed: str
) -> None:
    """``attnviz bench`` itself, given config_to_argv's flags, sweeps that very config
    (its device resolved: cpu here, as the window asks for)."""
    config = Config(**{"device": "cpu", changed: CHANGED[changed]})
    assert run_cli(["bench", *config_to_argv(config), "--format", "json"]) == 0
    assert no_sweep == [config]
    for everything in (PREFILL_ALL, DECODE_ALL):
        assert run_cli(["bench", *config_to_argv(everything), "--format", "json"]) == 0
        assert no_sweep[-1] == everything


def test_the_command_line_defaults_are_the_commands() -> None:
    """Flags left out: all implementations but flex, 4096 as top n off a GPU, Config's
    others."""
    assert config_from_argv([]) == Config(impls=DEFAULT_IMPLS)
    assert set(IMPLEMENTATIONS) - set(DEFAULT_IMPLS) == {"flex", "flex-eager"}
    assert config_from_argv(["--device", "cuda"]).max_n == 65536
    assert config_from_argv(["--device", "cpu", "--threads", "3"]).threads == 3


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--heads", "two"], "two"),
        (["--impl", "naive,foo"], "foo"),
        (["--dtype", "float8"], "float8"),
        (["--format", "json"], "--format"),  # the command's own flags are not the Config's
        (["--warmup"], "--warmup"),
    ],
)
def test_config_from_argv_refuses_what_it_cannot_read(argv: list[str], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        config_from_argv(argv)


# The new cases: GQA, window and documents, flex, decode ------------------------------------------


def test_the_new_flags_reach_the_config(no_sweep: list, capsys: pytest.CaptureFixture[str]) -> None:
    argv = [*TINY, "--heads", "8", "--kv-heads", "2", "--window", "32", "--documents", "4"]
    assert run_cli([*argv, "--impl", "flex,flex-eager,naive"]) == 0
    config = no_sweep[-1]
    assert (config.heads, config.kv_heads, config.groups) == (8, 2, 2)
    assert (config.window, config.documents, config.phase) == (32, 4, "prefill")
    assert config.impls == ("flex", "flex-eager", "naive")
    assert run_cli([*TINY, "--phase", "decode", "--kv-heads", "1"]) == 0
    assert (no_sweep[-1].phase, no_sweep[-1].kv_heads) == ("decode", 1)


def test_a_decode_run_reports_bandwidth_in_every_format(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(devices, "copy_gbps", lambda device, repeats=5, size=None: 20.0)
    argv = [*TINY, "--phase", "decode", "--kv-heads", "1", "--min-n", "256", "--max-n", "512"]
    assert run_cli([*argv, "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["copy_gbps"] == 20.0 and data["config"]["phase"] == "decode"
    for r in data["records"]:
        assert r["status"] == "ok"
        read = 2 * 1 * r["n"] * 16 * 4  # K and V of one key/value head, float32
        assert r["gbps"] == pytest.approx(read / r["time_ms"] * 1e-6, rel=1e-9)
        assert r["share_of_copy"] == pytest.approx(r["gbps"] / 20.0, rel=1e-9)
    assert run_cli([*argv, "--format", "csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [float(r["gbps"]) > 0 for r in rows] == [True] * 4
    assert run_cli(argv) == 0
    table = capsys.readouterr().out.splitlines()
    assert "copy bandwidth 20 GB/s" in table[0]
    assert "GB/s" in table[1] and "of copy" in table[1] and "TFLOP/s" not in table[1]


def test_flex_without_a_compiler_is_unsupported_and_the_run_succeeds(tmp_path: Path) -> None:
    """A fresh ``attnviz bench`` where the C++ compiler torch.compile needs is missing (as on
    a machine without a toolchain): flex is reported unsupported with torch's reason, the
    eager flex and naive run, exit status 0."""
    env = os.environ | {
        "CXX": str(tmp_path / "no-such-c++"),
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"),  # nothing compiled before
    }
    p = subprocess.run(
        [sys.executable, "-m", "attnviz", "bench", *TINY[1:-1], "naive,flex,flex-eager",
         "--max-n", "64", "--window", "8", "--format", "json"],
        capture_output=True, text=True, timeout=300, check=False, cwd=ROOT, env=env,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-2000:]
    assert "Traceback" not in p.stderr
    got = {r["impl"]: r for r in json.loads(p.stdout)["records"]}
    flex = got["flex"]["status"]
    assert flex.startswith("unsupported: flex (torch.compile) on cpu: "), flex
    assert "compiler" in flex.lower()
    assert got["flex"]["time_ms"] is None and got["flex"]["compile_ms"] is None
    assert got["naive"]["status"] == "ok" and got["flex-eager"]["status"] == "ok"


def test_the_new_cases_run_without_numpy() -> None:
    """GQA with a window through naive, SDPA and eager flex, then a decode run, in one
    fresh interpreter where NumPy is absent (as in test_bench_runs_without_numpy)."""
    p = python(
        """
        import contextlib, importlib.abc, io, json, runpy, sys

        sys.modules["numpy"] = None
        base = ["attnviz", "bench", "--device", "cpu", "--heads", "2", "--kv-heads", "1",
                "--d-head", "8", "--min-n", "16", "--max-n", "32", "--repeats", "1",
                "--format", "json"]
        runs = {}
        for name, extra in {
            "window": ["--impl", "naive,sdpa,flex-eager", "--window", "4"],
            "decode": ["--impl", "naive,sdpa", "--phase", "decode"],
        }.items():
            sys.argv = base + extra
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                try:
                    runpy.run_module("attnviz", run_name="__main__", alter_sys=True)
                except SystemExit as e:
                    runs[name] = {"code": e.code, "report": json.loads(out.getvalue())}
        loaded = [m for m, v in sys.modules.items() if m.split(".")[0] == "numpy" and v]
        print(json.dumps({"runs": runs, "loaded": loaded}))
        """
    )
    assert "Traceback" not in p.stderr, p.stderr[-3000:]
    child = json.loads(p.stdout.splitlines()[-1])
    assert child["loaded"] == []
    window, decode = child["runs"]["window"], child["runs"]["decode"]
    assert window["code"] == 0 and decode["code"] == 0
    for r in window["report"]["records"]:
        assert r["status"] == "ok", r
        n = r["n"]
        pairs = n * 4 - 4 * 3 // 2  # a window of 4: rows see 1, 2, 3, then 4 keys
        assert r["tflops"] == pytest.approx(4 * 2 * 8 * pairs / r["time_ms"] * 1e-9, rel=1e-9)
    assert decode["report"]["copy_gbps"] > 0
    for r in decode["report"]["records"]:
        assert r["status"] == "ok" and r["gbps"] > 0, r
