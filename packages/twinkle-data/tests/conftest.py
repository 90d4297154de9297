"""Fixtures shared by twinkle-data's tests."""

from __future__ import annotations

import pytest

from twinkle.infra import reset


@pytest.fixture
def single_process(monkeypatch):
    """One process, no launcher variables, and twinkle's global state reset around the test."""
    reset()
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    yield
    reset()
