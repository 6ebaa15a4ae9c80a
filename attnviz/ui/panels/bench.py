"""Timing dock: dense against fused attention over growing n, on CUDA or the CPU.

Prefill (n queries) or decode (one new query against a cache of n), grouped-query
shapes, a sliding window or documents, and flex_attention next to SDPA. The sweep runs
as ``attnviz bench`` in a child process, its flags written by attnviz.bench.config;
records arrive one by one and the plots and table grow as they do. Cancel stops it at
once. The table's columns and cells, the CSV and the plots come from attnviz.bench (as
the command writes them); the plots are titled from the report of the sweep shown,
whatever the form says now.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from PySide6.QtCore import QByteArray, QObject, QProcess, Qt, QTimer, Signal
from PySide6.QtGui import QColor, QPainter, QPaintEvent, QResizeEvent
from PySide6.QtSvg import QSvgRenderer
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QFileDialog,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QProgressBar,
    QPushButton,
    QSizePolicy,
    QStackedWidget,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from attnviz.bench.config import DTYPES, FLEX, IMPLEMENTATIONS, PHASES, Config, config_to_argv
from attnviz.bench.plots import report_charts
from attnviz.bench.report import (
    Record,
    Report,
    as_csv,
    share_note,
    table_cells,
    table_headings,
)
from attnviz.core.figures.chart import Chart, to_svg
from attnviz.core.maths.cost import human_bytes
from attnviz.ui.flow import ColumnsLayout, FlowLayout
from attnviz.ui.images import save_svg
from attnviz.ui.panels.common import int_spin

POWERS = [2**k for k in range(6, 18)]  # 64 … 131072
PLOTS = ("time", "memory", "tflops", "bandwidth")  # the last two: prefill's, decode's
FIELD_WIDTH = 110  # every field of the form: its pairs line up in columns as they wrap
CHART_MIN_WIDTH = 280  # narrower than twice this, the plots stack
SHARES = ("of GEMM", "of copy")  # the columns share_note explains


def _pair(label: QLabel, field: QWidget, label_width: int, field_width: int) -> QWidget:
    """A label and its field as one piece of the form, of a fixed size."""
    pair = QWidget()
    row = QHBoxLayout(pair)
    row.setContentsMargins(0, 0, 8, 0)
    label.setFixedWidth(label_width)
    field.setFixedWidth(field_width)
    row.addWidget(label)
    row.addWidget(field)
    pair.setSizePolicy(QSizePolicy.Policy.Fixed, QSizePolicy.Policy.Fixed)
    return pair


class ChartView(QWidget):
    """A core chart drawn from its SVG at the widget's size: exactly what Export writes."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.chart: Chart | None = None
        self.renderer = QSvgRenderer(self)
        self.setMinimumSize(220, 180)

    def set_chart(self, chart: Chart) -> None:
        self.chart = chart
        self._load()

    def _load(self) -> None:
        if self.chart is not None:
            svg = to_svg(self.chart, max(200, self.width()), max(160, self.height()))
            self.renderer.load(QByteArray(svg.encode("utf-8")))
            self.update()

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        self._load()

    def paintEvent(self, event: QPaintEvent) -> None:
        painter = QPainter(self)
        painter.fillRect(self.rect(), QColor("white"))
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        self.renderer.render(painter)
        painter.end()


