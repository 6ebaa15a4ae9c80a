"""Renaming a token in the window: a label with a control character is refused, and said."""

from __future__ import annotations

import pytest
from PySide6.QtWidgets import QInputDialog


@pytest.mark.parametrize(("label", "code"), [("cat\x1b[31m", "U+001B"), ("\ufffe", "U+FFFE")])
def test_renaming_to_an_unprintable_label_is_refused(make_window, monkeypatch, label, code):
    window = make_window()
    doc = window.doc
    tokens, steps = doc.scenario.tokens, doc.undo_stack.count()
    monkeypatch.setattr(QInputDialog, "getText", lambda *a, **k: (label, True))
    window.inputs.rename(1)
    assert doc.scenario.tokens == tokens and doc.undo_stack.count() == steps
    message = window.statusBar().currentMessage()
    assert "tokens[2]" in message and code in message, message
    assert label not in message and all(ch.isprintable() for ch in message), repr(message)
    # A printable name still works.
    monkeypatch.setattr(QInputDialog, "getText", lambda *a, **k: ("chat 🐈", True))
    window.inputs.rename(1)
    assert doc.scenario.tokens[1] == "chat 🐈" and doc.undo_stack.count() == steps + 1
