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


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory):
    """A local Ray instance for one test module (8 logical CPUs; the two real cores are shared
    by time), whose workers import the test components from ``scripts/``."""
    import os
    import sys
    from pathlib import Path

    import ray

    from twinkle.infra import reset
    from twinkle.infra.ray import runtime as ray_runtime

    scripts = str(Path(__file__).parent / "scripts")
    os.environ["RAY_AUTH_MODE"] = "disabled"
    os.environ["PYTHONDONTWRITEBYTECODE"] = ""
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (scripts, os.environ.get("PYTHONPATH")) if p
    )
    sys.path.insert(0, scripts)
    ray.init(
        num_cpus=8,
        include_dashboard=False,
        log_to_driver=False,
        _temp_dir=str(tmp_path_factory.mktemp("ray")),
    )
    yield ray
    ray_runtime.shutdown()
    reset()
    ray.shutdown()
