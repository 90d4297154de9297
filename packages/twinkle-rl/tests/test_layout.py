"""twinkle-rl ships its import packages, and they resolve to this distribution's sources."""

import importlib
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"


@pytest.mark.parametrize(
    "name",
    [
        "twinkle.advantage",
        "twinkle.checkpoint_engine",
        "twinkle.env",
        "twinkle.reward",
        "twinkle.rollout",
        "twinkle.sampler",
    ],
)
def test_package_is_shipped_by_twinkle_rl(name):
    assert Path(importlib.import_module(name).__file__).resolve().is_relative_to(SRC)
