"""The documents' Megatron sample (cookbook/megatron/tp.py) under torchrun on two CPU processes.

No GPU here, so MegatronModel picks its CPU (gloo) mode by itself: the script is the one a GPU
runs. At tp2 its first logged loss is the whole batch's, equal to one process's
TransformersModel on the same eight rows (the LoRA adapter starts as the identity), and it
writes one gathered peft checkpoint folder. The pp2 and dp2 layouts of the same script are
proven equal to one process by test_megatron_parallel.
"""

import json
import re
from pathlib import Path

import torch

from twinkle.dataset import Dataset, DatasetMeta
from twinkle.model import TransformersModel
from twinkle.preprocessor import SelfCognitionProcessor
from twinkle.utils.testing import reduction_tolerance

COOKBOOK = Path(__file__).resolve().parents[3] / "cookbook"
MODEL = "bundled://tiny-qwen3"


def first_batch_metric() -> tuple[dict, int]:
    """One process's training metrics on the first global batch, and the vocabulary size."""
    dataset = Dataset(dataset_meta=DatasetMeta("bundled://self-cognition"))
    dataset.set_template("Qwen3_5Template", model_id=MODEL)
    dataset.map(SelfCognitionProcessor("twinkle大模型", "ModelScope社区"))
    dataset.encode()
    model = TransformersModel(MODEL, device="cpu")
    model.forward_backward([dataset[i] for i in range(8)])
    return model.calculate_metric(is_training=True), model.model.config.vocab_size


def test_the_documents_megatron_sample_trains_at_tp2_on_two_cpu_processes(tmp_path, torchrun):
    script = COOKBOOK / "megatron" / "tp.py"
    done = torchrun(script, env={"TWINKLE_MAX_STEPS": "2"}, cwd=tmp_path, timeout=600)
    assert "MegatronModel runs on the CPU (gloo)" in done.stderr
    assert "parallel: tp 2, pp 1" in done.stderr
    assert "Total steps: 13" in done.stderr
    metric = re.search(
        r"Current is step 0 of 13, metric: \{'loss': ([0-9.e-]+).*'tokens': ([0-9.]+)", done.stderr
    )
    assert metric is not None, done.stderr[-3000:]
    reference, vocab = first_batch_metric()
    tokens = int(reference["tokens"])
    assert float(metric.group(2)) == tokens  # the whole batch's, not one rank's
    expected = torch.tensor(reference["loss"], dtype=torch.float32)
    torch.testing.assert_close(
        torch.tensor(float(metric.group(1))),
        expected,
        **reduction_tolerance(expected, terms=tokens * vocab),
    )
    checkpoint = tmp_path / "output" / "last-checkpoint"
    assert (checkpoint / "adapter_model.safetensors").is_file()
    record = json.loads((checkpoint / "trainer_state.json").read_text())
    assert record["kind"] == "adapter" and record["adapter_name"] == "default"
