"""Fast-path selection: flash-linear-attention only for CUDA tensors with fla installed,
never imported for CPU tensors, and its adapters pass the arguments fla expects.

No GPU here: a fake ``fla`` package stands in for the real one, down to the call.
benchmarks/gpu/bench_gated_delta_gpu.py checks the real kernels against the reference.
"""

import subprocess
import sys
import textwrap
import types

import pytest
import torch

from twinkle.kernel import (
    backends,
    causal_conv1d,
    registry,
    select,
    torch_causal_conv1d,
    torch_chunk_gated_delta_rule,
)

CUDA, CPU = torch.device("cuda"), torch.device("cpu")
OPS = ("chunk_gated_delta_rule", "causal_conv1d")


@pytest.fixture
def fla_installed(monkeypatch):
    """Pretend fla is installed, with a fake package that records each call and runs the
    torch reference (in fla's own signatures)."""
    calls = []

    def chunk_gated_delta_rule(q, k, v, g, beta, *, cu_seqlens=None, **kwargs):
        calls.append(("chunk_gated_delta_rule", cu_seqlens, kwargs))
        return torch_chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=cu_seqlens, **kwargs)

    def causal_conv1d(x, weight, bias=None, *, activation=None, cu_seqlens=None):
        calls.append(("causal_conv1d", cu_seqlens, {"activation": activation}))
        out = torch_causal_conv1d(x, weight, bias, activation, cu_seqlens)
        return out, None

    fake = {
        "fla": types.ModuleType("fla"),
        "fla.ops.gated_delta_rule": types.SimpleNamespace(
            chunk_gated_delta_rule=chunk_gated_delta_rule
        ),
        "fla.modules.causal_conv1d": types.SimpleNamespace(causal_conv1d=causal_conv1d),
    }
    for name, module in fake.items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(registry, "is_installed", lambda package: package == "fla")
    registry._load.cache_clear()
    yield calls
    registry._load.cache_clear()


@pytest.mark.parametrize("op", OPS)
def test_the_reference_runs_when_fla_is_missing_or_the_tensors_are_on_cpu(op, monkeypatch):
    monkeypatch.setattr(registry, "is_installed", lambda package: False)
    assert backends(op, CUDA) == ["torch"]
    monkeypatch.setattr(registry, "is_installed", lambda package: True)
    assert backends(op, CPU) == ["torch"]
    assert select(op, CPU) is registry._references[op]


@pytest.mark.parametrize("op", OPS)
def test_fla_is_chosen_for_cuda_tensors_when_installed(op, fla_installed):
    assert backends(op, CUDA) == ["fla", "torch"]
    assert select(op, CUDA) is not registry._references[op]
    assert select(op, CUDA, backend="torch") is registry._references[op]


def test_the_fla_adapters_pass_fla_its_arguments(fla_installed):
    generator = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 1, 9, 2, 4, generator=generator)
    v = torch.randn(1, 9, 4, 3, generator=generator)
    g, beta = -torch.rand(1, 9, 4, generator=generator), torch.rand(1, 9, 4, generator=generator)
    cu_seqlens = torch.tensor([0, 4, 9], dtype=torch.int32)
    fla_chunk = select("chunk_gated_delta_rule", CUDA)  # loaded from the fake fla
    out, state = fla_chunk(
        q,
        k,
        v,
        g,
        beta,
        output_final_state=True,
        use_qk_l2norm_in_kernel=True,
        cu_seqlens=cu_seqlens,
        scale=None,
        initial_state=None,
    )
    ref, ref_state = torch_chunk_gated_delta_rule(
        q,
        k,
        v,
        g,
        beta,
        output_final_state=True,
        use_qk_l2norm_in_kernel=True,
        cu_seqlens=cu_seqlens,
    )
    assert torch.equal(out, ref) and torch.equal(state, ref_state)
    name, passed_cu, kwargs = fla_installed[-1]
    assert name == "chunk_gated_delta_rule" and passed_cu.dtype == torch.int64
    assert kwargs["use_qk_l2norm_in_kernel"] is True and kwargs["output_final_state"] is True
    x, weight = torch.randn(1, 9, 5, generator=generator), torch.randn(5, 4, generator=generator)
    y = select("causal_conv1d", CUDA)(x, weight, None, activation="silu", cu_seqlens=cu_seqlens)
    assert torch.equal(y, torch_causal_conv1d(x, weight, None, "silu", cu_seqlens))
    assert fla_installed[-1][0] == "causal_conv1d" and fla_installed[-1][1].dtype == torch.int64
    # CPU tensors still take the reference, even with fla installed.
    calls = len(fla_installed)
    causal_conv1d(x, weight, cu_seqlens=cu_seqlens)
    assert len(fla_installed) == calls


def test_a_backend_that_cannot_run_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(registry, "is_installed", lambda package: False)
    with pytest.raises(ValueError, match="backend 'fla' cannot run causal_conv1d on cpu.*'fla'"):
        select("causal_conv1d", CPU, backend="fla")
    with pytest.raises(ValueError, match="unknown backend 'triton'.*known: fla, torch"):
        select("causal_conv1d", CPU, backend="triton")
    with pytest.raises(ValueError, match="unknown op 'matmul'"):
        backends("matmul", CPU)


def test_cpu_use_never_imports_an_installed_fast_path_package(tmp_path):
    """fla, liger-kernel, flash-attn and torch_npu on the path, each failing when imported (as
    fla does on a CPU machine, through transformers), are never touched by importing
    twinkle.kernel and running its ops on CPU tensors."""
    packages = ("fla", "liger_kernel", "flash_attn", "torch_npu")
    for package in packages:
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text(f"raise RuntimeError('{package}')\n")
    script = textwrap.dedent(
        """
        import sys, torch
        from twinkle.kernel import (
            backends, causal_conv1d, chunk_gated_delta_rule, rms_norm, swiglu, varlen_attention
        )
        x = torch.randn(1, 5, 2, 3)
        g = -torch.rand(1, 5, 2)
        chunk_gated_delta_rule(x, x, x, g, g.neg(), cu_seqlens=torch.tensor([0, 2, 5]))
        causal_conv1d(x[..., 0], torch.ones(2, 4), cu_seqlens=torch.tensor([0, 2, 5]))
        rms_norm(x, torch.ones(3)), swiglu(x, x)
        varlen_attention(x[0], x[0], x[0], torch.tensor([0, 5]))
        assert backends("causal_conv1d", torch.device("cuda")) == ["fla", "torch"]
        assert backends("rms_norm", "cuda") == ["liger", "torch"]
        assert backends("rms_norm", "npu") == ["torch_npu", "torch"]
        assert not {"fla", "liger_kernel", "flash_attn", "torch_npu"} & set(sys.modules)
        print("ok")
        """
    )
    env = {"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": ""}
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
