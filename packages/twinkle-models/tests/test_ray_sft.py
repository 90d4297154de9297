"""The same SFT loop in local mode (one process) and in ray mode (a 'model' group of two CPU
workers, dp=2, DDP over gloo) gives the same losses; with the DataLoader on a second group
its batches reach the model workers without passing through the driver. The Ray cookbook
examples run as written, attached to this module's cluster.

Tolerance: per-step losses agree to 1e-5 absolute. The two runs differ only in how the
gradient sum is formed (one process sums all rows; two ranks each sum half and DDP
all-reduces), which changes float32 rounding, not the result.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import twinkle
from twinkle import DeviceGroup, DeviceMesh
from twinkle.dataloader import DataLoader
from twinkle.dataset import Dataset, DatasetMeta
from twinkle.infra import reset
from twinkle.infra.ray import runtime as ray_runtime
from twinkle.infra.ray.traffic import count_driver_traffic
from twinkle.model import TransformersModel
from twinkle.preprocessor import SelfCognitionProcessor

MODEL = "bundled://tiny-qwen3"
STEPS, BATCH = 4, 4
TOLERANCE = 1e-5
COOKBOOK = Path(__file__).resolve().parents[3] / "cookbook" / "ray"


def make_dataset() -> Dataset:
    """A zero-argument factory, so a DataLoader on a Ray worker can build the dataset there."""
    dataset = Dataset(DatasetMeta("bundled://self-cognition", data_slice=range(STEPS * BATCH)))
    dataset.set_template("Qwen3_5Template", model_id=MODEL)
    dataset.map(SelfCognitionProcessor("Twinkle", "ModelScope"))
    dataset.encode()
    return dataset


def train(model, dataloader, outputs: list | None = None) -> list[float]:
    """The user's loop: forward_backward, clip_grad_and_step, read the metrics each step;
    forward_backward's own outputs (loss, logps, num_tokens) go to ``outputs``."""
    model.set_optimizer("AdamW", lr=1e-3)
    losses = []
    for step, batch in enumerate(dataloader):
        if step == STEPS:
            break
        output = model.forward_backward(inputs=batch)
        if outputs is not None:
            outputs.append({k: output[k] for k in ("loss", "logps", "num_tokens")})
        model.clip_grad_and_step()
        losses.append(model.calculate_metric(is_training=True)["loss"])
    return losses


LOCAL_OUTPUTS: list = []  # forward_backward's outputs of the one-process run


@pytest.fixture(scope="module")
def local_losses():
    reset()
    twinkle.initialize("local")
    model = TransformersModel(MODEL)
    losses = train(model, DataLoader(make_dataset(), batch_size=BATCH), LOCAL_OUTPUTS)
    reset()
    return losses


@pytest.fixture(scope="module")
def ray_groups(tmp_path_factory, local_losses):
    """One local Ray instance (own temp dir, no dashboard) with a 'model' group of two CPU
    workers (dp=2) and a 'data' group of one."""
    import ray

    os.environ["RAY_AUTH_MODE"] = "disabled"
    os.environ["PYTHONDONTWRITEBYTECODE"] = ""
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(Path(__file__).parent), os.environ.get("PYTHONPATH")) if p
    )
    ray.init(
        num_cpus=8,  # logical: this module's groups take 3, a cookbook run up to 3 more
        include_dashboard=False,
        log_to_driver=False,
        _temp_dir=str(tmp_path_factory.mktemp("ray")),
    )
    groups = [
        DeviceGroup(name="model", ranks=2, device_type="cpu"),
        DeviceGroup(name="data", ranks=1, device_type="cpu"),
    ]
    mesh = DeviceMesh.from_sizes(dp_size=2, device_type="cpu")
    twinkle.initialize("ray", groups=groups, global_device_mesh=mesh)
    yield
    ray_runtime.shutdown()
    reset()
    ray.shutdown()


def test_ray_dp2_gives_the_losses_of_one_process(local_losses, ray_groups):
    """forward_backward returns the whole batch's output (collect='rows'), not worker 0's
    share: every row's logps, the loss over both workers' tokens and their count."""
    model = TransformersModel(MODEL, remote_group="model")
    outputs = []
    losses = train(model, DataLoader(make_dataset(), batch_size=BATCH), outputs)
    assert len(losses) == STEPS and losses[0] > losses[-1]
    torch.testing.assert_close(losses, local_losses, rtol=0, atol=TOLERANCE)
    for got, expected in zip(outputs, LOCAL_OUTPUTS, strict=True):
        assert got["logps"].shape == expected["logps"].shape
        assert got["num_tokens"] == expected["num_tokens"]
        torch.testing.assert_close(got["logps"], expected["logps"], rtol=0, atol=TOLERANCE)
        assert got["loss"] == pytest.approx(expected["loss"], abs=TOLERANCE)


def test_batches_from_a_data_group_flow_worker_to_worker(local_losses, ray_groups):
    model = TransformersModel(MODEL, remote_group="model")
    loader = DataLoader(make_dataset, batch_size=BATCH, remote_group="data")
    with count_driver_traffic() as traffic:
        losses = train(model, loader)
    torch.testing.assert_close(losses, local_losses, rtol=0, atol=TOLERANCE)
    # What reached the driver: the metrics dicts (and StopIteration-free statuses), no batch.
    assert traffic.received < 400 * STEPS, traffic


def test_a_template_and_an_input_processor_run_on_a_worker(ray_groups):
    from twinkle.processor import InputProcessor
    from twinkle.template import Qwen3_5Template

    chat = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}
    template = Qwen3_5Template(model_id=MODEL, remote_group="data")
    feature = template.encode(chat)
    expected = Qwen3_5Template(model_id=MODEL).encode(chat)
    assert list(feature["input_ids"]) == list(expected["input_ids"])
    batch = InputProcessor(remote_group="data")([feature])  # the feature goes worker to worker
    assert batch["input_ids"].tolist() == [list(expected["input_ids"])]


def run_cookbook(script: str, cwd: Path) -> str:
    """Run a cookbook script as its own driver, attached to this module's Ray cluster."""
    import ray

    env = {
        **os.environ,
        "RAY_ADDRESS": ray.get_runtime_context().gcs_address,
        "TWINKLE_MAX_STEPS": "2",
        "OMP_NUM_THREADS": "1",
    }
    done = subprocess.run(
        [sys.executable, str(COOKBOOK / script)],
        capture_output=True,
        text=True,
        timeout=400,
        cwd=cwd,
        env=env,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done.stdout


def test_the_documents_ray_example_runs_with_bundled_ids(ray_groups, tmp_path):
    code = (COOKBOOK / "sft.py").read_text().split('"""', 2)[2]
    assert "ms://" not in code and 'remote_group="default"' in code
    out = run_cookbook("sft.py", tmp_path)
    assert "Group 'default'" in out and "actor TransformersModel#" in out
    metric = re.search(r"Current is step 0 of 12, metric: \{'loss': ([0-9.]+)", out)
    assert metric is not None and 7.0 < float(metric.group(1)) < 9.0, out[-2000:]
    assert (tmp_path / "output" / "last-checkpoint" / "adapter_model.safetensors").is_file()


def test_the_two_group_example_moves_only_metrics_through_the_driver(ray_groups, tmp_path):
    out = run_cookbook("two_groups.py", tmp_path)
    assert "Group 'model'" in out and "Group 'data'" in out and "actor DataLoader#" in out
    assert len(re.findall(r"step \d of 13: \{'loss'", out)) == 2
    received = int(re.search(r"received (\d+)", out).group(1))
    assert received < 2000, out[-2000:]
