"""The GPU validation run (benchmarks/gpu/validate.sh) cannot rot unnoticed: without a GPU, its
orchestrator's dry run checks every script and config, the kernel check runs its cases at toy
shapes on a CPU (every op on its reference), a broken fast path fails it with the op, the
shapes and the error, the weight-sync check prints its plan, and the agentic check runs its
rollout, scoring and decoupled-PPO step with TorchSampler in vLLM's place. None of it ran on
a GPU."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from twinkle.kernel import FastPath, registry

GPU = Path(__file__).resolve().parents[3] / "benchmarks" / "gpu"


@pytest.fixture
def load(monkeypatch):
    """Import a script of benchmarks/gpu as the module it is when run there."""
    monkeypatch.syspath_prepend(str(GPU))

    def load(name: str):
        spec = importlib.util.spec_from_file_location(name, GPU / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        monkeypatch.setitem(sys.modules, name, module)  # dataclasses look their module up
        spec.loader.exec_module(module)
        return module

    return load


def test_the_dry_run_lists_every_check_and_builds_the_configs(load, capsys):
    validate = load("validate")
    assert validate.main(["--dry-run"]) == 0
    out = capsys.readouterr().out
    checks = ("kernels", "gated_delta", "vllm_lora", "weight_sync", "fsdp2", "sft_mfu")
    for check in (*checks, "ring_flash", "agentic_vllm"):
        assert f"check {check}:" in out
    assert "config qwen3-8b: 36 layers, hidden 4096" in out and "nothing ran on a GPU" in out
    # Limits, not durations: the checks should finish in about ten minutes on one GPU.
    assert sum(c.timeout_s for c in validate.CHECKS) <= 930
    with pytest.raises(SystemExit):
        validate.main(["--only", "nope", "--dry-run"])


def test_the_kernel_check_runs_on_cpu_at_toy_shapes(load, capsys, tmp_path):
    check = load("check_kernels_gpu")
    report = tmp_path / "kernels.json"
    assert check.main(["--device", "cpu", "--small", "--iters", "1", "--json", str(report)]) == 0
    out = capsys.readouterr().out
    ops = ("rms_norm", "rotary_embedding", "swiglu", "fused_linear_cross_entropy")
    for op in (*ops, "varlen_attention", "grouped_matmul"):
        assert f"PASS {op} [torch]" in out
    assert "LOSS unfused" in out and "LOSS chunked" in out and report.exists()


def test_the_ring_attention_check_runs_on_cpu_at_toy_shapes(load, capsys):
    check = load("check_ring_attention_gpu")
    assert check.main(["--device", "cpu", "--small", "--iters", "1"]) == 0
    out = capsys.readouterr().out
    for case in ("cp2 padded", "cp2 packed", "cp4 padded", "cp4 packed"):
        assert f"PASS {case} [torch]" in out
    if not torch.cuda.is_available():
        assert check.main([]) == 2


def test_a_fast_path_that_disagrees_fails_the_kernel_check_naming_op_and_shapes(
    load, capsys, monkeypatch
):
    check = load("check_kernels_gpu")

    def wrong(x, weight, eps):
        return registry._references["rms_norm"](x, weight, eps) * 1.5

    def broken(gate, up):
        raise RuntimeError("no kernel image for this device")

    fakes = {"rms_norm": wrong, "swiglu": broken}
    for op, run in fakes.items():
        path = FastPath("fake", "torch", frozenset({"cpu"}), lambda run=run: run)
        monkeypatch.setitem(registry._fast_paths, op, [path])
    monkeypatch.delenv("TWINKLE_KERNELS", raising=False)
    registry._load.cache_clear()
    try:
        assert check.main(["--device", "cpu", "--small", "--iters", "1"]) == 1
    finally:
        registry._load.cache_clear()
    out = capsys.readouterr().out
    assert "FAIL rms_norm [fake] shapes {'x': (24, 16), 'weight': (16,)}: max relative" in out
    assert "FAIL swiglu [fake]" in out and "RuntimeError: no kernel image" in out
    assert "PASS rotary_embedding [torch]" in out


def test_the_weight_sync_check_prints_its_plan_without_a_gpu(load, capsys):
    sync = load("check_weight_sync_gpu")
    assert sync.main(["--dry-run"]) == 0
    assert '"shape": "qwen3-8b"' in capsys.readouterr().out
    if not torch.cuda.is_available():
        assert sync.main([]) == 2


def test_the_agentic_check_runs_everything_but_vllm_on_cpu(load, capsys):
    check = load("check_agentic_vllm_gpu")
    assert check.main(["--sampler", "torch"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("| torch |"))
    _, trajectories, turns, mismatch, weight = (c.strip() for c in row.strip("|").split("|"))
    assert int(trajectories) == 16 and int(turns) >= 2
    assert float(mismatch) < 1e-4 and abs(float(weight) - 1) < 1e-4  # same numerics
    assert out.rstrip().endswith("OK")
    if not torch.cuda.is_available():
        assert check.main([]) == 2


def test_validate_sh_parses():
    done = subprocess.run(["bash", "-n", str(GPU / "validate.sh")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
