"""DDP(2), FSDP2(2) and HSDP(dp 2 x fsdp 2) under torchrun on CPU (gloo) train exactly like one
process: same losses, weights and gradients (float32) after a few steps on the same global
batches, although the data ranks hold very uneven token counts; two adapters trained in
turns with activation checkpointing (DDP, FSDP2). Plus FSDP2 checkpoints (resume continues
identically; the gathered folders load in one process) and bad inputs.

Tolerances, float32: losses rel 1e-6, weights abs 1e-5, gradients 1e-5 of each tensor's
largest entry (measured: 3e-8, 1.3e-6, 1.4e-7: only the summation order differs). The
gradient norm: rel 1e-4 (measured 4e-5: CPU float32 norms of a shard and of the whole
embedding round differently).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from twinkle.model import TransformersModel

SCRIPT = Path(__file__).parent / "scripts" / "parallel_train.py"
PROCESSES = {"ddp": 2, "fsdp": 2, "hsdp": 4, "tp": 2, "fsdp_tp": 4}


def load_script():
    spec = importlib.util.spec_from_file_location("parallel_train", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def folder_of(launch_per_size):
    return launch_per_size(SCRIPT, PROCESSES)


@pytest.fixture(scope="module")
def reference() -> dict:
    """The same functions in this one process, without a mesh."""
    script = load_script()
    return {
        "lora": script.train("lora", None),
        "full": script.train("full", None),
        "lora_gradient": script.first_gradient("lora", None),
        "full_gradient": script.first_gradient("full", None),
        "two_adapters": script.two_adapters(None),
    }


def assert_close_tensors(got: dict, expected: dict, *, atol: float = 0, relative: float = 0):
    assert set(got) == set(expected) and expected
    for name, tensor in expected.items():
        bound = atol + relative * float(tensor.abs().max())
        diff = float((got[name].detach() - tensor.detach()).abs().max())
        assert diff <= bound, f"{name}: differs by {diff:.3g} (bound {bound:.3g})"


@pytest.mark.parametrize("strategy", list(PROCESSES))
def test_strategy_trains_like_one_process(strategy, reference, folder_of):
    folder = folder_of(strategy)
    result = torch.load(folder / f"{strategy}.pt", weights_only=False)
    result["errors"] = json.loads((folder / f"{strategy}.json").read_text())
    for kind in ("lora", "full"):
        got, expected = result[kind], reference[kind]
        assert got["losses"] == pytest.approx(expected["losses"], rel=1e-6), kind
        assert_close_tensors(got["weights"], expected["weights"], atol=1e-5)
        # Metrics are totals over the ranks: every rank reports the global batch's values.
        last, expected_last = got["metrics"][-1], expected["metrics"][-1]
        assert last["tokens"] == expected_last["tokens"]
        assert last["token_accuracy"] == pytest.approx(expected_last["token_accuracy"], abs=1e-9)
        assert last["grad_norm"] == pytest.approx(expected_last["grad_norm"], rel=1e-4)
    for kind in ("lora_gradient", "full_gradient"):
        got, expected = result[kind], reference[kind]
        assert_close_tensors(got["grads"], expected["grads"], relative=1e-5)
        assert got["grad_norm"] == pytest.approx(expected["grad_norm"], rel=1e-4)
    if strategy in ("ddp", "fsdp"):  # no sync until the last micro-step
        assert result["accumulation"] == {"first_reduced": False, "second_reduced": True}
    if strategy in ("ddp", "fsdp", "tp"):  # several adapters trained in turns
        got, expected = result["two_adapters"], reference["two_adapters"]
        assert got["losses"] == pytest.approx(expected["losses"], rel=1e-6)
        assert_close_tensors(got["weights"], expected["weights"], atol=1e-5)
    if strategy == "ddp":
        check_bad_inputs(result["errors"])
    if strategy in ("fsdp", "tp"):
        check_fsdp_checkpoints(result["resume"])
    if strategy == "fsdp":
        # bf16 compute: the first loss is the float32 one to bf16's precision.
        assert result["bf16"]["loss"] == pytest.approx(reference["full"]["losses"][0], rel=1e-2)
        assert result["bf16"]["dtypes"] == ["torch.float32"]


def check_bad_inputs(errors: dict) -> None:
    assert "world_size 4" in errors["wrong_world"]
    assert "torchrun --nproc_per_node=4" in errors["wrong_world"]
    assert "before calling set_optimizer" in errors["late_adapter"]


def check_fsdp_checkpoints(resume: dict) -> None:
    # Same mesh: the resumed run continues exactly where the saved one went on.
    assert resume["resumed"] == resume["uninterrupted"]
    assert_close_tensors(resume["weights_resumed"], resume["weights_uninterrupted"])
    assert resume["progress"] == {"consumed_train_samples": 8, "step": 1}
    assert (Path(resume["adapter_path"]) / "optimizer" / ".metadata").is_file()
    # Another mesh (one process): the gathered folders load as plain HF / peft folders.
    full = TransformersModel(resume["full_path"], device="cpu")
    state = full.model.state_dict()
    assert_close_tensors({k: state[k] for k in resume["full_weights"]}, resume["full_weights"])
    lora = TransformersModel("bundled://tiny-qwen3", device="cpu")
    lora.add_adapter_to_model("default", resume["adapter_path"])
    params = dict(lora.model.named_parameters())
    assert_close_tensors({k: params[k] for k in resume["weights_step1"]}, resume["weights_step1"])
