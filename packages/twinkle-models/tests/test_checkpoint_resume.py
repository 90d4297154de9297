"""Exact resume: a run saved at step K and resumed in a new process repeats the uninterrupted
run's losses of steps K+1..N bit for bit on CPU (LoRA with dropout, and full training)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from peft import LoraConfig

from twinkle.model import TransformersModel
from twinkle.template import build_template

SCRIPT = Path(__file__).parent / "scripts" / "resume_run.py"
N, K = 6, 3  # as in the script


def run_script(mode: str, out: Path) -> dict:
    # One thread in both processes: float sums then reduce in the same order.
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, str(SCRIPT), mode, str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((out / f"{mode}.json").read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("resume")
    return run_script("train", out), run_script("resume", out)


@pytest.mark.parametrize("kind", ["lora", "full"])
def test_resumed_losses_are_bit_identical(runs, kind):
    trained, resumed = runs[0][kind], runs[1][kind]
    reference = trained["reference"]
    assert len(reference["losses"]) == N
    assert len(set(reference["losses"])) == N  # the run does train: every loss differs
    # Saving changes nothing: the run that saved at K goes on exactly like the reference.
    assert trained["continued"] == reference
    assert resumed["progress"] == {"consumed_train_samples": 4 * K, "step": K}
    assert resumed["losses"] == reference["losses"][K:]  # exact float equality
    assert resumed["draws"] == reference["draws"][K:]  # Python and numpy RNGs restored
    assert resumed["digest"] == reference["digest"]  # every trainable bit at step N


def test_lora_dropout_makes_the_rng_matter():
    """Guards against a vacuous pass: with the script's LoRA dropout, the loss of the same
    batch depends on the torch RNG, so equal losses after a resume need its state restored."""
    template = build_template("Qwen3_5Template", model_id="bundled://tiny-qwen3")
    turns = [{"role": "user", "content": "who are you?"}, {"role": "assistant", "content": "me"}]
    batch = template.batch_encode([{"messages": turns}] * 2)
    model = TransformersModel("bundled://tiny-qwen3", device="cpu")
    config = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.1, target_modules="all-linear")
    model.add_adapter_to_model("default", config)
    model.set_optimizer("AdamW", lr=1e-2)
    model.forward_backward(batch)
    model.clip_grad_and_step()  # LoRA's B starts at zero; after a step dropout shows
    losses = []
    for seed in (0, 0, 1):
        torch.manual_seed(seed)
        losses.append(model.forward_backward(batch).loss)
    assert losses[0] == losses[1] != losses[2]
