"""The documents' Ray GRPO sample with MegatronModel (cookbook/megatron/grpo_ray.py) on a local
CPU cluster: Megatron trains in its CPU (gloo) mode on a 'model' group of two workers (dp2),
TorchSampler samples on a 'sampler' group, and after each weight sync (the adapter saved in
peft's names, loaded by the sampler) the sampler's logprobs equal the trainer's: the loss's
mismatch metric, mean |logp - old_logp| on fresh samples, is float32 rounding (the model runs
in fp32 here; the documents' bf16 is the script's default)."""

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

COOKBOOK = Path(__file__).resolve().parents[3] / "cookbook" / "megatron"


@pytest.fixture(scope="module")
def ray_address(tmp_path_factory):
    import ray

    os.environ["RAY_AUTH_MODE"] = "disabled"
    ray.init(
        num_cpus=8,  # logical: 2 model + 1 sampler workers
        include_dashboard=False,
        log_to_driver=False,
        _temp_dir=str(tmp_path_factory.mktemp("ray")),
    )
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


def test_the_documents_ray_grpo_sample_runs_with_megatron_on_cpus(ray_address, tmp_path):
    code = (COOKBOOK / "grpo_ray.py").read_text().split('"""', 2)[2]
    assert "MegatronModel(" in code and "TransformersModel" not in code
    env = {
        **os.environ,
        "RAY_ADDRESS": ray_address,
        "RAY_AUTH_MODE": "disabled",
        "MODEL_GPUS": "2",
        "SAMPLER_GPUS": "1",
        "MIXED_PRECISION": "fp32",
        "TWINKLE_MAX_STEPS": "2",
        "OMP_NUM_THREADS": "1",
        "PYTHONDONTWRITEBYTECODE": "",
    }
    done = subprocess.run(
        [sys.executable, str(COOKBOOK / "grpo_ray.py")],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
        env=env,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    out = done.stdout
    assert "actor MegatronModel#" in out and "actor TorchSampler#" in out
    assert "Training completed. optim_steps=2" in out
    logged = ast.literal_eval(re.search(r"\[Step 2/2\] (\{.*\})", out).group(1))
    assert logged["completion_length/mean"] > 0 and logged["tokens"] > 0
    assert logged["policy/logp_mismatch"] < 1e-4, logged
    assert (tmp_path / "output" / "grpo-gsm8k-checkpoint" / "adapter_model.safetensors").is_file()
