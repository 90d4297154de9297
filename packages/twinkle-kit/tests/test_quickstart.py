"""The README's first command runs the main job: keep it working at every commit."""

import subprocess
import sys
from pathlib import Path

QUICKSTART = Path(__file__).resolve().parents[3] / "cookbook" / "quickstart.py"


def test_quickstart_runs_and_covers_the_batch_once():
    done = subprocess.run(
        [sys.executable, str(QUICKSTART)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert "rank 0 counted 28 tokens; all ranks: 28" in done.stderr
    assert "4-way Ulysses x 2-way data: 8 ranks, 2 data slices" in done.stderr
