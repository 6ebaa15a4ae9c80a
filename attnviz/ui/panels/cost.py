"""Cost dock: scores, score memory, FLOPs and KV cache, now and at a what-if length; what
sharing keys and values (GQA, MQA) and a sliding window save, here and in real models."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QVBoxLayout,
    QWidget,
)

from attnviz.core.maths.cost import (
    REAL_MODELS,
    Cost,
    KVShape,
    human_bytes,
    human_count,
    sharing_options,
)
from attnviz.ui.panels.common import int_spin
from attnviz.ui.workspace import Workspace

MAX_WHAT_IF = 10_000_000


def describe(c: Cost) -> list[tuple[str, str]]:
    """(label, value) lines for one cost, in words and exact numbers."""
    return [
        ("scores per head (n²)", f"{human_count(c.scores_per_head)} ({c.scores_per_head:,})"),
        ("scores, all heads", f"{human_count(c.scores)} ({c.scores:,})"),
        (
            "score memory",
            "\n".join(f"{human_bytes(c.score_bytes(t))} {t}" for t in ("float32", "float16")),
        ),
        (
            "attention FLOPs",
            f"{human_count(c.flops)} ({c.flops:,})" + (" (causal: half)" if c.causal else ""),
        ),
        (
            "KV cache per layer",
            f"{human_count(c.kv_cache_numbers)} numbers · "
            f"{human_bytes(c.kv_cache_bytes('float16'))} float16",
        ),
        traffic_line(c),
    ]


def traffic_line(c: Cost) -> tuple[str, str]:
    """Slow-memory traffic of one head: dense against FlashAttention's tiles."""
    moved, b_r, b_c = c.traffic()
    return (
        "memory traffic per head",
        f"dense {human_count(moved.dense)} numbers · tiled {human_count(moved.tiled)} "
        f"({moved.dense / moved.tiled:,.1f}× less; tiles {b_r} × {b_c} in 192 KiB)",
    )


def kv_lines(
    shapes: list[KVShape] | tuple[KVShape, ...], n: int, names: bool
) -> list[tuple[str, str]]:
    """(label, value) per KV-cache shape: bytes per token and the cache after n tokens,
    in bfloat16."""
    lines = []
    for k in shapes:
        heads = f"{k.kv_heads} K/V head{'s' * (k.kv_heads != 1)}"
        label = f"{k.name} ({k.kind})" if names else f"{k.kind}: {heads}"
        capped = (
            f" (window: last {k.window:,} kept)" if k.window is not None and n > k.window else ""
        )
        lines.append(
            (
                label,
                f"{human_bytes(k.bytes_per_token())} per token · "
                f"{human_bytes(k.cache_bytes(n))} for {n:,} tokens{capped}",
            )
        )
    return lines


class CostPanel(QWidget):
    def __init__(self, ws: Workspace, parent: QWidget | None = None):
        super().__init__(parent)
        self.doc, self.view_state, self.compute = ws.doc, ws.view_state, ws.compute
        self.now_box, self.now_form = self._group("This scenario")
        self.what_box, self.what_form = self._group("What if")
        self.share_box, self.share_form = self._group("KV cache, K and V shared")
        self.models_box, self.models_form = self._group("KV cache, real models")
        self.length = int_spin(
            1,
            MAX_WHAT_IF,
            "A sequence length to price, e.g. 131072 (128k tokens)",
            value=131072,
            separators=True,
            commit_only=False,
        )
        self.length.valueChanged.connect(lambda _: self.refresh())
        row = QHBoxLayout()
        row.addWidget(QLabel("sequence length n ="))
        row.addWidget(self.length)
        row.addStretch(1)
        note = QLabel(
            "Dense attention stores every n × n score matrix: time and memory grow as n². "
            "Fused kernels (FlashAttention) never store it — memory grows as n — but do the "
            "same quadratic arithmetic. FLOPs follow FlashAttention's convention: 4·n²·d_k "
            "per head (Q Kᵀ and weights · V), half under a causal mask. The KV cache keeps K and V "
            "of every past token: sharing them across a group of query heads (GQA; MQA when "
            "all share one) divides it by the group size; a sliding window keeps the last W "
            "tokens only. Real models: all layers, bfloat16."
        )
        note.setWordWrap(True)
        layout = QVBoxLayout(self)
        layout.addWidget(self.now_box)
        layout.addLayout(row)
        layout.addWidget(self.what_box)
        layout.addWidget(self.share_box)
        layout.addWidget(self.models_box)
        layout.addWidget(note)
        layout.addStretch(1)
        ws.doc.scenarioChanged.connect(self.refresh)
        self.refresh()

    @staticmethod
    def _group(title: str) -> tuple[QGroupBox, QFormLayout]:
        box = QGroupBox(title)
        form = QFormLayout(box)
        form.setRowWrapPolicy(QFormLayout.RowWrapPolicy.WrapLongRows)
        return box, form

    @staticmethod
    def _fill(form: QFormLayout, lines: list[tuple[str, str]]) -> None:
        while form.rowCount():
            form.removeRow(0)
        for label, value in lines:
            text = QLabel(value)
            text.setObjectName(label)
            text.setWordWrap(True)
            # Wrapped between words only, and never narrower than its widest word (a long
            # number): the form puts it under its label rather than cut it.
            words = value.split() or [""]
            text.setMinimumWidth(max(text.fontMetrics().horizontalAdvance(w) for w in words) + 2)
            text.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
            form.addRow(label, text)

    def costs(self) -> tuple[Cost, Cost]:
        s = self.doc.scenario
        heads = s.n_heads if s.settings.projections else 1
        d_k = s.d_k if s.settings.projections else s.d_model
        causal = s.settings.mask == "causal"  # only −∞ lets a kernel skip the future keys
        window = s.settings.window if s.settings.mask == "sliding-window" else None
        kv = s.kv_heads if s.settings.projections else 1
        now = Cost(s.n, heads, d_k, causal, window, kv)
        return now, Cost(self.length.value(), heads, d_k, causal, window, kv)

    def refresh(self) -> None:
        now, what_if = self.costs()
        shared = f" ({now.kv_heads} K/V)" if now.kv_heads != now.heads else ""
        self.now_box.setTitle(f"Now: n = {now.n}, {now.heads}{shared} × d_k {now.d_k}")
        self.what_box.setTitle(f"What if n = {what_if.n:,}")
        self._fill(self.now_form, describe(now))
        self._fill(self.what_form, describe(what_if))
        shape = f"{now.heads} heads of {now.d_k}, one layer, bfloat16"
        options = sharing_options(now.heads, now.d_k)
        self._fill(self.share_form, [("shape", shape), *kv_lines(options, what_if.n, False)])
        models = [("shape", "all layers, bfloat16"), *kv_lines(REAL_MODELS, what_if.n, True)]
        self._fill(self.models_form, models)
