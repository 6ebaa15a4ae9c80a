"""The Timing dock runs a tiny sweep (in a child process) and draws its plots.

Its plots and exports are titled from the sweep that ran, not from the form as it is
now; it starts the child with every setting of its Config; its table shows the cells
that ``attnviz bench`` prints.
"""

import xml.etree.ElementTree as ET

import pytest
from PySide6.QtWidgets import QApplication, QWidget

pytest.importorskip("torch")


def cpu_panel(qtbot, min_n: str, max_n: str, impls: tuple[str, ...]):
    """A timing dock set up for a small float32 sweep on the CPU (not yet started)."""
    from attnviz.ui.panels.bench import BenchPanel

    panel = BenchPanel()
    qtbot.addWidget(panel)
    panel.show()
    panel.device.setCurrentText("cpu")
    panel.dtype.setCurrentText("float32")
    panel.heads.setValue(2)
    panel.d_head.setValue(16)
    panel.repeats.setValue(1)
    panel.min_n.setCurrentText(min_n)
    panel.max_n.setCurrentText(max_n)
    for name, box in panel.impls.items():
        box.setChecked(name in impls)
    return panel


def test_dock_runs_a_tiny_sweep_and_draws(qtbot, tmp_path):

    panel = cpu_panel(qtbot, "64", "128", ("naive", "sdpa", "efficient"))
    panel.run()
    assert not panel.run_button.isEnabled() and panel.cancel_button.isEnabled()
    qtbot.waitUntil(lambda: panel.sweep is None, timeout=60_000)
    assert panel.status.text().startswith("done"), panel.status.text()
    cells = {(r.impl, r.n): r for r in panel.records}
    assert set(cells) == {(i, n) for i in ("naive", "sdpa", "efficient") for n in (64, 128)}
    assert cells["naive", 128].status == "ok" and cells["naive", 128].time_ms > 0
    assert cells["efficient", 64].status.startswith("unsupported")
    # FLOPs by FlashAttention's convention, computed here: 4·b·h·n²·d.
    r = cells["sdpa", 128]
    assert r.tflops == pytest.approx(4 * 1 * 2 * 128**2 * 16 / (r.time_ms / 1e3) / 1e12)
    assert panel.table.rowCount() == 6
    # the table shows each record as ``attnviz bench`` prints it
    from attnviz.bench.report import table_cells

    shown = [
        [panel.table.item(row, col).text() for col in range(panel.table.columnCount())]
        for row in range(panel.table.rowCount())
    ]
    assert shown == [table_cells(r) for r in panel.records]
    # The plots are drawn from the charts the exports write.
    chart = panel.plots["time"].chart
    assert chart is not None and {s.label for s in chart.series} >= {"naive", "sdpa"}
    written = panel.export_plots_to(tmp_path)
    assert len(written) == 6 and all(p.stat().st_size > 0 for p in written)
    root = ET.parse(tmp_path / "attention-time.svg").getroot()
    assert root.tag.endswith("svg")


def test_cancel_stops_the_sweep(qtbot):
    from attnviz.ui.panels.bench import BenchPanel

    panel = BenchPanel()
    qtbot.addWidget(panel)
    panel.device.setCurrentText("cpu")
    panel.heads.setValue(2)
    panel.d_head.setValue(16)
    panel.min_n.setCurrentText("64")
    panel.max_n.setCurrentText("4096")
    panel.run()
    panel.cancel()
    qtbot.waitUntil(lambda: panel.sweep is None, timeout=30_000)
    assert panel.status.text() == "cancelled"
    assert panel.run_button.isEnabled()


def test_bad_settings_are_refused_in_the_dock(qtbot):
    from attnviz.ui.panels.bench import BenchPanel

    panel = BenchPanel()
    qtbot.addWidget(panel)
    panel.min_n.setCurrentText("4096")
    panel.max_n.setCurrentText("256")
    panel.run()
    assert panel.sweep is None and "min_n" in panel.status.text()


NS = "{http://www.w3.org/2000/svg}"


