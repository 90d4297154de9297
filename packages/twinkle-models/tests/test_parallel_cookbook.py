"""The documents' torchrun example (cookbook/torchrun/sft_fsdp.py) runs under torchrun on two CPU
processes, as FSDP2, and writes one gathered peft checkpoint folder."""

import json
import re
from pathlib import Path

from twinkle.dataset import Dataset, DatasetMeta
from twinkle.preprocessor import SelfCognitionProcessor

COOKBOOK = Path(__file__).resolve().parents[3] / "cookbook"


def first_batch_tokens() -> int:
    dataset = Dataset(dataset_meta=DatasetMeta("bundled://self-cognition"))
    dataset.set_template("Qwen3_5Template", model_id="bundled://tiny-qwen3")
    dataset.map(SelfCognitionProcessor("twinkle大模型", "ModelScope社区"))
    dataset.encode()
    return sum(len(dataset[i]["input_ids"]) for i in range(8))


def test_the_documents_torchrun_example_trains_with_fsdp_on_two_processes(tmp_path, torchrun):
    script = COOKBOOK / "torchrun" / "sft_fsdp.py"
    done = torchrun(script, env={"TWINKLE_MAX_STEPS": "4"}, cwd=tmp_path)
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
