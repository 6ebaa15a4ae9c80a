"""Small widgets the panels share."""

from __future__ import annotations

from collections.abc import Iterable

from PySide6.QtCore import QEvent, QObject, QTimer, SignalInstance
from PySide6.QtGui import QPaintEvent
from PySide6.QtWidgets import QSpinBox, QWidget

from attnviz.core.maths.engine import Result
from attnviz.ui.compute import ComputeService
from attnviz.ui.heatmap import on_screen
from attnviz.ui.workspace import Workspace


def int_spin(
    low: int,
    high: int,
    tip: str = "",
    value: int | None = None,
    separators: bool = False,
    commit_only: bool = True,
) -> QSpinBox:
    """The one way a panel asks for a whole number: a spin box limited to low..high (so
    nothing else can be typed), with thousands separators if asked; ``commit_only``
    reports a value once it is committed (Enter, focus out, arrows), not per keystroke."""
    spin = QSpinBox()
    spin.setRange(low, high)
    if value is not None:
        spin.setValue(value)
    spin.setGroupSeparatorShown(separators)
    spin.setKeyboardTracking(not commit_only)
    spin.setToolTip(tip)
    return spin


def set_quietly(spin: QSpinBox, value: int) -> None:
    """Show a value from the document without echoing it back as an edit."""
    spin.blockSignals(True)
    spin.setValue(value)
    spin.blockSignals(False)


class PaintWatch(QObject):
    """Tells the compute service once the views that redrew a result before it was
    complete (a preview of one head, or every head before the mix) have painted it:
    the worker holds the rest of its work back until then (``hold_partial``), so that the
    UI has the cores while it draws. A view hidden meanwhile is waited for no longer."""

    def __init__(self, compute: ComputeService) -> None:
        super().__init__()
        self.compute = compute
        self._awaiting: set[QWidget] = set()

    def watch(self, view: QWidget, painted: SignalInstance) -> None:
        """Follow a view, whose signal ``painted`` it emits after each paint."""
        painted.connect(lambda *_: self._painted(view))
        view.installEventFilter(self)

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if event.type() == QEvent.Type.Hide and watched in self._awaiting:
            self._painted(watched)  # type: ignore[arg-type]  # (it will not paint now)
        return False

    def hold(self, result: Result, redrawn: Iterable[QWidget]) -> None:
        """After drawing result: wait for those of the redrawn views that are on screen
        when the result is not complete; else nothing."""
        self._awaiting = set() if result.complete else {v for v in redrawn if on_screen(v)}
        if self._awaiting:
            self.compute.hold_partial()

    def release_after(self, redrawn: Iterable[QWidget]) -> None:
        """For a partial result held when it arrived (hold_partial) but drawn later, from a
        worker's answer: let the rest go once those of the redrawn views that are on
        screen have painted; at once when none is."""
        self._awaiting = {v for v in redrawn if on_screen(v)}
        if not self._awaiting:
            self.compute.partial_drawn()

    def forget(self) -> None:
        """Wait for nothing more (the result is complete: nothing is held back)."""
        self._awaiting = set()

    def _painted(self, view: QWidget) -> None:
        if view in self._awaiting:
            self._awaiting.discard(view)
            if not self._awaiting:  # once this paint is on screen, not from inside it
                QTimer.singleShot(0, self.compute.partial_drawn)


class ScreenPanel(QWidget):
    """A panel drawn only while it is on screen: what arrives while it is not (a closed
    dock, a tab behind another) is drawn when it is shown again (``shown_again``, when
    its dock's tab is raised, before it paints; else once it paints)."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self._stale = True

    def redraw(self) -> None:
        """Draw the latest now if on screen, else when shown again."""
        raise NotImplementedError

    def shown_again(self) -> None:
        """Draw what arrived while the panel was off screen, if it is on screen now."""
        if self._stale and on_screen(self):
            self.redraw()

    def paintEvent(self, event: QPaintEvent) -> None:
        # Painted, so on screen: however it got there (shown at last, a dock reopened or
        # its tab clicked, a squeezed dock given room again), draw what it missed. Later,
        # not from inside the paint.
        if self._stale:
            QTimer.singleShot(0, self.shown_again)
        super().paintEvent(event)


class ResultPanel(ScreenPanel):
    """A ScreenPanel drawn from complete results; subclasses implement ``show_result``,
    and set ``heads_alone`` when they show heads and nothing of the mix (concat, final):
    then they draw a result as soon as every head is current, before the mix."""

    heads_alone = False

    def __init__(self, ws: Workspace, parent: QWidget | None = None):
        super().__init__(parent)
        self.doc, self.view_state, self.compute = ws.doc, ws.view_state, ws.compute
        self._heads_drawn: tuple[object, ...] = ()
        ws.compute.resultChanged.connect(self._on_result)

    def show_result(self, result: Result) -> None:
        raise NotImplementedError

    def redraw(self) -> None:
        self._stale = True
        result = self.compute.result
        if on_screen(self) and self._draws(result):
            self._stale = False
            self._heads_drawn = result.heads
            self.show_result(result)
        else:
            self._heads_drawn = ()  # (not kept alive, tens of megabytes, while unseen)

    def _draws(self, result: Result) -> bool:
        return result.complete or (self.heads_alone and result.heads_current)

    def _on_result(self, result: Result) -> None:
        if not self._draws(result):
            return
        if self.heads_alone and not self._stale and _same(self._heads_drawn, result.heads):
            return  # the complete result of heads drawn before the mix: nothing new
        self.redraw()


def _same(a: tuple[object, ...], b: tuple[object, ...]) -> bool:
    """Whether two tuples hold the very same objects."""
    return len(a) == len(b) and all(x is y for x, y in zip(a, b, strict=True))