def test_a_cancelled_sweep_keeps_its_ceiling_and_every_point_visible(qtbot):
    from attnviz.core.figures.chart import to_svg

    panel = cpu_panel(qtbot, "256", "16384", ("naive", "sdpa"))
    panel.resize(720, 800)
    panel.run()
    qtbot.waitUntil(lambda: len(panel.records) >= 3, timeout=60_000)
    panel.cancel()
    qtbot.waitUntil(lambda: panel.sweep is None, timeout=30_000)
    assert panel.status.text() == "cancelled"
    done = [r for r in panel.records if r.status == "ok"]
    assert 3 <= len(done) < 14

    # The ceiling measured at the start is still drawn, as in a finished sweep.
    tflops = panel.plots["tflops"].chart
    ((label, ceiling),) = tflops.hlines
    assert label == "measured GEMM" and ceiling > 0
    assert not panel.plots["bandwidth"].isVisible()  # decode's plot
    for key in ("time", "memory", "tflops"):
        view = panel.plots[key]
        root = ET.fromstring(to_svg(view.chart, view.width(), view.height()))
        frame = root.find(f"{NS}rect[@fill='none']")
        top = float(frame.get("y"))
        groups = [g for g in root.iter(f"{NS}g") if g.get("class") == "series"]
        guides = [g for g in groups if g.find(f"{NS}polyline").get("stroke-dasharray")]
        data = [g for g in groups if g not in guides]
        markers = [c for g in data for c in g.iter(f"{NS}circle")]
        assert len(markers) == len(done), key  # every measured point is drawn
        # drawn after every guide element, so no guide hides one
        order = {el: k for k, el in enumerate(root.iter())}
        first = min(order[c] for c in markers)
        assert all(order[el] < first for g in guides for el in g.iter()), key
        assert bool(guides) == (key != "tflops")
        # the legend lies above the plotting area
        legend = root.find(".//*[@id='legend']")
        ys = [float(el.get(a)) for el in legend.iter() for a in ("y", "y1", "cy") if el.get(a)]
        assert ys and max(ys) < top, key


def svg_title(path) -> str:
    """The bold heading at the top of an exported plot."""
    root = ET.parse(path).getroot()
    (title,) = [t for t in root.iter(f"{NS}text") if t.get("font-weight") == "bold"]
    return title.text


def all_text(path) -> str:
    return " ".join(t.text or "" for t in ET.parse(path).getroot().iter())


def test_exported_plots_are_titled_from_the_sweep_that_ran(qtbot, tmp_path):
    """Change the form after a float32 sweep: the plots still say float32 and its shape."""
    panel = cpu_panel(qtbot, "64", "128", ("naive", "sdpa"))
    panel.run()
    qtbot.waitUntil(lambda: panel.sweep is None, timeout=60_000)
    assert panel.status.text().startswith("done"), panel.status.text()
    panel.dtype.setCurrentText("bfloat16")
    panel.heads.setValue(4)
    panel.d_head.setValue(32)
    panel.causal.setChecked(True)
    panel.backward.setChecked(True)

    written = panel.export_plots_to(tmp_path)
    assert sorted(p.name for p in written) == sorted(
        f"attention-{key}.{ext}" for key in ("time", "memory", "tflops") for ext in ("svg", "png")
    )
    what = "float32, batch 1, 2 heads of 16"
    for key, name in (("time", "Time"), ("memory", "Peak memory above inputs"),
                      ("tflops", "Throughput")):  # fmt: skip
        svg = tmp_path / f"attention-{key}.svg"
        assert svg_title(svg) == f"{name} ({what})", key
        text = all_text(svg)
        assert "bfloat16" not in text and "causal" not in text and "fwd+bwd" not in text, key
    # the plots in the dock too, redrawn after the change
    panel.resize(900, 700)
    panel._draw()
    assert [v.chart.title for v in panel.plots.values() if v.isVisible()] == [
        "Time", "Peak memory above inputs", "Throughput",
    ]  # fmt: skip
    # and the report remembers its config, not the form's
    from attnviz.bench.config import Config

    assert panel.report.sweep_config() == Config(
        device="cpu", dtype="float32", heads=2, d_head=16, min_n=64, max_n=128,
        impls=("naive", "sdpa"), repeats=1,
    )  # fmt: skip


def test_the_child_gets_every_setting_of_the_config():
    """The sweep's command line, read by ``attnviz bench``'s own parser: threads and warm-up
    included (they used to be dropped)."""
    from attnviz.bench.cli import build_parser
    from attnviz.bench.config import Config, config_from_namespace
    from attnviz.ui.panels.bench import Sweep

    config = Config(device="cpu", dtype="float16", batch=2, heads=3, d_head=24, causal=True,
                    backward=True, min_n=32, max_n=512, impls=("math", "naive"), repeats=4,
                    warmup=3, threads=2)  # fmt: skip
    args = Sweep(config).arguments()
    assert args[:3] == ["-m", "attnviz", "bench"]
    parsed = build_parser().parse_args(args[3:])
    assert (parsed.format, parsed.low_priority, parsed.out) == ("jsonl", True, None)
    assert config_from_namespace(parsed) == config