class Sweep(QObject):
    """Runs one sweep as ``python -m attnviz bench --format jsonl`` in a child process.

    A process, not a thread: torch's profiler (the CPU memory measure) holds the
    interpreter lock for a long time, running out of memory cannot take the window
    down with it, and Cancel stops the sweep at once.

    ``report`` is the sweep's report from the start: its config is the one given here,
    records join it as they arrive, and the child's closing summary (device, ceiling,
    notes) fills in the rest. A cancelled sweep keeps what had arrived.
    """

    progress = Signal(int, int, str)
    record = Signal(object)  # Record, already in report.records
    finished = Signal(object)  # Report
    failed = Signal(str)

    def __init__(self, config: Config):
        super().__init__()
        self.config = config
        self.report = Report(device={}, config=config.to_dict(), gemm_tflops=0.0)
        self.cancelled = False
        self._buffer = b""
        self.process = QProcess(self)
        self.process.readyReadStandardOutput.connect(self._read)
        self.process.finished.connect(self._done)

    def arguments(self) -> list[str]:
        flags = ["--format", "jsonl", "--low-priority"]
        return ["-m", "attnviz", "bench", *config_to_argv(self.config), *flags]

    def start(self) -> None:
        self.process.start(sys.executable, self.arguments())

    def cancel(self) -> None:
        self.cancelled = True
        self.process.kill()

    def _read(self) -> None:
        self._buffer += bytes(self.process.readAllStandardOutput().data())
        *lines, self._buffer = self._buffer.split(b"\n")
        for line in lines:
            if not line.strip():
                continue
            message = json.loads(line)
            if "progress" in message:
                self.progress.emit(*message["progress"])
            elif "record" in message:
                record = Record(**message["record"])
                self._add(record)
            elif "report" in message:
                self.report = Report.from_dict(message["report"], records=self.report.records)

    def _add(self, record: Record) -> None:
        self.report.records.append(record)
        # the ceilings come with the summary at the end; records carry them from the start
        if not self.report.gemm_tflops and record.tflops and record.share_of_gemm:
            self.report.gemm_tflops = record.tflops / record.share_of_gemm
        if not self.report.copy_gbps and record.gbps and record.share_of_copy:
            self.report.copy_gbps = record.gbps / record.share_of_copy
        self.record.emit(record)

    def _done(self, code: int, _status: object) -> None:
        self._read()
        if self.cancelled or code == 0:
            self.report.cancelled = self.report.cancelled or self.cancelled
            self.finished.emit(self.report)
        else:
            error = bytes(self.process.readAllStandardError().data()).decode(errors="replace")
            last = [line for line in error.splitlines() if line.strip()][-1:] or [
                f"exit status {code}"
            ]
            self.failed.emit(f"the benchmark stopped: {last[0][-300:]}")


