"""The Hugging Face hub offline for a test, with a cache of its own (import the fixture
into a test module that imports models: nothing may be fetched)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def offline(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