def test_decode_with_grouped_heads_plots_bandwidth_against_n(qtbot, tmp_path):
    """Phase decode, one KV head: the child runs that config, the table shows bandwidth
    and the third plot is GB/s against n with the copy bandwidth drawn."""
    from attnviz.bench.config import Config

    panel = cpu_panel(qtbot, "256", "1024", ("naive", "sdpa"))
    panel.resize(900, 700)
    panel.sliding_window.setValue(16)
    panel.impls["flex"].setChecked(True)
    panel.phase.setCurrentText("decode")
    # decode allows no window, documents, backward or flex: cleared and disabled
    assert panel.sliding_window.value() == 0 and not panel.sliding_window.isEnabled()
    assert not panel.impls["flex"].isChecked() and not panel.impls["flex"].isEnabled()
    panel.kv_heads.setValue(1)
    assert panel.config() == Config(
        device="cpu", dtype="float32", heads=2, kv_heads=1, d_head=16, min_n=256, max_n=1024,
        impls=("naive", "sdpa"), repeats=1, phase="decode",
    )  # fmt: skip
    panel.run()
    qtbot.waitUntil(lambda: panel.sweep is None, timeout=60_000)
    assert panel.status.text().startswith("done"), panel.status.text()
    assert panel.report.copy_gbps > 0
    headings = [
        panel.table.horizontalHeaderItem(c).text() for c in range(panel.table.columnCount())
    ]
    assert "GB/s" in headings and "of copy" in headings and "TFLOP/s" not in headings
    assert panel.table.rowCount() == 6
    for r in panel.records:
        assert r.status == "ok"
        read = 2 * 1 * r.n * 16 * 4  # K and V of the one KV head, float32
        assert r.gbps == pytest.approx(read / (r.time_ms / 1e3) / 1e9)
    column = headings.index("GB/s")
    shown = [panel.table.item(row, column).text() for row in range(6)]
    assert all(cell not in ("", "–") for cell in shown)

    assert panel.plots["bandwidth"].isVisible() and not panel.plots["tflops"].isVisible()
    chart = panel.plots["bandwidth"].chart
    assert {s.label for s in chart.series} == {"naive", "sdpa"}
    assert [s.xs for s in chart.series] == [(256, 512, 1024)] * 2
    ((label, value),) = chart.hlines
    assert label == "copy bandwidth" and value == panel.report.copy_gbps
    written = panel.export_plots_to(tmp_path)
    assert sorted(p.name for p in written) == sorted(
        f"attention-{k}.{e}" for k in ("time", "memory", "bandwidth") for e in ("svg", "png")
    )
    assert svg_title(tmp_path / "attention-bandwidth.svg") == (
        "Bandwidth (K and V read) (float32, batch 1, 2 heads of 16 (1 KV head), decode)"
    )
    # back to prefill: the window and flex can be set again
    panel.phase.setCurrentText("prefill")
    assert panel.sliding_window.isEnabled() and panel.impls["flex"].isEnabled()


