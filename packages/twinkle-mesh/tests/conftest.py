"""Shared fixtures. ``ray_cluster`` starts one local Ray instance for the whole session, and
only when a test asks for it, so the tests that do not use Ray never pay for it."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).parent / "scripts"
RAY_CPUS = 8  # logical CPUs: groups reserve them, the 2 real cores are shared by time


@pytest.fixture(scope="session")
def ray_cluster(tmp_path_factory):
    """A local Ray instance of its own (temp dir, no dashboard, no auth token), whose workers
    import the test components from ``scripts/`` and may cache bytecode."""
    import ray

    from twinkle.infra import reset
    from twinkle.infra.ray import runtime as ray_runtime

    os.environ["RAY_AUTH_MODE"] = "disabled"
    os.environ["PYTHONDONTWRITEBYTECODE"] = ""
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(SCRIPTS), os.environ.get("PYTHONPATH")) if p
    )
    sys.path.insert(0, str(SCRIPTS))
    ray.init(
        num_cpus=RAY_CPUS,
        include_dashboard=False,
        log_to_driver=False,
        _temp_dir=str(tmp_path_factory.mktemp("ray")),
    )
    yield ray
    ray_runtime.shutdown()
    reset()
    ray.shutdown()
