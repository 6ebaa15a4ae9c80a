"""Pipeline dock: every intermediate of the selected head, as heatmaps in reading order."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QGridLayout, QLabel, QWidget

from attnviz.core.engine import HEAD_MATRICES, Result
from attnviz.core.figure import spec_for
from attnviz.ui.document import Document, Selection
from attnviz.ui.heatmap import HeatmapView

COLUMNS = 3


def legend(result: Result, head: int) -> str:
    """What the eight heatmaps show, in words, with this scenario's numbers."""
    st = result.settings
    n, d_k = len(result.tokens), result.d_k
    scale = f"divided by √d_k = √{d_k} = {result.scale_factor:.3g}" if st.scale else "not scaled"
    mask = {
        "none": "no mask",
        "causal": "causal mask: future keys set to −∞ (hatched grey), weight exactly 0",
        "causal-zero": "future keys set to 0, not −∞: they still get weight (the leak)",
        "drop-after-softmax": "future weights zeroed after softmax: rows sum to less than 1",
    }[st.mask]
    projections = "Q = X W_Q, K = X W_K, V = X W_V" if st.projections else "Q = K = V = X"
    return (
        f"<b>Head {head + 1} of {result.n_heads}</b><br>"
        f"{n} tokens, d_k = {d_k}<br><br>"
        f"{projections}<br>scores Q Kᵀ {scale}<br>{mask}<br>"
        "weights = softmax along each row (keys)<br>output = weights · V<br><br>"
        "<i>Rows are queries, columns keys. Hover a cell for its exact value; "
        "click to select it.</i>"
    )


class PipelinePanel(QWidget):
    """Q, K, V, scores, scaled, masked, weights, output for the selected head."""

    cellClicked = Signal(str, int, int, int)  # view, head, row, col

    def __init__(self, doc: Document, parent: QWidget | None = None):
        super().__init__(parent)
        self.doc = doc
        self.views: dict[str, HeatmapView] = {}
        self._shown: tuple[object, ...] = ()
        self._awaiting: set[str] = set()
        layout = QGridLayout(self)
        layout.setContentsMargins(2, 2, 2, 2)
        layout.setSpacing(2)
        for k, name in enumerate(HEAD_MATRICES):
            view = HeatmapView(name)
            view.cellClicked.connect(self._clicked)
            view.painted.connect(self._painted)
            layout.addWidget(view, k // COLUMNS, k % COLUMNS)
            self.views[name] = view
        self.legend = QLabel()
        self.legend.setWordWrap(True)
        self.legend.setAlignment(Qt.AlignmentFlag.AlignTop | Qt.AlignmentFlag.AlignLeft)
        self.legend.setContentsMargins(12, 12, 12, 12)
        k = len(HEAD_MATRICES)
        layout.addWidget(self.legend, k // COLUMNS, k % COLUMNS)
        doc.resultChanged.connect(self.show_result)
        doc.headChanged.connect(lambda _: self.show_result(doc.result))
        self.show_result(doc.result)

    def show_result(self, result: Result) -> None:
        head = min(self.doc.head, result.n_heads - 1)
        if not result.complete and result.fresh != head:
            return  # a preview of another head: wait for the complete result
        key = (result.heads[head], result.tokens)
        if key == self._shown:
            return  # the complete result after a preview of this head: nothing new here
        self._shown = key
        self.legend.setText(legend(result, head))
        for name, view in self.views.items():
            view.set_spec(spec_for(result, name, head))
        if not result.complete:
            # Tell the document once this preview is on screen (it waits to go on).
            self._awaiting = {n for n, v in self.views.items() if v.isVisible()}
            if self._awaiting:
                self.doc.hold_preview()

    def _painted(self, name: str) -> None:
        if name in self._awaiting:
            self._awaiting.discard(name)
            if not self._awaiting:
                self.doc.preview_drawn()

    def _clicked(self, name: str, row: int, col: int) -> None:
        for other, view in self.views.items():
            if other != name:
                view.select(None)
        self.cellClicked.emit(name, self.doc.head, row, col)
        self.doc.select(Selection(name, self.doc.head, row, col))