def test_a_window_with_grouped_heads_and_eager_flex(qtbot):
    panel = cpu_panel(qtbot, "64", "128", ("naive", "sdpa", "flex-eager"))
    panel.kv_heads.setValue(1)
    panel.sliding_window.setValue(8)
    panel.documents.setValue(2)
    panel.run()
    qtbot.waitUntil(lambda: panel.sweep is None, timeout=60_000)
    assert panel.status.text().startswith("done"), panel.status.text()
    assert panel.table.rowCount() == 6
    for r in panel.records:
        assert r.status == "ok", (r.impl, r.status)
        # two documents of n / 2 tokens; a window of 8 in each: rows see 1, 2, …, 8 keys
        half = r.n // 2
        pairs = 2 * (half * 8 - 8 * 7 // 2)
        assert r.tflops == pytest.approx(4 * 2 * 16 * pairs / (r.time_ms / 1e3) / 1e12)
        assert r.error is not None and r.error < 1e-5
    assert panel.plots["tflops"].isVisible() and not panel.plots["bandwidth"].isVisible()
    assert panel.report.sweep_config().window == 8


def right_edges_outside(panel, area) -> list[str]:
    """The visible controls, buttons, texts and plots of the dock whose right edge lies
    beyond the scroll area's viewport (cut off, or only seen by scrolling sideways)."""
    from PySide6.QtCore import QPoint
    from PySide6.QtWidgets import QAbstractButton, QAbstractSpinBox, QComboBox, QLabel

    from attnviz.ui.panels.bench import ChartView

    kinds = (QAbstractButton, QAbstractSpinBox, QComboBox, QLabel, ChartView)
    outside = []
    width = area.viewport().width()
    for child in panel.findChildren(QWidget):
        if isinstance(child, kinds) and child.isVisibleTo(panel):
            right = child.mapTo(area.viewport(), QPoint(child.width(), 0)).x()
            if right > width:
                outside.append(f"{type(child).__name__} {getattr(child, 'text', str)()!r}")
    return outside


@pytest.mark.parametrize("width", [640, 760])
def test_the_dock_fits_its_column_before_during_and_after_a_run(qtbot, width):
    """In the middle column (640 px at 1280 × 720, 760 at 1440 × 900) every control,
    button, text and plot is within the width, before, while and after a sweep runs (a
    long progress message included), and Cancel comes where Run was."""
    from PySide6.QtWidgets import QScrollArea

    panel = cpu_panel(qtbot, "64", "128", ("naive", "sdpa"))
    area = QScrollArea()  # as the window's docks hold their panels
    area.setWidgetResizable(True)
    area.setWidget(panel)
    qtbot.addWidget(area)
    area.resize(width, 620)
    area.show()
    qtbot.waitExposed(area)

    def fits(when: str) -> None:
        QApplication.processEvents()
        assert area.horizontalScrollBar().maximum() == 0, when
        assert right_edges_outside(panel, area) == [], when

    fits("before")
    run_at = panel.run_button.mapTo(area, panel.run_button.rect().center())
    panel.run()
    fits("started")
    cancel_at = panel.cancel_button.mapTo(area, panel.cancel_button.rect().center())
    assert panel.cancel_button.isVisible() and cancel_at == run_at
    assert not panel.run_button.isVisible()
    seen = []
    panel.sweep.record.connect(lambda _: seen.append(area.horizontalScrollBar().maximum()))
    long = "checking flex against float64 " + "/very/long/path/to/a/kernel/cache" * 8
    panel.sweep.progress.emit(1, 9, long)  # as the child says it
    fits("a long progress message")
    qtbot.waitUntil(lambda: panel.sweep is None, timeout=60_000)
    assert panel.status.text().startswith("done"), panel.status.text()
    assert seen and set(seen) == {0}  # while records came in
    fits("after")
    assert panel.run_button.isVisible() and not panel.cancel_button.isVisible()
    # the three plots stack, two a row (three would be under 280 px each)
    tops = {panel.plots[k].y() for k in ("time", "memory", "tflops")}
    assert len(tops) == 2


def test_the_share_of_gemm_says_what_it_divides_by(qtbot):
    """sdpa can read 196 % "of GEMM": the dock says, beside the table and in the column's
    tooltip, that the GEMM is one plain square matrix multiply timed in this run (2048²
    on a CPU), not the hardware's peak, and why a fused kernel can exceed it."""
    panel = cpu_panel(qtbot, "64", "128", ("naive", "sdpa"))
    panel.resize(640, 900)
    panel.run()
    qtbot.waitUntil(lambda: panel.sweep is None, timeout=60_000)
    gemm = panel.report.gemm_tflops
    assert gemm > 0
    for r in panel.records:  # the share is the record's TFLOP/s over that one rate
        assert r.share_of_gemm == pytest.approx(r.tflops / gemm)
    note = panel.share_note
    assert note.isVisible() and note.width() <= panel.width()
    text = note.text()
    assert "of GEMM" in text and "2048 × 2048 float32" in text
    assert f"{gemm:.3g} TFLOP/s" in text and "not the hardware's peak" in text
    column = panel.headings.index("of GEMM")
    tip = panel.table.horizontalHeaderItem(column).toolTip()
    assert text in tip and "exceed" in tip and "4·d" in tip
    assert all(panel.table.item(row, column).toolTip() == tip for row in range(4))
    assert panel.plots["tflops"].chart.hlines[0][0] == "measured GEMM"
