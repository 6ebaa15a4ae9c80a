"""Names the user gave, as messages show them (standard library only: the command line
imports it before anything else)."""

from __future__ import annotations


def quoted(name: str, most: int = 60) -> str:
    """name in quotes, escaped, and cut to about ``most`` characters: a 100,000-character
    name is not echoed whole."""
    text = repr(name)
    if len(text) <= most:
        return text
    return f"{text[: most - 12]}…{text[-8:]} ({len(name):,} characters)"
