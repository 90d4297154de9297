"""One tiny model for the whole package's tests: the bundled random-init Qwen3 (2 layers,
hidden 64), whose trainer and sampler copies start identical (same recipe, same seed)."""

import pytest

from twinkle.sampler import TorchSampler

MODEL_ID = "bundled://tiny-qwen3"


@pytest.fixture(scope="session")
def sampler():
    sampler = TorchSampler(MODEL_ID)
    sampler.set_template("Qwen3_5Template")
    return sampler
