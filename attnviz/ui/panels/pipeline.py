"""Pipeline dock: every intermediate of the selected head, as heatmaps in reading order."""

from __future__ import annotations

import dataclasses

import numpy as np
from PySide6.QtCore import Signal
from PySide6.QtGui import QResizeEvent
from PySide6.QtWidgets import QGridLayout, QLabel, QSizePolicy, QVBoxLayout, QWidget

from attnviz.core.figures.edits import changed_in
from attnviz.core.figures.figure import (
    GRADIENT_VIEWS,
    HeatmapSpec,
    gradient_spec,
    make_spec,
    spec_for,
    variant_terms,
)
from attnviz.core.maths.changes import changes_between
from attnviz.core.maths.results import HEAD_MATRICES, TURNED_MATRICES, Computed, Result
from attnviz.core.maths.scenario import Scenario, Settings
from attnviz.core.maths.variants import softcap
from attnviz.ui.heatmap import HeatmapView, on_screen
from attnviz.ui.panels.common import ScreenPanel
from attnviz.ui.view_state import Selection
from attnviz.ui.workspace import Workspace


def legend(result: Computed, head: int) -> tuple[str, str]:
    """What the heatmaps show: one line for the panel, and the long form for its tooltip."""
    st = result.settings
    n, d_k = len(result.tokens), result.d_k
    if not st.scale:
        scale = "not scaled"
    elif st.scale_value is not None:
        scale = f"× {st.scale_value:.3g}"
    else:
        scale = f"÷ √{d_k} = {result.scale_factor:.3g}"
    mask = {
        "none": ("no mask", "no mask"),
        "causal": ("causal −∞ (grey)", "future keys set to −∞ (grey, hatched): weight exactly 0"),
        "causal-zero": (
            "causal zero: leaks (outlined red)",
            "future keys set to 0, not −∞ (hatched): they still get weight (outlined red)",
        ),
        "drop-after-softmax": (
            "dropped after softmax",
            "future weights zeroed after softmax (hatched): rows sum to less than 1",
        ),
        "sliding-window": (
            f"sliding window of {st.window} −∞ (grey)",
            f"future keys and keys {st.window} or more places back set to −∞ (grey, "
            "hatched): each query sees itself and the keys just before it",
        ),
        "custom": ("custom mask −∞ (grey)", "the keys the custom mask hides set to −∞ (grey)"),
    }[st.mask]
    source = "X_kv" if result.X_kv is not None else "X"
    projections = (
        f"Q = X W_Q, K = {source} W_K, V = {source} W_V" if st.projections else "Q = K = V = X"
    )
    extras = variant_terms(result)
    keys = "" if result.X_kv is None else f" × {len(result.keys)} keys"
    line = (
        f"<b>Head {head + 1} of {result.n_heads}</b> · {n} tokens{keys} · d_k = {d_k} · "
        f"scores {scale} · {mask[0]}" + "".join(f" · {short}" for short, _ in extras)
    )
    tip = (
        "Rows are queries, columns keys. "
        f"{projections}; "
        + "".join(f"{long}; " for _, long in extras)
        + f"scores Q Kᵀ {scale}; {mask[1]}; weights = softmax along each row; "
        "output = weights · V. Hover a cell for its exact value; click it for its arithmetic."
    )
    return line, tip


