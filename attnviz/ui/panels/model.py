"""Model dock: where an imported layer came from, the layer stepper, and "vs model".

After any edit it shows how far each head's attention weights have moved from the
model's own (the largest change in each query row, per head), and the shown head's
change cell by cell; unedited, these are the agreement itself (rounding, ≤ 1e-12).
"""

from __future__ import annotations

import html

import numpy as np
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QHBoxLayout, QLabel, QPushButton, QVBoxLayout, QWidget

from attnviz.core.figures import colors
from attnviz.core.figures.figure import HeatmapSpec
from attnviz.core.layers import spans
from attnviz.core.maths.results import Result
from attnviz.core.provenance import Provenance, VsModel, vs_model
from attnviz.ui.heatmap import HeatmapView
from attnviz.ui.panels.common import LayerImports, ResultPanel
from attnviz.ui.workspace import Workspace

ROUNDING = 1e-12  # what float64 rounding leaves between attnviz and the model
NOT_IMPORTED = (
    "<p>This scenario was not imported from a model.</p><p><b>File → Import Model "
    "Layer…</b> (Ctrl+Shift+I) brings in one attention layer of BERT, RoBERTa, "
    "DistilBERT, MiniLM, GPT-2, Llama, Mistral, Qwen2 or Qwen3, run on your own text; "
    "this dock then compares every edit with the model itself.</p>"
)


class ModelPanel(ResultPanel):
    """Provenance, previous/next layer, and the distance from the model after edits."""

    def __init__(self, ws: Workspace, imports: LayerImports, parent: QWidget | None = None):
        super().__init__(ws, parent)
        self.imports = imports
        self.about = QLabel(NOT_IMPORTED)
        self.about.setWordWrap(True)
        self.about.setTextFormat(Qt.TextFormat.RichText)
        self.about.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.previous = QPushButton("◀")
        self.next = QPushButton("▶")
        for button in (self.previous, self.next):
            button.setFixedWidth(36)
        self.previous.setToolTip("Import the previous layer, same model and text (Ctrl+Alt+[)")
        self.next.setToolTip("Import the next layer, same model and text (Ctrl+Alt+])")
        self.previous.clicked.connect(lambda: imports.step(-1))
        self.next.clicked.connect(lambda: imports.step(+1))
        self.where = QLabel()
        self.where.setWordWrap(True)
        self.where.setAlignment(Qt.AlignmentFlag.AlignCenter)
        stepper = QHBoxLayout()
        stepper.addWidget(self.previous)
        stepper.addWidget(self.where, 1, Qt.AlignmentFlag.AlignCenter)
        stepper.addWidget(self.next)
        self.precision = QLabel()
        self.precision.setWordWrap(True)
        self.precision.setTextFormat(Qt.TextFormat.RichText)
        self.verdict = QLabel()
        self.verdict.setWordWrap(True)
        self.verdict.setTextFormat(Qt.TextFormat.RichText)
        self.rows = HeatmapView("vs-model rows")
        self.rows.setMinimumHeight(170)
        self.cells = HeatmapView("vs-model cells")
        self.cells.setMinimumHeight(220)
        self.cells.square_cells = True
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addWidget(self.about)
        layout.addLayout(stepper)
        layout.addWidget(self.precision)
        layout.addWidget(self.verdict)
        layout.addWidget(self.rows)
        layout.addWidget(self.cells)
        layout.addStretch(1)
        self.last: VsModel | str | None = None
        ws.doc.scenarioChanged.connect(self._show_provenance)
        imports.overviewChanged.connect(self._show_provenance)
        ws.view_state.headChanged.connect(lambda _: self.redraw())
        self._show_provenance()

    def _show_provenance(self) -> None:
        p = self.doc.scenario.provenance
        imported = p is not None
        widgets = (self.previous, self.next, self.where, self.verdict, self.rows, self.cells)
        for widget in (*widgets, self.precision):
            widget.setVisible(imported)
        if p is None:
            self.about.setText(NOT_IMPORTED)
            return
        self.about.setText(describe(p))
        self.about.setToolTip("\n".join(f"{name}: SHA-256 {digest}" for name, digest in p.files))
        stack = self.imports.held()
        self.previous.setEnabled(self.imports.neighbour(-1) is not None)
        self.next.setEnabled(self.imports.neighbour(+1) is not None)
        self.precision.setVisible(stack is not None and bool(stack.native))
        if stack is None:
            self.where.setText(f"layer {p.layer} (of 0 to {p.layers - 1})")
            for button, which, keys in self._buttons():
                button.setToolTip(f"Import the {which} layer, same model and text ({keys})")
            return
        held = spans(stack.stored)
        self.where.setText(f"layer {p.layer} (of 0 to {p.layers - 1})\nheld: {held}")
        for button, which, keys in self._buttons():
            button.setToolTip(f"Show the {which} held layer ({held}), no model run ({keys})")
        if stack.native and p.layer in stack.stored:
            gap = stack.native_gap(stack.index(p.layer))
            self.precision.setText(
                f"In its own precision (<b>{stack.native}</b>) the model's attention weights "
                f"differ from this float64 layer by up to <b>{gap:.2g}</b> (kept in the file)."
            )

    def _buttons(self) -> tuple[tuple[QPushButton, str, str], ...]:
        return (self.previous, "previous", "Ctrl+Alt+["), (self.next, "next", "Ctrl+Alt+]")

    def show_result(self, result: Result) -> None:
        p = self.doc.scenario.provenance
        if p is None:
            self.last = None
            return
        weights = result.weights if result.settings.projections else np.empty((0, 0, 0))
        self.last = vs = vs_model(p, weights, result.final)
        if isinstance(vs, str):
            self.verdict.setText(f'<span style="color:#b35806">{html.escape(vs)}</span>')
            self.rows.setVisible(False)
            self.cells.setVisible(False)
            return
        self.rows.setVisible(True)
        self.cells.setVisible(True)
        self.verdict.setText(verdict(vs))
        s = self.doc.scenario
        heads = tuple(f"head {h + 1}" for h in range(p.heads))
        top = max(float(vs.per_row.max(initial=0.0)), ROUNDING)
        self.rows.set_spec(
            HeatmapSpec(
                "max |Δ weight| in each query row (attnviz now vs the model)",
                vs.per_row,
                heads,
                s.tokens,
                "head",
                "query",
                "sequential",
                (0.0, colors.nice_ceiling(top)),
                caption="max |Δ weight| per row",
            )
        )
        h = min(self.view_state.head, p.heads - 1)
        delta = weights[h] - p.model_weights[h]
        edge = colors.nice_ceiling(max(float(np.abs(delta).max(initial=0.0)), ROUNDING))
        self.cells.set_spec(
            HeatmapSpec(
                f"Δ weights, head {h + 1}: attnviz now − the model",
                delta,
                s.tokens,
                s.key_tokens,
                "query",
                "key",
                "diverging",
                (-edge, edge),
                caption=f"head {h + 1}: Δ weights",
            )
        )


