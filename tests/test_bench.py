"""The long-sequence benchmark core: records, arithmetic, errors, guards, cancellation.

CPU only and small (heads 2, d_head 16, n from 64 to 512, one repeat, no warm-up). Every
expected number (FLOPs, predicted bytes, reference outputs) is computed here from the
formulas in the issue, never read back from attnviz.bench.sweep. The matrix-multiply
ceiling is replaced by a fixed number in most tests: it is slow on a CPU and its value
only enters through share_of_gemm, which the tests check against that number.
"""

from __future__ import annotations

import json
import math
import statistics
import time

import pytest

torch = pytest.importorskip("torch")

from attnviz.bench import devices, kernels  # noqa: E402
from attnviz.bench import sweep as bench  # noqa: E402
from attnviz.bench.config import IMPLEMENTATIONS, Config  # noqa: E402
from attnviz.bench.report import (  # noqa: E402
    Record,
    Report,
    as_csv,
    as_json,
    as_table,
    table_cells,
)

GEMM = 0.25  # TFLOP/s: the ceiling the fixture below pretends to measure
F32 = 4  # bytes per float32
CUDA = torch.cuda.is_available()


def tiny(**kw: object) -> Config:
    """A CPU sweep small enough for a unit test."""
    base: dict[str, object] = dict(
        device="cpu",
        heads=2,
        d_head=16,
        min_n=64,
        max_n=128,
        impls=("naive", "sdpa"),
        repeats=1,
        warmup=0,
    )
    base.update(kw)
    return Config(**base)  # type: ignore[arg-type]


@pytest.fixture
def fixed_gemm(monkeypatch: pytest.MonkeyPatch) -> float:
    monkeypatch.setattr(devices, "gemm_tflops", lambda device, dtype, repeats=5: GEMM)
    return GEMM


# Our own arithmetic, from the issue -------------------------------------------------------


def my_flops(b: int, h: int, n: int, d: int, causal: bool, backward: bool) -> float:
    """FlashAttention's count: 4·b·h·n²·d forward, half if causal; backward adds 2.5×."""
    forward = 4 * b * h * n * n * d
    if causal:
        forward /= 2
    return forward * 3.5 if backward else forward


def my_predicted(
    impl: str,
    b: int,
    h: int,
    n: int,
    d: int,
    size: int,
    backward: bool,
    g: int | None = None,
    r: int | None = None,
    mask: bool = False,
) -> int:
    """Dense: two b·h·r·n matrices (naive, math), or three and a boolean one (flex-eager),
    twice that with backward, + the output (+ the gradients of Q, and of K and V at g
    heads); naive and math under GQA (g < h) also hold K and V copied to h heads (and
    their gradients with backward). Fused: the output (+ the input gradients) + one
    float32 statistic per query row. SDPA and its backends given a dense mask (mask)
    also hold it as r·n values of the dtype. r: query rows (n, or 1 when decoding);
    g: key/value heads (h)."""
    g = g or h
    r = n if r is None else r
    twice = 2 if backward else 1
    out = b * h * r * d * size
    grads = out + 2 * b * g * n * d * size if backward else 0
    additive = (
        r * n * size if mask and impl in ("sdpa", "flash", "efficient", "cudnn", "math") else 0
    )
    if impl in ("naive", "math"):
        copies = 2 * b * h * n * d * size * twice if g != h else 0
        return 2 * b * h * r * n * size * twice + out + grads + copies + additive
    if impl == "flex-eager":
        return (3 * size + 1) * b * h * r * n * twice + out + grads
    return out + grads + b * h * r * 4 + additive


def my_inputs_bytes(b: int, h: int, n: int, d: int, size: int) -> int:
    return 3 * b * h * n * d * size


def reference_attention(q, k, v, causal: bool):
    """softmax(Q Kᵀ / √d + mask) V in float64, written out with explicit exponentials."""
    q, k, v = (t.double() for t in (q, k, v))
    n, d = q.shape[-2], q.shape[-1]
    s = torch.einsum("bhid,bhjd->bhij", q, k) / math.sqrt(d)
    if causal:
        future = torch.arange(n)[None, :] > torch.arange(n)[:, None]
        s = s.masked_fill(future, float("-inf"))
    e = torch.exp(s - s.amax(dim=-1, keepdim=True))
    w = e / e.sum(dim=-1, keepdim=True)
    return torch.einsum("bhij,bhjd->bhid", w, v)


def cells(records: list[Record]) -> list[tuple[str, int]]:
    return [(r.impl, r.n) for r in records]


def by_cell(records: list[Record]) -> dict[tuple[str, int], Record]:
    return {(r.impl, r.n): r for r in records}


