"""Variants dock: what current models change, as settings a learner can switch and edit.

The causal alignment, RoPE's base, pairing and width, ALiBi's slopes, T5's relative
position bias (its buckets, largest distance and direction; its learned table, buckets ×
heads, comes from an imported model or a file and is not edited here), the scale,
QK-norm, the soft-cap, sinks, and a custom mask drawn by clicking cells (with ready-made
shapes). The positional encoding and the mask themselves are on the toolbar.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QComboBox,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from attnviz.core.io.text import parse_number
from attnviz.core.maths.mask_shapes import SHAPES, mask_shape
from attnviz.core.maths.scenario import ALIGNMENTS, LIMITS, QK_NORMS, ROPE_STYLES
from attnviz.core.maths.variants import RELATIVE_BUCKETS_MOST, RELATIVE_DISTANCE_MOST
from attnviz.ui.grid import MatrixGrid
from attnviz.ui.matrix_model import MatrixModel
from attnviz.ui.panels.common import int_spin, set_quietly
from attnviz.ui.workspace import Workspace

DIRECTIONS = {"bidirectional (encoder)": True, "unidirectional (decoder)": False}

QK_NORM_TIPS = (  # one per QK_NORMS choice
    "no QK-norm",
    "per head: each head's Q and K over its own d_k features (Qwen3)",
    "whole projection: one RMS per token over every head's features together (OLMo 2)",
)


def numbers(text: str) -> tuple[float, ...]:
    """Numbers separated by commas or spaces ("0.5, -1 2")."""
    return tuple(parse_number(part) for part in text.replace(",", " ").split())


def shown(values: tuple[float, ...] | None) -> str:
    return "" if values is None else ", ".join(f"{v:g}" for v in values)


class VariantsPanel(QWidget):
    message = Signal(str)

    def __init__(self, ws: Workspace, parent: QWidget | None = None):
        super().__init__(parent)
        self.doc = ws.doc
        self._syncs: list[Callable[[], None]] = []
        self.mask_grid: MatrixGrid | None = None

        positions = QGroupBox("Positions")
        form = QFormLayout(positions)
        self.alignment = self._combo(form, "Causal alignment", ALIGNMENTS, "causal_alignment")
        self.alignment.setToolTip(
            "With fewer queries than keys (cross-attention, a decode step over a cache): "
            "top-left lines query 1 up with key 1, bottom-right the last query with the last key"
        )
        self.rope_base = self._number(form, "RoPE base", "rope_base", optional=False)
        self.rope_style = self._combo(form, "RoPE pairs", ROPE_STYLES, "rope_style")
        self.rope_style.setToolTip(
            "half: feature i turns with i + r/2 (GPT-NeoX, Llama); "
            "interleaved: 2i with 2i + 1 (GPT-J)"
        )
        self.rope_dims = int_spin(0, LIMITS.d_k, "How many leading features RoPE turns (0: all)")
        self.rope_dims.valueChanged.connect(
            lambda r: self.set_setting(rope_dims=None if r == 0 else r)
        )
        form.addRow("RoPE dims (0: all)", self.rope_dims)
        self._syncs.append(
            lambda: set_quietly(self.rope_dims, self.doc.scenario.settings.rope_dims or 0)
        )
        self._scaled_rope(form)
        self.alibi = self._list(form, "ALiBi slopes", "alibi_slopes", "empty: the paper's slopes")
        self._relative(form)

        scores = QGroupBox("Scores and softmax")
        form2 = QFormLayout(scores)
        self.scale_value = self._number(form2, "Scale (empty: 1/√d_k)", "scale_value")
        self.qk_norm = self._combo(form2, "QK-norm", QK_NORMS, "qk_norm")
        self.qk_norm.setToolTip(
            "rms: each head's Q and K RMS-normalised over its d_k (Qwen3, Gemma 3); "
            "rms-whole: a token's Q (K) of every head normalised together, one RMS over "
            "all heads' features (OLMo 2); both times their norm weights, which appear "
            "under W_Q and W_K"
        )
        for i, tip in enumerate(QK_NORM_TIPS):
            self.qk_norm.setItemData(i, tip, Qt.ItemDataRole.ToolTipRole)
        self.eps = self._number(form2, "QK-norm eps", "qk_norm_eps", optional=False)
        self.softcap = self._number(form2, "Soft-cap (empty: off)", "softcap")
        self.sinks = self._list(form2, "Sinks, one per head", "sinks", "empty: no sink")

        self.mask_box = QGroupBox("Custom mask: click a cell to let its query see its key")
        mask_layout = QVBoxLayout(self.mask_box)
        shapes = QHBoxLayout()
        self.use_custom = QPushButton("Use a custom mask")
        self.use_custom.clicked.connect(lambda: self.set_setting(mask="custom"))
        shapes.addWidget(self.use_custom)
        self.shape = QComboBox()
        self.shape.addItems(list(SHAPES))
        shapes.addWidget(self.shape)
        self.shape_size = int_spin(1, LIMITS.tokens, "Prefix length, document length or window")
        self.shape_size.setValue(2)
        self.shape_size.setPrefix("size ")
        shapes.addWidget(self.shape_size)
        fill = QPushButton("Fill")
        fill.setToolTip("Replace the custom mask with this shape")
        fill.clicked.connect(self.fill_mask)
        shapes.addWidget(fill)
        shapes.addStretch(1)
        mask_layout.addLayout(shapes)

        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addWidget(positions)
        layout.addWidget(scores)
        layout.addWidget(self.mask_box, 1)
        ws.doc.scenarioChanged.connect(self.sync)
        self.sync()

    # Controls -----------------------------------------------------------------------------

    def _combo(self, form: QFormLayout, label: str, items: tuple[str, ...], name: str) -> QComboBox:
        box = QComboBox()
        box.addItems(list(items))
        box.textActivated.connect(lambda v: self.set_setting(**{name: v}))
        form.addRow(label, box)
        self._syncs.append(lambda: box.setCurrentText(getattr(self.doc.scenario.settings, name)))
        return box

    def _scaled_rope(self, form: QFormLayout) -> None:
        """A model's own RoPE frequencies (scaled RoPE), shown with a way back to the
        base's; they come from an imported layer, not from typing."""
        self.rope_scaled = QLabel()
        self.rope_scaled.setWordWrap(True)
        self.rope_unscale = QPushButton("Use the base's")
        self.rope_unscale.setToolTip("Forget the model's frequencies and factor: base^(−2i/r)")
        self.rope_unscale.clicked.connect(
            lambda: self.set_setting(rope_frequencies=None, rope_factor=1.0)
        )
        row = QHBoxLayout()
        row.addWidget(self.rope_scaled, 1)
        row.addWidget(self.rope_unscale)
        form.addRow("RoPE frequencies", row)

        def sync() -> None:
            st = self.doc.scenario.settings
            own = st.rope_frequencies is not None or st.rope_factor != 1.0
            pairs = "the base's" if st.rope_frequencies is None else (
                f"the model's own, {len(st.rope_frequencies)} pairs "
                f"({min(st.rope_frequencies):.3g} to {max(st.rope_frequencies):.3g} rad/position)"
            )  # fmt: skip
            factor = "" if st.rope_factor == 1.0 else f"; cos and sin × {st.rope_factor:.6g}"
            self.rope_scaled.setText(pairs + factor)
            self.rope_unscale.setEnabled(own)

        self._syncs.append(sync)

    def _relative(self, form: QFormLayout) -> None:
        """T5's relative position bias: how relative positions j − i fall into buckets
        (the table's rows), and what the table holds."""
        self.relative_buckets = int_spin(
            2, RELATIVE_BUCKETS_MOST, "T5's relative_attention_num_buckets: the rows of the table"
        )
        self.relative_buckets.valueChanged.connect(lambda b: self.set_setting(relative_buckets=b))
        form.addRow("Relative buckets (T5)", self.relative_buckets)
        self.relative_distance = int_spin(
            2,
            RELATIVE_DISTANCE_MOST,
            "T5's relative_attention_max_distance: from it on, every distance is the last bucket",
        )
        self.relative_distance.valueChanged.connect(
            lambda d: self.set_setting(relative_max_distance=d)
        )
        form.addRow("Relative max distance", self.relative_distance)
        self.relative_direction = QComboBox()
        self.relative_direction.addItems(list(DIRECTIONS))
        self.relative_direction.setToolTip(
            "bidirectional (an encoder): keys after the query have buckets of their own; "
            "unidirectional (a decoder): only keys at or before the query count"
        )
        self.relative_direction.textActivated.connect(
            lambda v: self.set_setting(relative_bidirectional=DIRECTIONS[v])
        )
        form.addRow("Relative direction", self.relative_direction)
        self.relative_table = QLabel()
        self.relative_table.setWordWrap(True)
        form.addRow("Relative table", self.relative_table)

        def sync() -> None:
            s = self.doc.scenario
            st = s.settings
            set_quietly(self.relative_buckets, st.relative_buckets)
            set_quietly(self.relative_distance, st.relative_max_distance)
            side = next(k for k, v in DIRECTIONS.items() if v == st.relative_bidirectional)
            self.relative_direction.setCurrentText(side)
            table = s.relative_bias
            self.relative_table.setText(
                "none (choose the relative-bias position encoding)"
                if table is None
                else f"{table.shape[0]} buckets × {table.shape[1]} heads, "
                f"{np.abs(table).max():.3g} at most (an imported model's, or zeros)"
            )

        self._syncs.append(sync)

    def _number(self, form: QFormLayout, label: str, name: str, optional: bool = True) -> QLineEdit:
        edit = QLineEdit()
        edit.setObjectName(f"edit-{name}")

        def commit() -> None:
            text = edit.text().strip()
            try:
                value = None if optional and not text else parse_number(text)
            except ValueError as e:
                self.message.emit(f"{label}: {e}; nothing was changed")
                self._sync_edits()
                return
            self.set_setting(**{name: value})

        edit.editingFinished.connect(commit)
        form.addRow(label, edit)

        def sync() -> None:
            value = getattr(self.doc.scenario.settings, name)
            edit.setText("" if value is None else f"{value:g}")

        self._syncs.append(sync)
        return edit

    def _list(self, form: QFormLayout, label: str, name: str, empty: str) -> QLineEdit:
        edit = QLineEdit()
        edit.setObjectName(f"edit-{name}")
        edit.setPlaceholderText(empty)

        def commit() -> None:
            try:
                values = numbers(edit.text())
            except ValueError as e:
                self.message.emit(f"{label}: {e}; nothing was changed")
                self._sync_edits()
                return
            self.set_setting(**{name: values or None})

        edit.editingFinished.connect(commit)
        form.addRow(label, edit)
        self._syncs.append(lambda: edit.setText(shown(getattr(self.doc.scenario.settings, name))))
        return edit

    def _sync_edits(self) -> None:
        for sync in self._syncs:
            sync()

    # Document ----------------------------------------------------------------------------

    def set_setting(self, **change: object) -> None:
        s = self.doc.scenario
        if all(getattr(s.settings, k) == v for k, v in change.items()):
            return
        (name, value), *_ = change.items()
        refusal = self.doc.change(lambda s: s.with_settings(**change), f"Set {name} to {value}")
        self.message.emit(refusal)
        if refusal:
            self._sync_edits()

    def fill_mask(self) -> None:
        s = self.doc.scenario
        try:
            values = mask_shape(
                self.shape.currentText(),
                s.n,
                s.m,
                self.shape_size.value(),
                s.settings.causal_alignment,
            )
        except ValueError as e:
            self.message.emit(str(e))
            return
        if s.settings.mask != "custom":
            self.set_setting(mask="custom")
        model = self.mask_grid.matrix_model() if self.mask_grid is not None else None
        if model is not None:
            model.set_block(0, 0, values, f"Custom mask: {self.shape.currentText()}")

    def _toggle(self, row: int, col: int) -> None:
        if self.mask_grid is None:
            return
        model = self.mask_grid.matrix_model()
        value = float(model.matrix()[row, col])
        model.set_block(row, col, np.array([[1.0 - value]]), "Toggle a mask cell")

    def sync(self) -> None:
        self._sync_edits()
        s = self.doc.scenario
        custom = s.settings.mask == "custom"
        self.use_custom.setVisible(not custom)
        if custom and self.mask_grid is None:
            grid = MatrixGrid(MatrixModel(self.doc, "mask_matrix"))
            grid.setObjectName("grid-mask_matrix")
            grid.set_column_width(36)
            grid.setEditTriggers(MatrixGrid.EditTrigger.NoEditTriggers)
            grid.clicked.connect(lambda index: self._toggle(index.row(), index.column()))
            grid.message.connect(self.message)
            layout = self.mask_box.layout()
            assert layout is not None
            layout.addWidget(grid)
            self.mask_grid = grid
        elif not custom and self.mask_grid is not None:
            self.mask_grid.hide()  # now: a paint queued for it must not read the gone mask
            self.mask_grid.setParent(None)
            self.mask_grid.model().deleteLater()
            self.mask_grid.deleteLater()
            self.mask_grid = None
