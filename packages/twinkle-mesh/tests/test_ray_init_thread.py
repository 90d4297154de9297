"""Ray mode started from a thread other than the main one (the server's loader thread)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).parent / "scripts" / "ray_init_in_thread.py"


def test_a_cluster_started_from_a_thread_outlives_the_thread(tmp_path_factory):
    temp_dir = tmp_path_factory.mktemp("ray")  # short: Ray's socket paths must fit 107 bytes
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONDONTWRITEBYTECODE": ""}
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(temp_dir)],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
    )
    assert "zombies=0" in done.stdout, done.stdout + done.stderr[-2000:]
    assert "task=42" in done.stdout, done.stdout + done.stderr[-2000:]