# Config.check -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"min_n": 3}, "min_n"),
        ({"max_n": 100}, "max_n"),
        ({"min_n": 0}, "min_n"),
        ({"min_n": 256, "max_n": 128}, "min_n"),
        ({"max_n": 2**18}, "max_n"),
        ({"impls": ("naive", "foo")}, "foo"),
        ({"impls": ("foo",)}, "impl"),
        ({"impls": ()}, "impl"),
        ({"dtype": "float8"}, "dtype"),
        ({"dtype": "float64"}, "dtype"),
        ({"device": "tpu"}, "device"),
        ({"repeats": 0}, "repeats"),
        ({"warmup": -1}, "warmup"),
        ({"batch": 0}, "batch"),
        ({"heads": True}, "heads"),
        ({"min_n": True}, "min_n"),
        ({"d_head": 16.0}, "d_head"),
        ({"repeats": "3"}, "repeats"),
        ({"phase": "generate"}, "phase"),
        ({"heads": 12, "kv_heads": 5}, "kv_heads: 5 does not divide heads 12"),
        ({"heads": 4, "kv_heads": 8}, "kv_heads"),
        ({"kv_heads": -1}, "kv_heads"),
        ({"window": -1}, "window"),
        ({"window": 2**18}, "window"),
        ({"documents": 3}, "documents"),
        ({"documents": 256, "min_n": 256}, "documents"),
        ({"documents": 128, "min_n": 64}, "documents"),
        ({"phase": "decode", "window": 16}, "window"),
        ({"phase": "decode", "documents": 2}, "documents"),
        ({"phase": "decode", "backward": True}, "backward"),
    ],
)
def test_config_check_names_the_bad_parameter(changes: dict, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        tiny(**changes).check()


def test_config_check_accepts_a_good_config_and_sizes_are_the_powers_of_two() -> None:
    c = tiny(min_n=16, max_n=1024, impls=IMPLEMENTATIONS, causal=True, backward=True)
    c.check()
    assert c.sizes() == [16, 32, 64, 128, 256, 512, 1024]
    assert tiny(min_n=256, max_n=256).sizes() == [256]
    tiny(heads=12, kv_heads=4, window=100, documents=64, causal=False).check()
    tiny(heads=12, kv_heads=1, phase="decode", causal=True).check()  # causal: no matter
    assert tiny(heads=12, kv_heads=3).groups == 3 and tiny(heads=12).groups == 12


# The arithmetic on its own ------------------------------------------------------------


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("backward", [False, True])
def test_attention_flops_follow_flashattention(causal: bool, backward: bool) -> None:
    c = Config(batch=3, heads=5, d_head=24, causal=causal, backward=backward)
    for n in (16, 1024, 65536):
        expected = my_flops(3, 5, n, 24, causal, backward)
        assert bench.attention_flops(c, n) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("backward", [False, True])
@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_predicted_bytes_by_the_documented_formula(dtype: str, backward: bool, impl: str) -> None:
    size = 4 if dtype == "float32" else 2
    c = Config(dtype=dtype, batch=2, heads=3, d_head=40, backward=backward)
    for n in (64, 4096):
        assert bench.predicted_bytes(c, impl, n) == my_predicted(impl, 2, 3, n, 40, size, backward)


def test_dense_prediction_grows_fourfold_and_fused_twofold() -> None:
    c = Config(heads=8, d_head=64)
    for n in (1024, 2048, 4096):
        dense = bench.predicted_bytes(c, "naive", 2 * n) / bench.predicted_bytes(c, "naive", n)
        fused = bench.predicted_bytes(c, "sdpa", 2 * n) / bench.predicted_bytes(c, "sdpa", n)
        assert 3.8 < dense <= 4.0
        assert fused == pytest.approx(2.0)


# Records: complete and consistent ---------------------------------------------------------


@pytest.mark.parametrize(("causal", "backward"), [(False, False), (True, False), (True, True)])
def test_records_are_complete_and_consistent(
    fixed_gemm: float, causal: bool, backward: bool
) -> None:
    c = tiny(impls=("naive", "sdpa", "math"), causal=causal, backward=backward)
    seen: list[Record] = []
    report = bench.run(c, on_record=seen.append)

    assert not report.cancelled
    assert report.gemm_tflops == fixed_gemm
    assert report.device["type"] == "cpu"
    assert report.config["device"] == "cpu"
    assert cells(report.records) == [(i, n) for n in (64, 128) for i in ("naive", "sdpa", "math")]
    assert seen == report.records
    for r in report.records:
        assert r.status == "ok", (r.impl, r.n, r.status)
        assert r.time_ms is not None and r.time_ms > 0
        assert isinstance(r.peak_bytes, int) and r.peak_bytes > 0
        flops = my_flops(1, 2, r.n, 16, causal, backward)
        assert r.tflops == pytest.approx(flops / (r.time_ms / 1e3) / 1e12, rel=1e-9)
        assert r.share_of_gemm == pytest.approx(r.tflops / fixed_gemm, rel=1e-9)
        assert r.predicted_bytes == my_predicted(r.impl, 1, 2, r.n, 16, F32, backward)
        assert r.error is not None and 0 < r.error < 1e-4


def my_matmul_tflops(size: int = 2048, repeats: int = 3) -> float:
    """This CPU's float32 square matrix-multiply throughput, timed here: 2·size³ FLOPs."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    a @ b  # warm-up
    seconds = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        seconds.append(time.perf_counter() - t0)
    return 2 * size**3 / statistics.median(seconds) / 1e12


def test_share_of_gemm_against_the_measured_ceiling() -> None:
    """One sweep with the real (slow) ceiling. Each share is worked out here from the
    record's own time and the FLOP count of the issue; the ceiling is compared with a
    matrix multiply timed here (a wide band: other work shares this CPU, but a ceiling
    in the wrong unit, GFLOP/s for TFLOP/s, is a thousand times off)."""
    report = bench.run(tiny(min_n=64, max_n=128, impls=("naive", "sdpa")))
    mine = my_matmul_tflops()
    assert mine / 20 < report.gemm_tflops < mine * 20, (report.gemm_tflops, mine)
    assert [r.status for r in report.records] == ["ok"] * 4
    for r in report.records:
        flop = 4 * 1 * 2 * r.n**2 * 16  # b = 1, h = 2, d = 16
        share = flop / (r.time_ms / 1e3) / (report.gemm_tflops * 1e12)
        assert r.share_of_gemm == pytest.approx(share, rel=1e-9), (r.impl, r.n)


def hand_made_report() -> Report:
    """A report written out by hand: an ok record, an out-of-memory one, a skipped one."""
    return Report(
        device={"type": "cpu", "torch": "2.5.0", "name": "Test CPU", "backends": ["math"]},
        config=Config(device="cpu", dtype="bfloat16", heads=2, d_head=16).to_dict(),
        gemm_tflops=0.8,
        records=[
            Record("naive", 256, "ok", 1.5, 3 * 2**20, 3_276_800, 0.0125, 0.015625, 0.001953125),
            Record("naive", 512, "oom", predicted_bytes=13_107_200),
            Record("sdpa", 512, "skipped: needs 9.0 GiB, 1.0 GiB free", predicted_bytes=73_728),
        ],
        cancelled=True,
        notes=["sdpa: float64 check at n = 128 skipped: out of memory"],
    )


def test_report_to_dict_holds_every_record() -> None:
    """Through JSON text and back: every value of every record, as written by hand above."""
    d = json.loads(as_json(hand_made_report()))
    assert d["device"] == {
        "type": "cpu", "torch": "2.5.0", "name": "Test CPU", "backends": ["math"],
    }  # fmt: skip
    assert d["gemm_tflops"] == 0.8
    assert d["cancelled"] is True
    assert d["notes"] == ["sdpa: float64 check at n = 128 skipped: out of memory"]
    assert d["config"] == {
        "device": "cpu", "dtype": "bfloat16", "batch": 1, "heads": 2, "d_head": 16,
        "causal": False, "backward": False, "min_n": 256, "max_n": 4096,
        "impls": ["naive", "sdpa"], "repeats": 5, "warmup": 1, "threads": 0,
        "phase": "prefill", "kv_heads": 0, "window": 0, "documents": 0,
    }  # fmt: skip
    assert d["copy_gbps"] == 0.0
    none = {"time_ms": None, "peak_bytes": None, "tflops": None, "share_of_gemm": None}
    new = {"compile_ms": None, "gbps": None, "share_of_copy": None}
    assert d["records"] == [
        {"impl": "naive", "n": 256, "status": "ok", "time_ms": 1.5, "peak_bytes": 3145728,
         "predicted_bytes": 3276800, "tflops": 0.0125, "share_of_gemm": 0.015625,
         "error": 0.001953125, **new},
        {"impl": "naive", "n": 512, "status": "oom", **none, "predicted_bytes": 13107200,
         "error": None, **new},
        {"impl": "sdpa", "n": 512, "status": "skipped: needs 9.0 GiB, 1.0 GiB free", **none,
         "predicted_bytes": 73728, "error": None, **new},
    ]  # fmt: skip
    # and read back, the same report, its config the sweep's
    again = Report.from_dict(d)
    assert again == hand_made_report()
    assert again.sweep_config() == Config(device="cpu", dtype="bfloat16", heads=2, d_head=16)


def test_a_swept_report_survives_json_with_its_measured_values(fixed_gemm: float) -> None:
    report = bench.run(tiny())
    d = json.loads(as_json(report))
    assert d["gemm_tflops"] == fixed_gemm and d["cancelled"] is False
    assert [(r["impl"], r["n"]) for r in d["records"]] == [
        (i, n) for n in (64, 128) for i in ("naive", "sdpa")
    ]
    for r, got in zip(report.records, d["records"], strict=True):
        assert got["time_ms"] == r.time_ms and got["peak_bytes"] == r.peak_bytes  # exactly
        flops = my_flops(1, 2, r.n, 16, False, False)
        assert got["tflops"] == pytest.approx(flops / (got["time_ms"] / 1e3) / 1e12, rel=1e-9)
        assert got["predicted_bytes"] == my_predicted(r.impl, 1, 2, r.n, 16, F32, False)
        assert got["error"] == r.error and 0 < got["error"] < 1e-4
    assert Report.from_dict(d) == report
    assert Report.from_dict(d).sweep_config() == tiny()


# The report's text formats --------------------------------------------------------------------


def test_table_cells_as_both_the_command_and_the_window_show_them() -> None:
    ok, oom, skipped = hand_made_report().records
    assert table_cells(ok) == [
        "naive", "256", "1.5", "3.0", "3.1", "0.0125", "2%", "0.002", "ok",
    ]  # fmt: skip
    assert table_cells(oom) == ["naive", "512", "–", "–", "12.5", "–", "–", "–", "oom"]
    assert table_cells(skipped)[4] == "0.1" and table_cells(skipped)[-1] == skipped.status


def test_table_text_of_a_hand_made_report() -> None:
    assert as_table(hand_made_report()).splitlines() == [
        "Test CPU (cpu, torch 2.5.0); measured matrix multiply 0.8 TFLOP/s (bfloat16)",
        " impl    n  time ms  peak MiB  predicted MiB  TFLOP/s  of GEMM  error  status",
        "naive  256      1.5       3.0            3.1   0.0125       2%  0.002  ok",
        "naive  512        –         –           12.5        –        –      –  oom",
        " sdpa  512        –         –            0.1        –        –      –  "
        "skipped: needs 9.0 GiB, 1.0 GiB free",
        "sdpa: float64 check at n = 128 skipped: out of memory",
        "(cancelled)",
    ]


def test_csv_of_a_hand_made_report() -> None:
    assert as_csv(hand_made_report()).splitlines() == [
        "impl,n,status,time_ms,peak_bytes,predicted_bytes,tflops,share_of_gemm,error,"
        "compile_ms,gbps,share_of_copy",
        "naive,256,ok,1.5,3145728,3276800,0.0125,0.015625,0.001953125,,,",
        "naive,512,oom,,,13107200,,,,,,",
        'sdpa,512,"skipped: needs 9.0 GiB, 1.0 GiB free",,,73728,,,,,,',
    ]


# Peak memory on the CPU against the prediction ---------------------------------------------


def test_cpu_peak_memory_matches_the_prediction(fixed_gemm: float) -> None:
    report = bench.run(tiny(min_n=256, max_n=512))
    got = by_cell(report.records)
    for n in (256, 512):
        r = got["naive", n]
        assert r.status == "ok"
        assert r.peak_bytes == pytest.approx(
            my_predicted("naive", 1, 2, n, 16, F32, False), rel=0.1
        )
        # The fused kernel also takes small per-thread scratch buffers, not in the formula.
        s = got["sdpa", n]
        predicted = my_predicted("sdpa", 1, 2, n, 16, F32, False)
        assert 0.9 * predicted <= s.peak_bytes <= predicted + 512 * 1024, n
    naive_growth = got["naive", 512].peak_bytes / got["naive", 256].peak_bytes
    assert 3.5 < naive_growth < 4.5


def test_cpu_peak_memory_of_the_math_backend_shows_the_dense_scores(fixed_gemm: float) -> None:
    report = bench.run(tiny(min_n=256, max_n=512, impls=("math",)))
    for r in report.records:
        assert r.status == "ok"
        predicted = my_predicted("math", 1, 2, r.n, 16, F32, False)
        assert r.peak_bytes == pytest.approx(predicted, rel=0.25), r.n


# Errors against the float64 reference -----------------------------------------------------


@pytest.mark.parametrize("causal", [False, True])
def test_naive_matches_an_independent_float64_reference(causal: bool) -> None:
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(2, 3, 128, 16, generator=g, dtype=torch.float64) for _ in range(3))
    expected = reference_attention(q, k, v, causal)
    exact = kernels.naive(q, k, v, causal)
    assert float((exact - expected).abs().max()) < 1e-12
    rounded = kernels.naive(q.float(), k.float(), v.float(), causal)
    assert rounded.dtype == torch.float32
    err = float((rounded.double() - expected).abs().max())
    assert 0 < err < 1e-5


def test_every_cpu_implementation_is_close_to_the_reference(fixed_gemm: float) -> None:
    report = bench.run(tiny(min_n=64, max_n=64, impls=("naive", "sdpa", "flash", "math")))
    for r in report.records:
        if r.status.startswith("unsupported"):
            continue  # flash on a CPU depends on the torch build
        assert r.status == "ok"
        assert r.error is not None and 0 < r.error < 1e-4, (r.impl, r.error)


def test_error_reflects_the_dtype(fixed_gemm: float) -> None:
    """bfloat16 keeps 8 bits of mantissa: its error is far above float32's, still bounded."""
    report = bench.run(tiny(min_n=64, max_n=64, impls=("naive",), dtype="bfloat16"))
    (r,) = report.records
    assert r.status == "ok"
    assert r.predicted_bytes == my_predicted("naive", 1, 2, 64, 16, 2, False)
    assert r.error is not None and 1e-4 < r.error < 0.1


def test_a_wrong_fused_implementation_is_caught(
    fixed_gemm: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_call = kernels.call

    def off_by_two_percent(impl, q, k, v, causal, mask=None):
        out = real_call(impl, q, k, v, causal, mask)
        return out * 1.02 if impl == "sdpa" else out

    monkeypatch.setattr(kernels, "call", off_by_two_percent)
    report = bench.run(tiny(min_n=64, max_n=64))
    got = by_cell(report.records)
    assert got["naive", 64].error < 1e-4
    assert got["sdpa", 64].error > 1e-3


def unscaled_naive(q, k, v, causal, hidden=None):
    """Dense attention that forgets the 1/√d: a plausible bug."""
    s = q @ k.transpose(-2, -1)
    if causal:
        n = q.shape[-2]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def test_a_wrong_naive_is_caught_in_its_own_error(
    fixed_gemm: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kernels, "naive", unscaled_naive)
    report = bench.run(tiny(min_n=64, max_n=64, impls=("naive",)))
    assert report.records[0].error > 1e-2


# Out of memory in the middle of a sweep ------------------------------------------------------


@pytest.mark.parametrize(
    "oom",
    [
        MemoryError(),
        RuntimeError("CUDA out of memory. Tried to allocate 64.00 GiB"),
        RuntimeError(
            "[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory"
        ),
        torch.cuda.OutOfMemoryError("CUDA out of memory."),
    ],
    ids=["MemoryError", "cuda-text", "cpu-text", "OutOfMemoryError"],
)
def test_out_of_memory_is_recorded_and_the_sweep_continues(
    fixed_gemm: float, monkeypatch: pytest.MonkeyPatch, oom: BaseException
) -> None:
    real_step = bench._step

    def step(impl, q, k, v, c, mask=None):
        if impl == "naive" and q.shape[-2] == 128:
            raise oom
        return real_step(impl, q, k, v, c, mask)

    monkeypatch.setattr(bench, "_step", step)
    report = bench.run(tiny(max_n=512))
    got = by_cell(report.records)
    assert cells(report.records) == [(i, n) for n in (64, 128, 256, 512) for i in ("naive", "sdpa")]
    assert got["naive", 64].status == "ok"
    assert got["naive", 128].status == "oom"
    for n in (256, 512):
        assert got["naive", n].status == "skipped: out of memory at n = 128"
    for n in (128, 256, 512):
        r = got["naive", n]
        assert (r.time_ms, r.peak_bytes, r.tflops, r.share_of_gemm) == (None,) * 4
        assert r.predicted_bytes == my_predicted("naive", 1, 2, n, 16, F32, False)
    for n in (64, 128, 256, 512):
        r = got["sdpa", n]
        assert r.status == "ok" and r.time_ms > 0 and r.peak_bytes > 0


@pytest.mark.parametrize(
    "error", [ValueError("a real bug"), RuntimeError("shapes cannot be multiplied")]
)
def test_an_error_that_is_not_out_of_memory_propagates(
    fixed_gemm: float, monkeypatch: pytest.MonkeyPatch, error: Exception
) -> None:
    def step(impl, q, k, v, c, mask=None):
        raise error

    monkeypatch.setattr(bench, "_step", step)
    with pytest.raises(type(error), match=str(error)):
        bench.run(tiny())


# The predicted-memory guard ------------------------------------------------------------------


def test_the_memory_guard_skips_a_too_large_n_without_running_it(
    fixed_gemm: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    need = {
        (impl, n): my_predicted(impl, 1, 2, n, 16, F32, False) + my_inputs_bytes(1, 2, n, 16, F32)
        for impl in ("naive", "sdpa")
        for n in (64, 128, 256)
    }
    # Twice what naive needs at 128: enough under any headroom from 50 % to 100 %, but
    # below what naive needs at 256 (4× the n² part); sdpa fits everywhere.
    free = 2 * need["naive", 128]
    assert need["naive", 256] > free
    assert max(v for (i, _), v in need.items() if i == "sdpa") < free / 2
    monkeypatch.setattr(devices, "free_bytes", lambda device: free)
    stepped: list[tuple[str, int]] = []
    real_step = bench._step

    def spy(impl, q, k, v, c, mask=None):
        stepped.append((impl, q.shape[-2]))
        return real_step(impl, q, k, v, c, mask)

    monkeypatch.setattr(bench, "_step", spy)
    report = bench.run(tiny(max_n=256))
    got = by_cell(report.records)
    assert len(report.records) == 6
    skipped = got["naive", 256]
    assert skipped.status.startswith("skipped: needs ") and "GiB" in skipped.status
    assert (skipped.time_ms, skipped.peak_bytes, skipped.tflops) == (None, None, None)
    assert skipped.predicted_bytes == my_predicted("naive", 1, 2, 256, 16, F32, False)
    assert ("naive", 256) not in stepped
    for cell, r in got.items():
        if cell != ("naive", 256):
            assert r.status == "ok", cell
            assert cell in stepped


# Cancellation and progress -------------------------------------------------------------------


@pytest.mark.parametrize("after", [1, 4, 7])
def test_cancellation_stops_the_sweep(fixed_gemm: float, after: int) -> None:
    calls: list[tuple[int, int, str]] = []
    asked_after_cancel: list[int] = []

    def progress(step: int, total: int, message: str) -> None:
        calls.append((step, total, message))

    def cancelled() -> bool:
        if len(calls) > after:
            asked_after_cancel.append(len(calls))
        return len(calls) >= after

    c = tiny(max_n=256)
    report = bench.run(c, progress=progress, cancelled=cancelled)
    assert report.cancelled
    assert len(report.records) < 6
    full = [(i, n) for n in (64, 128, 256) for i in ("naive", "sdpa")]
    assert cells(report.records) == full[: len(report.records)]
    assert all(r.status == "ok" for r in report.records)
    assert len(calls) == after  # nothing runs after the answer turned True
    assert not asked_after_cancel


def test_progress_steps_increase_to_a_constant_total(fixed_gemm: float) -> None:
    calls: list[tuple[int, int, str]] = []
    report = bench.run(tiny(max_n=256), progress=lambda s, t, m: calls.append((s, t, m)))
    assert not report.cancelled and len(report.records) == 6
    steps = [s for s, _, _ in calls]
    totals = {t for _, t, _ in calls}
    assert len(totals) == 1
    (total,) = totals
    assert total >= 6
    assert steps == sorted(steps)
    assert steps[0] == 0 and steps[-1] == total
    assert all(0 <= s <= total for s in steps)
    assert all(isinstance(m, str) and m for _, _, m in calls)
    assert any("naive" in m and "256" in m for _, _, m in calls)


def test_an_uncancelled_sweep_reports_not_cancelled(fixed_gemm: float) -> None:
    report = bench.run(tiny(), cancelled=lambda: False)
    assert not report.cancelled and len(report.records) == 4


# Unsupported backends -------------------------------------------------------------------------


@pytest.mark.skipif(CUDA, reason="these backends exist on CUDA")
def test_gpu_only_backends_are_unsupported_on_a_cpu(fixed_gemm: float) -> None:
    report = bench.run(tiny(impls=("efficient", "cudnn", "naive")))
    assert len(report.records) == 6
    for r in report.records:
        if r.impl == "naive":
            assert r.status == "ok"
            continue
        assert r.status.startswith("unsupported: ")
        assert len(r.status.removeprefix("unsupported: ").strip()) > 5  # a reason
        assert (r.time_ms, r.peak_bytes, r.tflops, r.share_of_gemm, r.error) == (None,) * 5
        assert r.predicted_bytes == my_predicted(r.impl, 1, 2, r.n, 16, F32, False)
    assert "efficient" not in report.device["backends"]
    assert "cudnn" not in report.device["backends"]
    assert "math" in report.device["backends"]


def test_a_backend_that_refuses_the_configured_head_size_is_recorded(
    fixed_gemm: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_call = kernels.call

    def picky(impl, q, k, v, causal, mask=None):
        # as CUDA's flash kernel refuses some head sizes (and float32) that it cannot tile
        if impl == "flash" and q.shape[-1] != 16:
            raise RuntimeError("No available kernel. Aborting execution.")
        return real_call(impl, q, k, v, causal, mask)

    monkeypatch.setattr(kernels, "call", picky)
    report = bench.run(tiny(d_head=24, impls=("flash", "sdpa")))
    got = by_cell(report.records)
    assert got["flash", 64].status.startswith("unsupported: ")
    assert got["sdpa", 64].status == "ok"


# Devices ------------------------------------------------------------------------------------


@pytest.mark.skipif(CUDA, reason="needs a machine without CUDA")
def test_asking_for_cuda_without_it_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="cuda"):
        devices.resolve_device("cuda")
    with pytest.raises(ValueError, match="cuda"):
        bench.run(tiny(device="cuda"))
    assert devices.resolve_device("auto") == "cpu"
    assert devices.resolve_device("cpu") == "cpu"


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
def test_a_tiny_cuda_sweep_measures_peak_memory() -> None:
    c = tiny(device="cuda", min_n=1024, max_n=2048, warmup=1)
    report = bench.run(c)
    assert report.device["type"] == "cuda" and report.gemm_tflops > 0
    got = by_cell(report.records)
    for n in (1024, 2048):
        dense = got["naive", n]
        assert dense.status == "ok" and dense.time_ms > 0
        predicted = my_predicted("naive", 1, 2, n, 16, F32, False)
        assert dense.peak_bytes == pytest.approx(predicted, rel=0.25)
        fused = got["sdpa", n]
        assert fused.status == "ok"
        out_bytes = 2 * n * 16 * F32
        assert out_bytes <= fused.peak_bytes < dense.peak_bytes / 4
        assert fused.error < 1e-3  # TF32 may be allowed on the GPU
    assert 3.5 < got["naive", 2048].peak_bytes / got["naive", 1024].peak_bytes < 4.5


def test_n_above_the_device_limit_is_skipped_without_running(
    fixed_gemm: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    stepped: list[int] = []
    monkeypatch.setattr(
        bench, "_step", lambda impl, q, k, v, c, m=None: stepped.append(q.shape[-2])
    )
    report = bench.run(tiny(min_n=65536, max_n=65536, impls=("sdpa",)))
    (r,) = report.records
    assert r.status.startswith("skipped: n above ") and r.status.endswith(" on cpu")
    assert r.time_ms is None and stepped == []


def test_threads_sets_torch_cpu_threads(fixed_gemm: float) -> None:
    before = torch.get_num_threads()
    try:
        report = bench.run(tiny(min_n=64, max_n=64, impls=("sdpa",), threads=1))
        assert torch.get_num_threads() == 1
        assert report.records[0].status == "ok"
    finally:
        torch.set_num_threads(before)


# The float64 check at n = CHECK_N under the memory guard --------------------------------------


def my_reference_bytes(b: int, h: int, d: int, size: int, impl: str) -> int:
    """Float32 draws + float64 copies of Q, K, V (12 bytes a value), two float64 n² matrices,
    five float64 outputs; then Q, K, V in the sweep's dtype and the implementation at 128."""
    n = 128
    rows = b * h * n
    cpu = rows * d * (3 * 12 + 5 * 8) + 2 * rows * n * 8
    return cpu + 3 * rows * d * size + my_predicted(impl, b, h, n, d, size, False)


def test_the_reference_check_is_skipped_for_memory_not_called_unsupported(
    fixed_gemm: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Free memory enough for the sweep's tiny sizes but not for the float64 check at
    # n = 128 (so the test stays small: no real allocation near the limit).
    def never(*args: object) -> float:
        raise AssertionError("the float64 check ran")

    monkeypatch.setattr(bench, "reference_error", never)
    c = tiny(batch=2, heads=2, d_head=16, min_n=1, max_n=2)
    enough = min(my_reference_bytes(2, 2, 16, F32, i) for i in ("naive", "sdpa"))
    monkeypatch.setattr(devices, "free_bytes", lambda device: int(enough))
    report = bench.run(c)
    assert cells(report.records) == [(i, n) for n in (1, 2) for i in ("naive", "sdpa")]
    for r in report.records:
        assert not r.status.startswith("unsupported"), r.status
        assert r.error is None
    need = my_reference_bytes(2, 2, 16, F32, "naive") / 2**30
    assert report.notes[0].startswith(
        f"naive: float64 check at n = 128 skipped: needs {need:.1f} GiB of CPU memory, "
    )
    assert report.notes[1].startswith("sdpa: float64 check at n = 128 skipped: needs ")
    assert report.to_dict()["notes"] == report.notes


@pytest.mark.parametrize("impl", ["naive", "sdpa"])
def test_the_reference_guard_counts_by_the_documented_formula(impl: str) -> None:
    c = tiny(batch=3, heads=5, d_head=24)
    assert bench.reference_bytes(c, impl, "cpu") == {"cpu": my_reference_bytes(3, 5, 24, F32, impl)}


@pytest.mark.parametrize("impl", ["naive", "sdpa", "math"])
@pytest.mark.parametrize("causal", [False, True])
def test_the_reference_guard_never_underestimates_the_measured_peak(
    impl: str, causal: bool
) -> None:
    from functools import partial

    c = tiny(batch=2, heads=4, d_head=64, causal=causal)
    peak = devices.cpu_peak_bytes(partial(bench.reference_error, impl, c, "cpu"))
    predicted = bench.reference_bytes(c, impl, "cpu")["cpu"]
    assert predicted / 3 < peak <= predicted


def test_the_reference_guard_checks_free_memory(
    fixed_gemm: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Just less free memory than naive's check needs, far more than the sweep at n = 64.
    need = my_reference_bytes(1, 2, 16, F32, "naive")
    monkeypatch.setattr(devices, "free_bytes", lambda device: need - 1)
    report = bench.run(tiny(min_n=64, max_n=64))
    assert [r.status for r in report.records] == ["ok", "ok"]
    assert report.records[0].error is None
    assert report.notes[0].startswith("naive: float64 check at n = 128 skipped: needs ")


@pytest.mark.parametrize(
    "oom",
    [MemoryError(), RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried")],
    ids=["MemoryError", "cpu-text"],
)
def test_running_out_of_memory_in_the_check_skips_it_and_the_sweep_goes_on(
    fixed_gemm: float, monkeypatch: pytest.MonkeyPatch, oom: BaseException
) -> None:
    def check(impl: str, c: Config, device: str) -> float:
        if impl == "naive":
            raise oom
        return 1e-7

    monkeypatch.setattr(bench, "reference_error", check)
    report = bench.run(tiny(min_n=64, max_n=64))
    got = by_cell(report.records)
    assert got["naive", 64].status == "ok" and got["naive", 64].error is None
    assert got["sdpa", 64].status == "ok" and got["sdpa", 64].error == 1e-7
    assert report.notes == ["naive: float64 check at n = 128 skipped: out of memory"]


def test_a_check_that_fails_otherwise_still_marks_the_kernel_unsupported(
    fixed_gemm: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    def check(impl: str, c: Config, device: str) -> float:
        raise RuntimeError("No available kernel. Aborting execution.")

    monkeypatch.setattr(bench, "reference_error", check)
    report = bench.run(tiny(min_n=64, max_n=64, impls=("sdpa",)))
    (r,) = report.records
    assert r.status.startswith("unsupported: no sdpa kernel for these inputs")
    assert report.notes == []


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
def test_the_reference_guard_counts_gpu_memory_on_a_gpu(
    fixed_gemm: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = devices.free_bytes
    monkeypatch.setattr(devices, "free_bytes", lambda d: 1 if d == "cuda" else real(d))
    monkeypatch.setattr(bench, "_measure", lambda impl, n, *a: Record(impl, n, "ok"))
    report = bench.run(tiny(device="cuda", min_n=64, max_n=64))
    assert [r.error for r in report.records] == [None, None]
    assert all(" GiB of GPU memory, " in n for n in report.notes), report.notes


# Grouped-query shapes, masks beyond causal, flex and decode ---------------------------------

COPY = 12.5  # GB/s: the copy bandwidth the decode tests pretend to measure


@pytest.fixture
def fixed_copy(monkeypatch: pytest.MonkeyPatch) -> float:
    monkeypatch.setattr(devices, "copy_gbps", lambda device, repeats=5, size=None: COPY)
    return COPY


def my_repeat(t, heads: int):
    """Key/value heads as the query heads see them: query head j reads head j // (h / G)."""
    group = heads // t.shape[1]
    return t[:, [j // group for j in range(heads)]]


def my_keep(n: int, causal: bool, window: int, documents: int):
    """Which key each query sees, pair by pair: the same document (n / D tokens each);
    a window keeps itself and the W - 1 keys before it (causal by definition)."""
    length = n // documents if documents else n
    rows = []
    for i in range(n):
        row = []
        for j in range(n):
            ok = i // length == j // length
            if window:
                ok = ok and 0 <= i - j < window
            elif causal:
                ok = ok and j <= i
            row.append(ok)
        rows.append(row)
    return torch.tensor(rows)


def masked_reference(q, k, v, keep):
    """softmax(Q Kᵀ / √d, −∞ where keep is False) V in float64, exponentials written out."""
    q, k, v = (t.double() for t in (q, k, v))
    s = torch.einsum("bhid,bhjd->bhij", q, k) / math.sqrt(q.shape[-1])
    s = s.masked_fill(~keep, float("-inf"))
    e = torch.exp(s - s.amax(dim=-1, keepdim=True))
    return torch.einsum("bhij,bhjd->bhid", e / e.sum(dim=-1, keepdim=True), v)


def draws(*shapes: tuple[int, ...], seed: int = 5, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g, dtype=dtype) for shape in shapes]


HAS_FLEX = kernels.flex_missing() is None


@pytest.mark.parametrize("impl", ["naive", "sdpa", "math", "flex-eager"])
@pytest.mark.parametrize("causal", [False, True])
def test_gqa_equals_attention_on_keys_and_values_repeated_here(impl: str, causal: bool) -> None:
    if impl == "flex-eager" and not HAS_FLEX:
        pytest.skip(kernels.flex_missing())
    q, k, v = draws((2, 6, 48, 16), (2, 2, 48, 16), (2, 2, 48, 16))
    expected = reference_attention(q, my_repeat(k, 6), my_repeat(v, 6), causal)
    mask = kernels.mask_for(impl, tiny(heads=6, kv_heads=2, causal=causal), 48, "cpu")
    got = kernels.call(impl, q, k, v, causal, mask)
    assert got.shape == (2, 6, 48, 16)
    assert float((got - expected).abs().max()) < 1e-12


@pytest.mark.parametrize("impl", ["naive", "sdpa", "math"])
@pytest.mark.parametrize("groups", [4, 2, 1])
def test_a_decode_row_equals_the_last_row_of_full_causal_attention(impl: str, groups: int) -> None:
    q, k, v = draws((2, 4, 40, 16), (2, groups, 40, 16), (2, groups, 40, 16))
    full = reference_attention(q, my_repeat(k, 4), my_repeat(v, 4), causal=True)
    c = tiny(heads=4, kv_heads=groups, phase="decode", causal=True)
    # as the sweep steps: the new row is the last, so the causal mask hides nothing
    out = {}
    real_call = kernels.call

    def keep(*args, **kw):
        out["o"] = real_call(*args, **kw)
        return out["o"]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(kernels, "call", keep)
        bench._step(impl, q[:, :, -1:], k, v, c, kernels.mask_for(impl, c, 40, "cpu"))
    assert out["o"].shape == (2, 4, 1, 16)
    assert float((out["o"][:, :, 0] - full[:, :, -1]).abs().max()) < 1e-12


def test_decode_inputs_have_one_query_row_and_g_cached_heads() -> None:
    c = tiny(batch=3, heads=6, kv_heads=2, d_head=8, phase="decode")
    q, k, v = bench._inputs(c, 64, "cpu", torch.float32)
    assert q.shape == (3, 6, 1, 8) and k.shape == v.shape == (3, 2, 64, 8)
    # bytes of K and V a step reads, from the shapes: 2 tensors of b·G·n·d float32
    assert bench.kv_bytes(c, 64) == 2 * 3 * 2 * 64 * 8 * F32
    assert bench.kv_bytes(c, 64, "bfloat16") == 2 * 3 * 2 * 64 * 8 * 2
    assert bench.input_bytes(c, "naive", 64) == (3 * 6 * 1 * 8 + 2 * 3 * 2 * 64 * 8) * F32


@pytest.mark.parametrize(
    ("causal", "window", "documents"),
    [(False, 5, 0), (True, 0, 4), (False, 0, 4), (False, 7, 2), (True, 300, 0), (True, 1, 0)],
)
def test_flops_count_the_pairs_the_mask_keeps(causal: bool, window: int, documents: int) -> None:
    for n in (64, 256):
        pairs = int(my_keep(n, causal, window, documents).sum())
        c = Config(batch=2, heads=3, d_head=8, causal=causal, window=window, documents=documents)
        assert bench.attention_flops(c, n) == 4 * 2 * 3 * 8 * pairs
        back = Config(**(c.to_dict() | {"impls": (), "backward": True}))
        assert bench.attention_flops(back, n) == 3.5 * 4 * 2 * 3 * 8 * pairs


def test_flops_and_bytes_under_gqa_and_decode() -> None:
    gqa = Config(batch=2, heads=8, kv_heads=2, d_head=32)
    # the same arithmetic per query head, whatever the key/value heads
    assert bench.attention_flops(gqa, 512) == my_flops(2, 8, 512, 32, False, False)
    decode = Config(batch=2, heads=8, kv_heads=2, d_head=32, phase="decode", causal=True)
    assert bench.attention_flops(decode, 512) == 4 * 2 * 8 * 512 * 32  # one row, all keys
    size = 2
    for impl in ("naive", "sdpa", "math", "flex", "flex-eager"):
        for c, r in ((gqa, 512), (decode, 1)):
            c = Config(**(c.to_dict() | {"impls": (), "dtype": "bfloat16"}))
            assert bench.predicted_bytes(c, impl, 512) == my_predicted(
                impl, 2, 8, 512, 32, size, False, g=2, r=r
            ), (impl, c.phase)
            q_kv = (2 * 8 * r * 32 + 2 * 2 * 2 * 512 * 32) * size
            assert bench.input_bytes(c, impl, 512) == q_kv
    window = Config(heads=4, kv_heads=2, d_head=16, window=8)
    for impl in ("naive", "sdpa", "math", "flex", "flex-eager"):
        for backward in (False, True):
            c = Config(**(window.to_dict() | {"impls": (), "backward": backward}))
            expected = my_predicted(impl, 1, 4, 64, 16, F32, backward, g=2, mask=True)
            assert bench.predicted_bytes(c, impl, 64) == expected, (impl, backward)
    q_kv = (4 * 64 * 16 + 2 * 2 * 64 * 16) * F32
    assert bench.input_bytes(window, "naive", 64) == q_kv + 64 * 64  # and the boolean mask
    assert bench.input_bytes(window, "flex", 64) == q_kv  # a block mask: no n × n


@pytest.mark.parametrize("impl", ["naive", "sdpa", "math", "flex-eager"])
@pytest.mark.parametrize(
    ("causal", "window", "documents"), [(False, 5, 0), (True, 0, 4), (False, 0, 4), (False, 70, 2)]
)
def test_window_and_documents_equal_attention_under_a_mask_written_here(
    impl: str, causal: bool, window: int, documents: int
) -> None:
    if impl == "flex-eager" and not HAS_FLEX:
        pytest.skip(kernels.flex_missing())
    n = 256  # two flex tiles a side: skipped, partial and full tiles
    q, k, v = draws((1, 4, n, 16), (1, 2, n, 16), (1, 2, n, 16))
    keep = my_keep(n, causal, window, documents)
    expected = masked_reference(q, my_repeat(k, 4), my_repeat(v, 4), keep)
    c = tiny(heads=4, kv_heads=2, causal=causal, window=window, documents=documents)
    got = kernels.call(impl, q, k, v, causal, kernels.mask_for(impl, c, n, "cpu"))
    assert float((got - expected).abs().max()) < 1e-12


@pytest.mark.skipif(not HAS_FLEX, reason="this torch has no flex_attention")
@pytest.mark.parametrize(
    ("causal", "window", "documents"),
    [(True, 0, 0), (False, 1, 0), (False, 50, 0), (True, 128, 0), (False, 300, 2), (False, 0, 4),
     (True, 0, 2), (False, 40, 4)],
)  # fmt: skip
def test_the_block_mask_is_the_one_torch_builds_from_the_dense_mask(
    causal: bool, window: int, documents: int
) -> None:
    """torch's create_block_mask (which evaluates the mask at every pair) as the check."""
    from torch.nn.attention.flex_attention import create_block_mask

    def lookup(keep):
        return lambda b, h, i, j: keep[i, j]

    for n in (64, 384, 512):
        keep = my_keep(n, causal, window, documents)
        theirs = create_block_mask(lookup(keep), None, None, n, n, device="cpu")
        c = Config(causal=causal, window=window, documents=documents, min_n=64)
        mine = kernels.block_mask(c, n, "cpu")
        for count, index in (("kv_num_blocks", "kv_indices"),
                             ("full_kv_num_blocks", "full_kv_indices")):  # fmt: skip
            assert torch.equal(getattr(mine, count), getattr(theirs, count)), (n, count)
            for row, k in enumerate(getattr(theirs, count)[0, 0].tolist()):
                got = getattr(mine, index)[0, 0, row, :k].sort().values
                assert torch.equal(got, getattr(theirs, index)[0, 0, row, :k].sort().values)


def test_peak_memory_under_a_window_matches_the_prediction(fixed_gemm: float) -> None:
    """SDPA with the dense mask holds it once more as floats; eager flex three score
    matrices and a boolean one; naive its two. SDPA also takes per-thread scratch and,
    for a moment, the mask inverted (n² booleans): neither in the formula."""
    c = tiny(heads=4, kv_heads=2, window=32, min_n=512, max_n=1024)
    report = bench.run(Config(**(c.to_dict() | {"impls": ("naive", "sdpa", "flex-eager")})))
    for r in report.records:
        assert r.status == "ok", r.status
        predicted = my_predicted(r.impl, 1, 4, r.n, 16, F32, False, g=2, mask=True)
        assert r.predicted_bytes == predicted
        if r.impl == "sdpa":
            assert 0.95 * predicted <= r.peak_bytes <= predicted + r.n**2 + 512 * 1024, r.n
        else:
            assert r.peak_bytes == pytest.approx(predicted, rel=0.15), (r.impl, r.n)


def test_no_mask_gives_flex_no_block_mask_and_sdpa_no_dense_mask() -> None:
    plain = tiny()
    assert kernels.mask_for("flex", plain, 64, "cpu") is None
    assert kernels.mask_for("sdpa", tiny(causal=True), 64, "cpu") is None  # is_causal instead
    assert kernels.mask_for("naive", tiny(phase="decode"), 64, "cpu") is None


def test_a_gqa_sweep_is_complete_and_counts_g_heads(fixed_gemm: float) -> None:
    c = tiny(heads=4, kv_heads=1, min_n=256, max_n=512, impls=("naive", "sdpa", "math"))
    report = bench.run(c)
    assert report.notes[0].startswith("naive: K and V repeated from 1 to 4 heads")
    got = by_cell(report.records)
    for (impl, n), r in got.items():
        assert r.status == "ok", (impl, n, r.status)
        assert r.tflops == pytest.approx(my_flops(1, 4, n, 16, False, False) / r.time_ms / 1e9)
        assert r.predicted_bytes == my_predicted(impl, 1, 4, n, 16, F32, False, g=1)
        assert r.error is not None and 0 < r.error < 1e-5
    for n in (256, 512):
        naive = got["naive", n]  # the scores, the output and the repeated K and V
        assert naive.peak_bytes == pytest.approx(naive.predicted_bytes, rel=0.1)


def test_a_decode_sweep_reports_bandwidth(
    fixed_copy: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(devices, "gemm_tflops", lambda *a, **k: pytest.fail("GEMM measured"))
    c = tiny(heads=4, kv_heads=2, phase="decode", causal=True, min_n=256, max_n=1024)
    report = bench.run(c)
    assert report.copy_gbps == fixed_copy and report.gemm_tflops == 0.0
    assert cells(report.records) == [(i, n) for n in (256, 512, 1024) for i in ("naive", "sdpa")]
    for r in report.records:
        assert r.status == "ok", r.status
        seconds = r.time_ms / 1e3
        read = 2 * 1 * 2 * r.n * 16 * F32  # K and V: b·G·n·d float32 values each
        assert r.gbps == pytest.approx(read / seconds / 1e9, rel=1e-9)
        assert r.share_of_copy == pytest.approx(r.gbps / fixed_copy, rel=1e-9)
        assert r.tflops == pytest.approx(4 * 4 * r.n * 16 / seconds / 1e12, rel=1e-9)
        assert r.share_of_gemm is None and r.compile_ms is None
        assert r.predicted_bytes == my_predicted(r.impl, 1, 4, r.n, 16, F32, False, g=2, r=1)
        assert r.error is not None and 0 < r.error < 1e-5
    text = as_table(report)
    assert "copy bandwidth 12.5 GB/s" in text.splitlines()[0]
    assert text.splitlines()[1].split() == [
        "impl", "n", "time", "ms", "peak", "MiB", "predicted", "MiB", "GB/s", "of", "copy",
        "error", "status",
    ]  # fmt: skip


def test_copy_bandwidth_is_the_best_copy_counting_reads_and_writes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seconds = iter([0.004, 0.002, 0.003])
    copied: list[int] = []

    def timed(fn, device):
        fn()
        copied.append(1)
        return next(seconds)

    monkeypatch.setattr(devices, "timed", timed)
    size = 8 * 2**20
    assert devices.copy_gbps("cpu", repeats=3, size=size) == pytest.approx(2 * size / 0.002 / 1e9)
    assert len(copied) == 3
    monkeypatch.undo()
    assert devices.copy_gbps("cpu", repeats=1, size=2**20) > 0  # and a real one runs


def test_flex_in_the_decode_phase_is_unsupported_with_the_reason(fixed_copy: float) -> None:
    report = bench.run(tiny(phase="decode", impls=("flex", "sdpa"), min_n=64, max_n=64))
    flex, sdpa = report.records
    assert flex.status == "unsupported: the decode phase is timed for naive and SDPA"
    assert sdpa.status == "ok"


def test_a_torch_without_flex_is_unsupported_with_the_reason(
    fixed_gemm: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = "torch 2.4.1 has no torch.nn.attention.flex_attention (2.5 or later)"
    monkeypatch.setattr(kernels, "flex_missing", lambda: old)
    report = bench.run(tiny(impls=("flex", "flex-eager", "sdpa"), window=8))
    for r in report.records:
        if r.impl == "sdpa":
            assert r.status == "ok"
        else:
            assert r.status == f"unsupported: {old}"
            assert (r.time_ms, r.compile_ms, r.error) == (None, None, None)


@pytest.mark.parametrize(
    "error",
    [
        RuntimeError(
            "LoweringException: InvalidCxxCompiler: No working C++ compiler found in "
            "torch._inductor.config.cpp.cxx: (None, 'g++')\n  target: flex_attention"
        ),
        OSError("[Errno 2] No such file or directory: 'g++'"),
        __import__("subprocess").CalledProcessError(1, ["g++", "-shared"]),
    ],
    ids=["inductor", "no-file", "compiler-failed"],
)
@pytest.mark.parametrize("checked", [True, False], ids=["in-check", "in-sweep"])
def test_flex_that_cannot_compile_is_unsupported_and_the_sweep_goes_on(
    fixed_gemm: float, monkeypatch: pytest.MonkeyPatch, error: Exception, checked: bool
) -> None:
    real = kernels.flex_function

    def no_compiler(impl: str):
        if impl != "flex":
            return real(impl)

        def compiled(*args, **kw):
            raise error

        return compiled

    monkeypatch.setattr(kernels, "flex_function", no_compiler)
    if not checked:  # the float64 check skipped for memory: the sweep meets it first
        monkeypatch.setattr(bench, "reference_bytes", lambda c, impl, device: {"cpu": 2**62})
    report = bench.run(tiny(impls=("naive", "flex", "flex-eager"), window=8, max_n=256))
    got = by_cell(report.records)
    first = str(error).splitlines()[0]
    for n in (64, 128, 256):
        r = got["flex", n]
        assert r.status == f"unsupported: flex (torch.compile) on cpu: {first}"
        assert (r.time_ms, r.compile_ms, r.peak_bytes, r.tflops) == (None,) * 4
        assert got["naive", n].status == "ok" and got["flex-eager", n].status == "ok"


@pytest.mark.skipif(not HAS_FLEX, reason="this torch has no flex_attention")
def test_flex_with_backward_runs_or_is_unsupported_never_a_crash(fixed_gemm: float) -> None:
    """torch 2.13 refuses flex's backward pass on a CPU; the sweep says so and goes on."""
    report = bench.run(tiny(impls=("flex-eager", "naive"), backward=True, window=8, max_n=64))
    eager, naive = report.records
    assert naive.status == "ok"
    if eager.status != "ok":
        assert eager.status.startswith("unsupported: flex-eager on cpu: "), eager.status
        assert eager.time_ms is None


@pytest.mark.skipif(not HAS_FLEX, reason="this torch has no flex_attention")
def test_compiled_flex_sliding_window_equals_dense_masked_attention(fixed_gemm: float) -> None:
    """The one test that compiles (seconds on a CPU, with a C++ compiler); skipped with the
    sweep's reason where flex cannot compile."""
    c = tiny(impls=("flex",), heads=4, kv_heads=2, window=24, min_n=128, max_n=128)
    report = bench.run(c)
    (r,) = report.records
    if r.status.startswith("unsupported: "):
        pytest.skip(f"flex does not run here: {r.status}")
    assert r.status == "ok", r.status
    assert r.compile_ms is not None and r.compile_ms > 0 and r.time_ms > 0
    assert r.error is not None and 0 < r.error < 1e-5
    keep = my_keep(128, False, 24, 0)
    assert r.tflops == pytest.approx(4 * 4 * 16 * int(keep.sum()) / r.time_ms / 1e9, rel=1e-9)
    q, k, v = draws((1, 4, 128, 16), (1, 2, 128, 16), (1, 2, 128, 16), dtype=torch.float32)
    got = kernels.call("flex", q, k, v, False, kernels.mask_for("flex", c, 128, "cpu"))
    expected = masked_reference(q, my_repeat(k, 4), my_repeat(v, 4), keep)
    assert 0 < float((got.double() - expected).abs().max()) < 1e-5
    assert "flex: compile ms is the first call" in " ".join(report.notes)
    assert "compile ms" in as_table(report).splitlines()[1]


def hand_made_decode_report() -> Report:
    return Report(
        device={"type": "cuda", "torch": "2.13.0", "name": "Test GPU", "backends": ["flash"]},
        config=Config(
            device="cuda", dtype="bfloat16", heads=16, kv_heads=4, d_head=128, phase="decode"
        ).to_dict(),
        gemm_tflops=0.0,
        copy_gbps=4000.0,
        records=[
            Record(
                "sdpa",
                32768,
                "ok",
                time_ms=0.01,
                peak_bytes=4096,
                predicted_bytes=4160,
                tflops=26.8,
                error=0.0039,
                gbps=3355.4432,
                share_of_copy=0.8388608,
            ),
            Record("flex", 32768, "unsupported: the decode phase is timed for naive and SDPA"),
        ],
    )


def test_a_decode_report_in_every_format() -> None:
    report = hand_made_decode_report()
    assert as_table(report).splitlines() == [
        "Test GPU (cuda, torch 2.13.0); copy bandwidth 4000 GB/s (read + write)",
        "impl      n  time ms  peak MiB  predicted MiB  GB/s  of copy   error  status",
        "sdpa  32768     0.01       0.0            0.0  3355      84%  0.0039  ok",
        "flex  32768        –         –            0.0     –        –       –  "
        "unsupported: the decode phase is timed for naive and SDPA",
    ]
    rows = as_csv(report).splitlines()
    assert rows[1] == "sdpa,32768,ok,0.01,4096,4160,26.8,,0.0039,,3355.4432,0.8388608"
    d = json.loads(as_json(report))
    assert d["copy_gbps"] == 4000.0 and d["config"]["phase"] == "decode"
    assert d["records"][0]["gbps"] == 3355.4432
    assert Report.from_dict(d) == report
