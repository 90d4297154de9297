"""BroadcastEngine under torchrun (2 CPU processes, gloo): rank 0 is the trainer, rank 1 the
sampler. After each sync the sampler's logprobs equal the trainer's (tolerance 1e-4);
the second sync moves only the adapter."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).parent / "scripts" / "broadcast_sync.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_lora_sync_over_gloo_in_buckets(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": ""}
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
    trainer, sampler = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2))
    assert trainer["syncs"] == sampler["syncs"]  # both sides agree on what moved
    (first_bytes, first_buckets, first_kinds), (second_bytes, _, second_kinds) = trainer["syncs"]
    assert first_kinds == ["base", "lora"] and second_kinds == ["lora"]
    assert first_buckets >= 6  # 1.3 MB of base weights in 64 KiB buckets, and the adapter
    assert second_bytes * 20 < first_bytes
    assert all(gap < 1e-4 for gap in trainer["gaps"]), trainer["gaps"]