class BenchPanel(QWidget):
    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        import torch

        self.sweep: Sweep | None = None
        self.report: Report | None = None  # the sweep shown: running, finished or cancelled
        cuda = torch.cuda.is_available()

        self.device = QComboBox()
        self.device.addItems(["cuda", "cpu"] if cuda else ["cpu"])
        self.dtype = QComboBox()
        self.dtype.addItems(DTYPES)
        self.dtype.setCurrentText("bfloat16" if cuda else "float32")
        self.batch = int_spin(1, 64, value=1, commit_only=False)
        self.heads = int_spin(1, 128, value=16 if cuda else 12, commit_only=False)
        self.d_head = int_spin(8, 256, value=128 if cuda else 64, commit_only=False)
        self.repeats = int_spin(1, 50, value=5 if cuda else 3, commit_only=False)
        self.min_n, self.max_n = QComboBox(), QComboBox()
        for combo, value in ((self.min_n, 256), (self.max_n, 32768 if cuda else 4096)):
            combo.addItems([str(n) for n in POWERS])
            combo.setCurrentText(str(value))
        self.phase = QComboBox()
        self.phase.addItems(PHASES)
        self.phase.setToolTip("prefill: n queries at once; decode: one new query, n cached keys")
        self.kv_heads = int_spin(0, 128, "key/value heads shared by query heads (GQA)", 0, False)
        self.kv_heads.setSpecialValueText("= heads")
        self.sliding_window = int_spin(0, POWERS[-1], "a causal sliding window of W keys", 0, False)
        self.sliding_window.setSpecialValueText("none")
        self.documents = int_spin(0, 128, "equal documents that never see each other", 0, False)
        self.documents.setSpecialValueText("one")
        self.causal, self.backward = QCheckBox("causal"), QCheckBox("forward + backward")
        self.impls = {name: QCheckBox(name) for name in IMPLEMENTATIONS}
        for name, box in self.impls.items():
            box.setChecked(name in ("naive", "sdpa") or (cuda and name not in FLEX))
        self.impls["flex"].setToolTip("torch.compile(flex_attention) with a block mask")
        self.impls["flex-eager"].setToolTip("flex_attention without the compiler (unfused)")
        self.phase.currentTextChanged.connect(self._phase_changed)

        form = FlowLayout()
        cells = [
            ("device", self.device), ("dtype", self.dtype), ("batch", self.batch),
            ("heads", self.heads), ("KV heads", self.kv_heads), ("d_head", self.d_head),
            ("phase", self.phase), ("window", self.sliding_window), ("documents", self.documents),
            ("n from", self.min_n), ("to", self.max_n), ("repeats", self.repeats),
        ]  # fmt: skip
        labels = [QLabel(label) for label, _ in cells]
        label_width = max(label.sizeHint().width() for label in labels)
        for label, (_, widget) in zip(labels, cells, strict=True):
            form.addWidget(_pair(label, widget, label_width, FIELD_WIDTH))
        checks = FlowLayout()
        for box in (self.causal, self.backward, *self.impls.values()):
            checks.addWidget(box)

        # Run and Cancel share one place: Cancel comes where Run was pressed.
        self.run_button, self.cancel_button = QPushButton("Run"), QPushButton("Cancel")
        self.cancel_button.setEnabled(False)
        self.run_button.clicked.connect(self.run)
        self.cancel_button.clicked.connect(self.cancel)
        self._run_or_cancel = QStackedWidget()
        for button in (self.run_button, self.cancel_button):
            self._run_or_cancel.addWidget(button)
        self._run_or_cancel.setSizePolicy(QSizePolicy.Policy.Fixed, QSizePolicy.Policy.Fixed)
        export_csv, export_plots = QPushButton("Export CSV…"), QPushButton("Export plots…")
        export_csv.clicked.connect(self.export_csv)
        export_plots.clicked.connect(self.export_plots)
        self.progress = QProgressBar()
        self.progress.setMinimumWidth(60)
        buttons = QHBoxLayout()
        buttons.addWidget(self._run_or_cancel)
        buttons.addWidget(self.progress, 1)
        buttons.addWidget(export_csv)
        buttons.addWidget(export_plots)
        # Texts that wrap within the dock's width and never widen it (a long error, a
        # progress message, a device's name): their width hints are ignored.
        self.status, self.info, self.share_note = QLabel(), QLabel(), QLabel()
        for label in (self.status, self.info, self.share_note):
            label.setWordWrap(True)
            label.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.info.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.share_note.setStyleSheet("color: #555")

        self.plots = {key: ChartView() for key in PLOTS}
        plot_grid = ColumnsLayout(CHART_MIN_WIDTH, 0.7, 200, 280)
        for plot in self.plots.values():
            plot_grid.addWidget(plot)
        self.plots["bandwidth"].hide()
        self._redraw = QTimer(self)
        self._redraw.setSingleShot(True)
        self._redraw.setInterval(250)
        self._redraw.timeout.connect(self._draw)
        self.table = QTableWidget(0, 0)
        self.table.setMinimumHeight(160)
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self._set_headings(self.config().to_dict())
        self.table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)

        layout = QVBoxLayout(self)
        layout.addWidget(self.info)
        layout.addLayout(form)
        layout.addLayout(checks)
        layout.addLayout(buttons)
        layout.addWidget(self.status)
        layout.addLayout(plot_grid)
        layout.addWidget(self.share_note)
        layout.addWidget(self.table, 1)
        self._show_device()

    @property
    def records(self) -> list[Record]:
        """The records of the sweep shown, so far."""
        return self.report.records if self.report is not None else []

    # Running --------------------------------------------------------------------------

    def config(self) -> Config:
        """The form's settings (what the next Run will time)."""
        return Config(
            device=self.device.currentText(),
            dtype=self.dtype.currentText(),
            batch=self.batch.value(),
            heads=self.heads.value(),
            d_head=self.d_head.value(),
            causal=self.causal.isChecked(),
            backward=self.backward.isChecked(),
            min_n=int(self.min_n.currentText()),
            max_n=int(self.max_n.currentText()),
            impls=tuple(name for name, box in self.impls.items() if box.isChecked()),
            repeats=self.repeats.value(),
            phase=self.phase.currentText(),
            kv_heads=self.kv_heads.value(),
            window=self.sliding_window.value(),
            documents=self.documents.value(),
        )

    def _phase_changed(self, phase: str) -> None:
        """Decode times one forward row against the whole cache: no window, documents,
        backward pass or flex (the sweep would refuse them)."""
        prefill = phase == "prefill"
        for widget in (self.sliding_window, self.documents, self.backward, self.causal):
            widget.setEnabled(prefill)
        for name in FLEX:
            self.impls[name].setEnabled(prefill)
        if not prefill:
            self.sliding_window.setValue(0)
            self.documents.setValue(0)
            self.backward.setChecked(False)
            self.causal.setChecked(False)  # the new row sees the whole cache anyway
            for name in FLEX:
                self.impls[name].setChecked(False)

    def run(self) -> None:
        config = self.config()
        try:
            config.check()
        except ValueError as e:
            self._set_status(f"<span style='color:#b00'>{e}</span>")
            return
        self.sweep = Sweep(config)
        self.report = self.sweep.report
        self.table.setRowCount(0)
        self._set_headings(self.report.config)
        self._draw()
        self.sweep.progress.connect(self._progress)
        self.sweep.record.connect(self._record)
        self.sweep.finished.connect(self._finished)
        self.sweep.failed.connect(self._failed)
        self.run_button.setEnabled(False)
        self.cancel_button.setEnabled(True)
        self._run_or_cancel.setCurrentWidget(self.cancel_button)
        self._set_status("running…")
        self.sweep.start()

    def _set_status(self, text: str) -> None:
        self.status.setText(text)
        self.status.setToolTip(text)  # the whole of a long message

    def cancel(self) -> None:
        if self.sweep is not None:
            self.sweep.cancel()

    def _progress(self, step: int, total: int, message: str) -> None:
        self.progress.setRange(0, total)
        self.progress.setValue(step)
        self._set_status(message)

    def _record(self, record: Record) -> None:
        self._add_row(record)
        if not self._redraw.isActive():
            self._redraw.start()  # at most a few redraws a second, however fast records come

    def _finished(self, report: Report) -> None:
        self.report = report
        self.table.setRowCount(0)
        self._set_headings(report.config)
        for record in self.records:
            self._add_row(record)
        self._draw()
        self._idle("cancelled" if report.cancelled else f"done: {len(report.records)} records")

    def _failed(self, message: str) -> None:
        self._idle(f"<span style='color:#b00'>{message}</span>")

    def _idle(self, text: str) -> None:
        self.sweep = None
        self.run_button.setEnabled(True)
        self.cancel_button.setEnabled(False)
        self._run_or_cancel.setCurrentWidget(self.run_button)
        self._set_status(text)

    # Drawing ---------------------------------------------------------------------------

    def _show_device(self) -> None:
        from attnviz.bench.devices import describe_device, resolve_device

        d = describe_device(resolve_device(self.device.currentText()))
        backends = ", ".join(d["backends"]) or "none"
        name, memory = d.get("name", d["type"]), human_bytes(d["memory_bytes"])
        self.info.setText(
            f"<b>{name}</b> ({d['type']}) · memory {memory} · torch {d['torch']}"
            f" · SDPA backends here: {backends}"
        )

    def _set_headings(self, config: dict[str, Any]) -> None:
        """The columns ``attnviz bench`` prints for this sweep (decode: bandwidth)."""
        self.headings = table_headings(config)
        self.table.setColumnCount(len(self.headings))
        self.table.setHorizontalHeaderLabels(self.headings)
        self._explain_share()

    def _explain_share(self) -> None:
        """Say under the plots, and in the share column's tooltips, what its percentages
        divide by (a measured GEMM, which a fused kernel can beat)."""
        report = self.report or Report(device={}, config=self.config().to_dict(), gemm_tflops=0)
        short, long = share_note(report)
        self.share_note.setText(short)
        for widget in (self.share_note, self.plots["tflops"], self.plots["bandwidth"]):
            widget.setToolTip(long)
        for col, heading in enumerate(self.headings):
            if heading in SHARES:
                item = self.table.horizontalHeaderItem(col)
                if item is not None:
                    item.setToolTip(long)
                for row in range(self.table.rowCount()):
                    if (cell := self.table.item(row, col)) is not None:
                        cell.setToolTip(long)

    def _add_row(self, r: Record) -> None:
        row = self.table.rowCount()
        self.table.insertRow(row)
        for col, text in enumerate(table_cells(r, self.headings)):  # as the command prints
            item = QTableWidgetItem(text)
            if self.headings[col] == "status":
                item.setToolTip(text)  # a reason can be long
            self.table.setItem(row, col, item)

    def _draw(self) -> None:
        self._explain_share()  # the reference's rate arrives with the first record
        if self.report is not None:
            charts = report_charts(self.report)
            for key, view in self.plots.items():
                if key in charts:
                    view.set_chart(charts[key])
                view.setVisible(key in charts)

    # Export -----------------------------------------------------------------------------

    def export_csv(self) -> None:
        from attnviz.core.io.files import atomic_write

        if self.report is None or not self.report.records:
            self._set_status("Run a sweep first.")
            return
        path, _ = QFileDialog.getSaveFileName(
            self, "Export records", "attention-timing.csv", "CSV (*.csv)"
        )
        if path:
            atomic_write(path, as_csv(self.report).encode("utf-8"))
            self._set_status(f"Wrote {Path(path).name}")

    def export_plots(self) -> None:
        if self.report is None or not self.report.records:
            self._set_status("Run a sweep first.")
            return
        folder = QFileDialog.getExistingDirectory(self, "Export the three plots (PNG and SVG) to")
        if folder:
            written = self.export_plots_to(Path(folder))
            self._set_status(f"Wrote {len(written)} files to {folder}")

    def export_plots_to(self, folder: Path) -> list[Path]:
        """The three plots of the sweep shown, as SVG and PNG, titled from its own config."""
        written: list[Path] = []
        if self.report is None:
            return written
        for key, chart in report_charts(self.report, detailed=True).items():
            svg = to_svg(chart)
            for suffix in (".svg", ".png"):
                path = folder / f"attention-{key}{suffix}"
                save_svg(svg, path)
                written.append(path)
        return written