def best_columns(width: int, height: int, count: int, choices: tuple[int, ...] = (2, 3, 4)) -> int:
    """How many columns (of choices) leave each heatmap's matrix the most room on its
    short side.

    About 150 px of a view's width go to its labels, colour bar and margins, 75 px of its
    height to its title and key labels.
    """

    def room(columns: int) -> float:
        rows = -(-count // columns)
        return min(width / columns - 150, height / rows - 75)

    return max(choices, key=room)


def with_gradients(names: tuple[str, ...]) -> tuple[str, ...]:
    """The views in pairs, each value then its gradient ("dQ"; "" for an empty cell: the
    ALiBi term and the sink's share have none)."""
    paired: list[str] = []
    for name in names:
        paired += [name, f"d{name}" if name in GRADIENT_VIEWS else ""]
    return tuple(paired)


ORDER = ("Q", "K", "V", *TURNED_MATRICES, "scores", "alibi", *HEAD_MATRICES[4:7], "sink", "output")
assert set(ORDER) == {*HEAD_MATRICES, *TURNED_MATRICES, "alibi", "sink"}


def shown_views(result: Computed) -> tuple[str, ...]:
    """The views this result has: Q and K turned only with QK-norm or RoPE, the sink's
    share only with sinks."""
    st = result.settings
    turned = st.qk_norm != "none" or st.positional == "rope"
    return tuple(
        name
        for name in ORDER
        if (name not in TURNED_MATRICES or turned)
        and (name != "sink" or st.sinks is not None)
        and (name != "alibi" or st.positional in ("alibi", "relative-bias"))
    )


def alibi_spec(result: Computed, head: int) -> HeatmapSpec:
    """The ALiBi term the head added to its scores, −slope·|i − j| (n × m), or T5's
    relative bias relative_bias[bucket(j − i), h]: what the scaled scores hold beyond the
    (soft-capped) scaled raw scores."""
    st, h = result.settings, result.head(head)
    relative = st.positional == "relative-bias"
    if h.rule is not None:
        bias = np.broadcast_to(h.rule.bias(h.index), h.scaled.shape)
    else:  # (the torch engine's heads): the scaled scores less the scaled raw scores
        scaled = h.scores / result.scale_factor
        if st.softcap is not None:
            scaled = softcap(scaled, st.softcap)
        bias = h.scaled - scaled
    return make_spec(
        f"head {head + 1} · "
        + ("T5 relative_bias[bucket(j − i), h]" if relative else "ALiBi −slope·|i − j|"),
        bias,
        tuple(result.tokens),
        tuple(result.keys),
        "query",
        "key",
        "diverging",
        "T5 relative bias" if relative else "ALiBi bias",
    )


def sink_spec(result: Computed, head: int) -> HeatmapSpec:
    """Each row's share of the softmax that went to the sink (a column beside the weights)."""
    share = result.head(head).sink[:, None]
    spec = make_spec(
        f"head {head + 1} · sink share",
        share,
        tuple(result.tokens),
        ("sink",),
        "query",
        "",
        "sequential",
        "sink share",
    )
    return dataclasses.replace(spec, levels=(0.0, 1.0))


class PipelinePanel(ScreenPanel):
    """Q, K, V, scores, scaled, masked, weights, output for the selected head: the shown
    head of the newest version as soon as it is made, then from the whole layer (while
    off screen, nothing: the latest when it is shown again)."""

    cellClicked = Signal(str, int, int, int)  # view, head, row, col

    def __init__(self, ws: Workspace, parent: QWidget | None = None):
        super().__init__(parent)
        self.doc, self.view_state, self.compute = ws.doc, ws.view_state, ws.compute
        self.views: dict[str, HeatmapView] = {}
        self._shown: tuple[object, ...] = ()
        self._drawn: tuple[Scenario, int] | None = None  # the scenario and head drawn
        self.grid = QGridLayout()
        self.grid.setContentsMargins(2, 2, 2, 2)
        self.grid.setSpacing(2)
        for name in (*ORDER, *(f"d{g}" for g in GRADIENT_VIEWS)):
            view = HeatmapView(name, self)  # (a child from the start: never a window)
            view.cellClicked.connect(self._clicked)
            self.views[name] = view
        self.source = ws.gradients  # the gradients, while shown
        # One line, no word wrap: a wrapping label would make the dock's scroll area size
        # the panel by height-for-width from size hints, and the heatmaps would scroll.
        self.legend = QLabel()
        self.legend.setMinimumWidth(1)
        self.legend.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Fixed)
        self.legend.setContentsMargins(6, 2, 6, 2)
        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        outer.addWidget(self.legend)
        self.loss_line = QLabel()  # the loss the gradients are of, while they are shown
        self.loss_line.setMinimumWidth(1)
        self.loss_line.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Fixed)
        self.loss_line.setContentsMargins(6, 0, 6, 2)
        self.loss_line.setVisible(False)
        outer.addWidget(self.loss_line)
        outer.addLayout(self.grid)
        self.columns = 0
        self.names: tuple[str, ...] = ()
        self._place(shown_views(ws.compute.result), 3)
        ws.view_state.selectionChanged.connect(self._mark)
        ws.compute.headReady.connect(lambda _: self.redraw())
        ws.compute.resultChanged.connect(lambda _: self.redraw())
        ws.view_state.headChanged.connect(lambda _: self.redraw())
        ws.view_state.headChanged.connect(lambda _: self._mark(ws.view_state.selection))
        ws.view_state.gradientsChanged.connect(lambda _: self._on_gradients())
        ws.gradients.gradientsReady.connect(lambda _: self._draw_gradients())
        self.show_result(ws.compute.result, ws.compute.result_scenario)

    def latest(self) -> tuple[Computed, Scenario]:
        """What shows the selected head newest, and its scenario: the newest version's
        shown head when it is that head and the layer is not made yet, else the newest
        complete result."""
        c, head = self.compute, self.view_state.head
        if c.busy and c.shown is not None and c.shown.index == head:
            return c.shown, c.scenario
        return c.result, c.result_scenario

    def redraw(self) -> None:
        self._stale = not on_screen(self)
        if not self._stale:
            self.show_result(*self.latest())

    def _place(self, names: tuple[str, ...], columns: int) -> None:
        """Lay the named views out in reading order, columns wide; hide the others."""
        if (names, columns) == (self.names, self.columns):
            return
        self.names, self.columns = names, columns
        for widget in self.views.values():
            self.grid.removeWidget(widget)
        for k, name in enumerate(names):
            if name:
                self.grid.addWidget(self.views[name], k // columns, k % columns)
        for name, widget in self.views.items():
            widget.setVisible(name in names)
        for c in range(4):
            self.grid.setColumnStretch(c, 1 if c < columns else 0)

    def _columns(self, names: tuple[str, ...]) -> int:
        """The best number of columns for the panel's size: even with the gradients, so
        that each stays beside its value."""
        size, even = self.size(), self.view_state.gradients
        return best_columns(size.width(), size.height(), len(names), (2, 4) if even else (2, 3, 4))

    def resizeEvent(self, event: QResizeEvent) -> None:
        self._place(self.names, self._columns(self.names))
        super().resizeEvent(event)

    def _on_gradients(self) -> None:
        """The gradients switched on or off: lay the views out again, and ask for them."""
        self.loss_line.setVisible(self.view_state.gradients)
        self.loss_line.setText("Gradients: computing…")
        self._shown = ()
        self.redraw()

    def show_result(self, result: Computed, s: Scenario) -> None:
        head = min(self.view_state.head, result.n_heads - 1)
        key = (result.head(head), result.tokens)
        if key == self._shown:  # the whole layer after its shown head, the same head:
            self._draw_gradients()  # nothing new but gradients that came while off screen
            return
        self._shown = key
        # What changed since the views drew (the same head of another scenario): the
        # lines the edits touched, from their record; else each view compares.
        drawn, self._drawn = self._drawn, (s, head)
        changes = changes_between(drawn[0], s) if drawn and drawn[1] == head else None
        line, tip = legend(result, head)
        self.legend.setText(line)
        self.legend.setToolTip(tip)
        names = shown_views(result)
        if self.view_state.gradients:
            names = with_gradients(names)
        if names != self.names:
            self._place(names, self._columns(names))
        for name in shown_views(result):
            made = {"sink": sink_spec, "alibi": alibi_spec}.get(name)
            spec = made(result, head) if made else spec_for(result, name, head)
            lines = None if changes is None else changed_in(changes, s, name, head)
            if self.views[name].set_spec(spec, lines) and not isinstance(result, Result):
                # The head first: painted now, before the rest of the edit is computed
                # (which would take the cores from the painting).
                self.views[name].repaint()

        self._draw_gradients()

    def _draw_gradients(self) -> None:
        """Each shown gradient beside its value, for the shown head."""
        g = self.source.gradients
        if g is None or not self.view_state.gradients or not self._drawn or self._stale:
            return  # (off screen: drawn with the values when shown again)
        s, head = self._drawn
        if s is not self.source.scenario:
            return  # (of an older version: the next answer draws)
        self.loss_line.setText(
            f"Beside each view its gradient dL/d…, for <b>L</b> = {loss_name(s.settings)} = "
            f"{g.loss:.6g} (View → Loss)"
        )
        for name in self.names:
            if name.startswith("d") and name[1:] in GRADIENT_VIEWS:
                value = self.views[name[1:]].spec
                if value is not None:
                    spec = gradient_spec(value, g.matrix(name[1:], head), name[1:], head,
                                         s.settings.mask, g.heads[head].future)  # fmt: skip
                    self.views[name].set_spec(spec)

    def _mark(self, sel: Selection | None) -> None:
        """Outline the selected cell when it is one of this head's views."""
        for name, view in self.views.items():
            view.select(sel.cell_in(name, self.view_state.head) if sel else None)

    def _clicked(self, name: str, row: int, col: int) -> None:
        if name in ("sink", "alibi"):
            return  # explained with each weight (the sink) and scaled score (ALiBi)
        for other, view in self.views.items():
            if other != name:
                view.select(None)
        self.cellClicked.emit(name, self.view_state.head, row, col)
        self.view_state.select(Selection(name, self.view_state.head, row, col))


def loss_name(st: Settings) -> str:
    """The loss the gradients are of, as a formula and a few words."""
    if st.loss == "target":
        return f"½‖final − T‖², T: {st.loss_target.replace('-', ' ')}"
    if st.loss == "next-token":
        return "next-token cross-entropy"
    return f"final[{st.loss_cell[0] + 1}, {st.loss_cell[1] + 1}]"