def describe(p: Provenance) -> str:
    """The provenance as a few lines of rich text."""
    files = "".join(
        f"<br>{html.escape(name)}:<br><code>{digest[:24]}…</code>" for name, digest in p.files
    )
    ids = ", ".join(map(str, p.token_ids[:24])) + (" …" if len(p.token_ids) > 24 else "")
    return (
        f"<b>{html.escape(p.source)}</b> ({p.kind}, {html.escape(p.model_type)}), "
        f"layer {p.layer} of {p.layers}<br>"
        f"Text: “{html.escape(p.text[:200])}”<br>"
        f"Token ids: {ids}<br>"
        f"Weights (SHA-256):{files or ' none recorded'}"
    )


def verdict(vs: VsModel) -> str:
    """One line on how far the layer is from the model."""
    if not np.isfinite(vs.output):
        return (
            '<span style="color:#b35806"><b>Moved from the model</b></span>: the attention '
            "output has another shape now (d_model changed), so it cannot be compared; the "
            f"weights are within {vs.weights:.3g} of the model's."
        )
    moved = max(vs.weights, vs.output)
    if moved <= ROUNDING:
        return (
            '<span style="color:#1a7f37"><b>Matches the model</b></span>: largest difference '
            f"{vs.weights:.1e} in the weights, {vs.output:.1e} in the output (rounding)."
        )
    worst = int(np.argmax(vs.per_head))
    return (
        '<span style="color:#b35806"><b>Moved from the model</b></span>: weights by up to '
        f"{vs.weights:.3g} (most in head {worst + 1}), the attention output by "
        f"{vs.output:.3g}. Undo (Ctrl+Z) returns to the model's numbers."
    )
