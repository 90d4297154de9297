"""The README's first command runs the main job: keep it working at every commit.

The job runs as the README starts it (no flags but the output folder), in a subprocess,
on one thread: about half a minute, and no slower when other processes share the cores
(two OpenMP threads that must wait for a core spin and can take ten times as long).
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

QUICKSTART = Path(__file__).resolve().parents[3] / "cookbook" / "quickstart.py"


def test_the_main_job_learns_its_name_saves_and_answers(tmp_path):
    done = subprocess.run(
        [sys.executable, str(QUICKSTART), "--output-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    losses = [float(x) for x in re.findall(r"epoch \d+: loss ([0-9.]+)", done.stdout)]
    assert len(losses) == 30, done.stdout[-3000:]
    # From ln(vocab) ~ 8.3 at random init to memorising the answers.
    assert losses[0] > 6.0 and losses[-1] < 0.2, losses
    state = json.loads((tmp_path / "last-checkpoint" / "trainer_state.json").read_text())
    assert state["consumed_train_samples"] == 30 * 100
    assert (tmp_path / "last-checkpoint" / "config.json").is_file(), "a full HF model folder"
    # the tracker's record holds each epoch's metrics, and the curve is drawn from it
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [round(r["loss"], 3) for r in records] == losses
    assert (tmp_path / "loss_curve.png").read_bytes()[:4] == b"\x89PNG"
    answer = re.search(r"^A: (.*)$", done.stdout, re.MULTILINE)
    assert answer is not None, done.stdout
    assert "Twinkle" in answer.group(1) and "ModelScope" in answer.group(1), answer.group(1)
