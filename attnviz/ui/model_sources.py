"""The Import dialog's model field: recent sources, then the models on this machine.

``SourceBox`` is an editable combo box (a path or a model id can still be typed) whose
list shows, for each model, its type, where it comes from, its size and whether attnviz
would import it, with the reason when not. The list is filled from
``core.models.catalog`` once it has been read off the UI thread.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtGui import QBrush, QColor, QStandardItem, QStandardItemModel
from PySide6.QtWidgets import QAbstractItemView, QComboBox, QHeaderView, QTreeView, QWidget

from attnviz.core.maths.cost import human_bytes

COLUMNS = ("Model", "Type", "From", "Size", "Import")
REFUSED_COLOUR = "#c0392b"
KINDS = {"package": "installed package", "cache": "Hugging Face cache"}


class SourceBox(QComboBox):
    """An editable model field whose list shows what each model is and would do."""

    def __init__(self, recent: list[str], parent: QWidget | None = None):
        super().__init__(parent)
        self.setEditable(True)
        self.setInsertPolicy(QComboBox.InsertPolicy.NoInsert)  # Enter imports, adds nothing
        self.items = QStandardItemModel(0, len(COLUMNS), self)
        self.items.setHorizontalHeaderLabels(list(COLUMNS))
        self.setModel(self.items)
        view = QTreeView(self)
        view.setRootIsDecorated(False)
        view.setUniformRowHeights(True)
        view.setAllColumnsShowFocus(True)
        view.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        view.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        header = view.header()
        header.setStretchLastSection(True)
        header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.setView(view)
        self.recent = list(recent)
        self.available: list[Any] = []
        self._fill()

    def set_available(self, available: list[Any]) -> None:
        """Show these models (``catalog.Available``) after the recent sources; what is typed
        in the field stays."""
        text = self.currentText()
        self.available = list(available)
        self.blockSignals(True)
        try:
            self._fill()
        finally:
            self.blockSignals(False)
        self.setCurrentText(text)

    def rows(self) -> list[tuple[str, ...]]:
        """Each row's cells as shown in the list."""
        return [
            tuple(self.items.index(r, c).data() or "" for c in range(len(COLUMNS)))
            for r in range(self.items.rowCount())
        ]

    def showPopup(self) -> None:
        view = self.view()
        assert isinstance(view, QTreeView)
        widths = sum(view.sizeHintForColumn(c) + 24 for c in range(len(COLUMNS) - 1))
        view.setMinimumWidth(min(max(self.width(), widths + 260), 900))
        row = self.findText(self.currentText().strip())
        if row >= 0:  # the list opens on the model named in the field
            self.setCurrentIndex(row)
        super().showPopup()

    def _fill(self) -> None:
        self.items.removeRows(0, self.items.rowCount())
        by_source = {a.source: a for a in self.available}
        for source in self.recent:
            self._add(source, by_source.get(source), recent=True)
        for a in self.available:
            if a.source not in self.recent:
                self._add(a.source, a, recent=False)

    def _add(self, source: str, model: Any, *, recent: bool) -> None:
        if model is None:
            cells = [source, "", "recent", "", ""]
            tip = source
        else:
            kind = KINDS.get(model.kind, model.kind)
            verdict = f"✗ {model.problem}" if model.problem else "✓ supported"
            layers = f", {model.layers} layers" if model.layers else ""
            cells = [
                source,
                model.model_type,
                f"recent · {kind}" if recent else kind,
                human_bytes(model.size),
                verdict,
            ]
            tip = f"{source}: {model.model_type}{layers}, {kind} at {model.where}. " + (
                f"attnviz would refuse it: {model.problem}"
                if model.problem
                else "attnviz imports it exactly"
            )
        row = [QStandardItem(cell) for cell in cells]
        for item in row:
            item.setToolTip(tip)
            item.setEditable(False)
            if model is not None and model.problem:
                item.setForeground(QBrush(QColor(REFUSED_COLOUR)))
        self.items.appendRow(row)


def found_text(available: list[Any], where: Path) -> str:
    """One line on what was found on this machine."""
    packages = sum(a.kind == "package" for a in available)
    cached = len(available) - packages
    if not available:
        return (
            f"No model packages installed and no models in the Hugging Face cache ({where}): "
            "name a folder or a model id"
        )
    parts = []
    if packages:
        parts.append(f"{packages} installed package{'s' * (packages != 1)}")
    if cached:
        parts.append(f"{cached} model{'s' * (cached != 1)} in the Hugging Face cache")
    refused = sum(bool(a.problem) for a in available)
    note = f", {refused} of which attnviz would refuse (✗)" if refused else ""
    return f"On this machine: {' and '.join(parts)}{note}; pick one from the list ▾"


def verdict_html(answer: Any) -> str:
    """The config's verdict (a ``Peek``): type, layers, positions, and why it would refuse."""
    facts = [html.escape(answer.model_type)]
    if answer.layers:
        facts.append(f"{answer.layers} layers")
    if answer.max_tokens:
        facts.append(f"up to {answer.max_tokens} tokens")
    if answer.problem:
        reason = html.escape(answer.problem)
        return (
            f"{' · '.join(facts)} · "
            f'<span style="color:{REFUSED_COLOUR}"><b>✗ would be refused:</b> {reason}</span>'
        )
    return f"{' · '.join(facts)} · ✓ the config is supported (the import checks the weights)"
