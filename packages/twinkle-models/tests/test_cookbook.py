"""The cookbook runs as written: the documents' single-GPU example with only its ids changed."""

import json
import re
import subprocess
import sys
from pathlib import Path

COOKBOOK = Path(__file__).resolve().parents[3] / "cookbook"


def run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=300, cwd=cwd
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def test_the_documents_single_gpu_example_runs_with_bundled_ids(tmp_path):
    code = (COOKBOOK / "single_device.py").read_text().split('"""', 2)[2]  # after the docstring
    assert "ms://" not in code and "bundled://tiny-qwen3" in code
    done = run([str(COOKBOOK / "single_device.py")], tmp_path)
    # range(1000) over the 100 bundled rows keeps the 100, and says so
    assert "data_slice range(0, 1000) keeps the 100 that exist" in done.stderr
    assert "Total steps: 13" in done.stderr
    metric = re.search(r"Current is step 0 of 13, metric: \{'loss': ([0-9.]+)", done.stderr)
    assert metric is not None and 7.0 < float(metric.group(1)) < 9.0, done.stderr[-3000:]
    checkpoint = tmp_path / "output" / "last-checkpoint"
    assert (checkpoint / "adapter_model.safetensors").is_file()
    assert json.loads((checkpoint / "trainer_state.json").read_text())["kind"] == "adapter"
