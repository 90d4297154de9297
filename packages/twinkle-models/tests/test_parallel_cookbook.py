"""The documents' torchrun examples run under torchrun on two CPU processes: as FSDP2,
cookbook/torchrun/sft_fsdp.py writes one gathered peft checkpoint folder, and
cookbook/transformers/fsdp2.py (the resume page's full example) saves and resumes; the
long-sequence example, cookbook/torchrun/cp.py, trains with ring attention over cp=2."""

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


def logged_losses(stderr: str) -> list[str]:
    """The training losses the script logged, as printed (full float repr), in step order."""
    return re.findall(r"Current is step \d+ of \d+, metric: \{'loss': ([0-9.e-]+)", stderr)


def test_the_fsdp2_example_evaluates_saves_and_resumes_where_it_stopped(tmp_path, torchrun):
    """Six steps that evaluate at step 3 and keep that checkpoint (4 batches, 2 optimizer
    steps), then a run resumed from it: its two steps see the same data and state as steps 4
    and 5 of the first run, so they log the same losses. (Two runs from scratch would not
    compare: the LoRA init draws from torch's unseeded generator.)"""
    script = COOKBOOK / "transformers" / "fsdp2.py"
    env = {"TWINKLE_LOG_EVERY": "1", "TWINKLE_MAX_STEPS": "6", "TWINKLE_EVAL_EVERY": "3"}
    first = torchrun(script, env=env, cwd=tmp_path)
    assert re.search(r"Eval metric: \{'loss': [0-9.]+", first.stderr), first.stderr[-3000:]
    best = tmp_path / "output" / "fsdp2" / "checkpoint-3"
    record = json.loads((best / "trainer_state.json").read_text())
    assert record["consumed_train_samples"] == 32
    assert (best / "optimizer" / ".metadata").is_file()
    last = tmp_path / "output" / "fsdp2" / "last-checkpoint" / "trainer_state.json"
    assert json.loads(last.read_text())["consumed_train_samples"] == 48
    resume = {**env, "TWINKLE_MAX_STEPS": "2", "RESUME_FROM_CHECKPOINT": str(best)}
    second = torchrun(script, env=resume, cwd=tmp_path)
    assert "'consumed_train_samples': 32" in second.stderr, second.stderr[-3000:]
    losses = logged_losses(first.stderr)
    assert len(losses) == 6
    assert logged_losses(second.stderr) == losses[4:6]


def test_the_cp_example_trains_on_packed_rows_and_counts_each_batch_once(tmp_path, torchrun):
    script = COOKBOOK / "torchrun" / "cp.py"
    done = torchrun(script, env={"TWINKLE_MAX_STEPS": "1"}, cwd=tmp_path)
    metric = re.search(
        r"step 0 of \d+, metric: \{'loss': ([0-9.]+).*'tokens': ([0-9.]+)", done.stderr
    )
    assert metric is not None, done.stderr[-3000:]
    assert 7.0 < float(metric.group(1)) < 9.0
    # Both cp ranks read the same 8 conversations, packed into one row: counted once.
    assert float(metric.group(2)) == first_batch_tokens()
