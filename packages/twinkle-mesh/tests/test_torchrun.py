"""twinkle.initialize('local') under a real torchrun launch with two CPU processes (gloo)."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

SCRIPT = Path(__file__).parent / "scripts" / "torchrun_initialize.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_initialize_under_torchrun_starts_gloo_and_slices_by_rank(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR"):
        env.pop(name, None)
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=1",
        "--nproc_per_node=2",
        "--master-addr=127.0.0.1",
        f"--master-port={free_port()}",
        str(SCRIPT),
        str(tmp_path),
    ]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["rank"] for r in results] == [0, 1]
    assert all(r["backend"] == "gloo" and r["world_size"] == 2 for r in results)
    assert all(r["global_mesh_is_ours"] and r["placement_marks_this_rank"] for r in results)
    assert [r["slice"] for r in results] == [[0, 3], [3, 5]]
    assert [r["all_reduced"] for r in results] == [3.0, 3.0]
    assert [r["reversed_slice"] for r in results] == [[3, 5], [0, 3]]
    assert [r["reversed_torch_coordinate"] for r in results] == [[1], [0]]
