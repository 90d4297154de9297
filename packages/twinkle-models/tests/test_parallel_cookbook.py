"""The documents' torchrun example (cookbook/torchrun/sft_fsdp.py) runs under torchrun on two CPU
processes, as FSDP2, and writes one gathered peft checkpoint folder."""

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

from twinkle.dataset import Dataset, DatasetMeta
from twinkle.preprocessor import SelfCognitionProcessor

COOKBOOK = Path(__file__).resolve().parents[3] / "cookbook"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def first_batch_tokens() -> int:
    dataset = Dataset(dataset_meta=DatasetMeta("bundled://self-cognition"))
    dataset.set_template("Qwen3_5Template", model_id="bundled://tiny-qwen3")
    dataset.map(SelfCognitionProcessor("twinkle大模型", "ModelScope社区"))
    dataset.encode()
    return sum(len(dataset[i]["input_ids"]) for i in range(8))


def test_the_documents_torchrun_example_trains_with_fsdp_on_two_processes(tmp_path):
    script = COOKBOOK / "torchrun" / "sft_fsdp.py"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": ""}
    env["TWINKLE_MAX_STEPS"] = "4"
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR"):
        env.pop(name, None)
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node=2",
        "--master-addr=127.0.0.1",
        f"--master-port={free_port()}",
        str(script),
    ]
    done = subprocess.run(
        command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-4000:]
    # 100 bundled rows in global batches of 8; the metrics (logged by rank 0) are the whole
    # batch's, not rank 0's half: its tokens are those of the first 8 rows.
    assert "Total steps: 13" in done.stderr
    metric = re.search(
        r"Current is step 0 of 13, metric: \{'loss': ([0-9.]+).*'tokens': ([0-9.]+)", done.stderr
    )
    assert metric is not None, done.stderr[-3000:]
    assert 7.0 < float(metric.group(1)) < 9.0
    assert float(metric.group(2)) == first_batch_tokens()
    checkpoint = tmp_path / "output" / "last-checkpoint"
    assert (checkpoint / "adapter_model.safetensors").is_file()
    assert (checkpoint / "optimizer" / ".metadata").is_file()
    record = json.loads((checkpoint / "trainer_state.json").read_text())
    assert record["kind"] == "adapter" and record["optimizer_ranks"] == 2
