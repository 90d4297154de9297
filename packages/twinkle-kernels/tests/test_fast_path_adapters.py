"""The adapters of the liger-kernel, flash-attn and torch_npu fast paths hand each kernel its
arguments as the kernel documents them, and turn its results back into the op's.

No GPU or NPU here: fake packages stand in for the real ones, each computing what its
kernel is documented to compute (from the ops' references) and recording how it was called.
benchmarks/gpu/check_kernels_gpu.py runs the real CUDA kernels against the references.
"""

import sys
import types

import pytest
import torch
import torch.nn.functional as F

from twinkle.kernel import registry, select
from twinkle.kernel.fused_linear_cross_entropy import torch_fused_linear_cross_entropy
from twinkle.kernel.grouped_matmul import torch_grouped_matmul
from twinkle.kernel.rms_norm import torch_rms_norm
from twinkle.kernel.rotary_embedding import rotate_half, torch_rotary_embedding
from twinkle.kernel.varlen_attention import torch_varlen_attention


@pytest.fixture
def calls(monkeypatch):
    """Fake liger_kernel, flash_attn and torch_npu, each pretended installed."""
    record = []

    def liger_rms_norm(x, weight, eps, offset=0.0, casting_mode="llama", in_place=True):
        record.append(("liger_rms_norm", {"offset": offset, "casting_mode": casting_mode}))
        return torch_rms_norm(x, weight, eps)

    def liger_rope(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
        record.append(("liger_rope", {"unsqueeze_dim": unsqueeze_dim}))
        return torch_rotary_embedding(q, k, cos, sin, unsqueeze_dim)

    def liger_fused_linear_cross_entropy(
        hidden, weight, target, bias=None, *, reduction="mean", return_predicted_tokens=False
    ):
        record.append(("liger_flce", {"reduction": reduction, "tokens": return_predicted_tokens}))
        logps, predicted = torch_fused_linear_cross_entropy(hidden, weight, target, bias)
        return types.SimpleNamespace(loss=-logps, predicted_tokens=predicted)

    def flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, softmax_scale=None, causal=False):
        record.append(("flash", {"dtype": cu_q.dtype, "causal": causal, "max": (max_q, max_k)}))
        return torch_varlen_attention(q, k, v, cu_q, max_q, softmax_scale)

    def npu_rms_norm(x, gamma, epsilon=1e-6):
        record.append(("npu_rms_norm", {"epsilon": epsilon}))
        return torch_rms_norm(x, gamma, epsilon), None

    def npu_rotary_mul(x, r1, r2):
        record.append(("npu_rotary_mul", {"shape": tuple(r1.shape)}))
        return x * r1 + rotate_half(x) * r2

    def npu_swiglu(x, dim=-1):
        record.append(("npu_swiglu", {"dim": dim}))
        first, second = x.chunk(2, dim=dim)
        return F.silu(first) * second

    def npu_fusion_attention(q, k, v, head_num, input_layout, **kwargs):
        record.append(("npu_fusion_attention", {"head_num": head_num, "layout": input_layout}))
        record[-1][1].update(kwargs)
        bounds = torch.tensor([0, *kwargs["actual_seq_qlen"]])
        return torch_varlen_attention(q, k, v, bounds, None, kwargs["scale"]), None

    def npu_grouped_matmul(x, weight, *, group_list, split_item, group_type, group_list_type):
        record.append(("npu_grouped_matmul", {"split_item": split_item, "type": group_list_type}))
        assert group_type == 0 and len(x) == len(weight) == 1
        return [torch_grouped_matmul(x[0], weight[0], group_list)]

    liger = types.SimpleNamespace(
        liger_rms_norm=liger_rms_norm,
        liger_rope=liger_rope,
        liger_swiglu=lambda a, b: record.append(("liger_swiglu", {})) or F.silu(a) * b,
        liger_fused_linear_cross_entropy=liger_fused_linear_cross_entropy,
    )
    npu = types.SimpleNamespace(
        npu_rms_norm=npu_rms_norm,
        npu_rotary_mul=npu_rotary_mul,
        npu_swiglu=npu_swiglu,
        npu_fusion_attention=npu_fusion_attention,
        npu_grouped_matmul=npu_grouped_matmul,
    )
    fakes = {
        "liger_kernel.transformers.functional": liger,
        "flash_attn": types.SimpleNamespace(flash_attn_varlen_func=flash_attn_varlen_func),
        "torch_npu": npu,
    }
    for name, module in fakes.items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(registry, "is_installed", lambda package: package != "fla")
    for name in ("TWINKLE_KERNELS", "TWINKLE_NPU_PATCH", "TWINKLE_NPU_FUSED_OPS"):
        monkeypatch.delenv(name, raising=False)
    registry._load.cache_clear()
    yield record
    registry._load.cache_clear()


@pytest.fixture
def tensors():
    generator = torch.Generator().manual_seed(0)
    return lambda *shape: torch.randn(*shape, generator=generator, dtype=torch.float64)


def _same(a, b):
    pairs = zip(a, b, strict=True) if isinstance(a, tuple) else [(a, b)]
    return all(torch.allclose(x, y, atol=1e-12) for x, y in pairs)


@pytest.mark.parametrize("device", ["cuda", "npu"])
def test_norm_rope_and_swiglu_adapters(device, calls, tensors):
    x, weight = tensors(2, 3, 8), tensors(8)
    assert _same(select("rms_norm", device)(x, weight, 1e-5), torch_rms_norm(x, weight, 1e-5))
    q, k, cos, sin = tensors(1, 4, 3, 8), tensors(1, 2, 3, 8), tensors(1, 3, 8), tensors(1, 3, 8)
    assert _same(
        select("rotary_embedding", device)(q, k, cos, sin, 1),
        torch_rotary_embedding(q, k, cos, sin, 1),
    )
    gate, up = tensors(2, 5), tensors(2, 5)
    assert _same(select("swiglu", device)(gate, up), F.silu(gate) * up)
    names = [name for name, _ in calls]
    if device == "cuda":
        assert names == ["liger_rms_norm", "liger_rope", "liger_swiglu"]
        assert calls[0][1] == {"offset": 0.0, "casting_mode": "llama"}
    else:
        assert names == ["npu_rms_norm", "npu_rotary_mul", "npu_rotary_mul", "npu_swiglu"]
        assert calls[0][1] == {"epsilon": 1e-5} and calls[1][1]["shape"] == (1, 1, 3, 8)


def test_liger_fused_linear_cross_entropy_asks_per_token_losses(calls, tensors):
    hidden, weight, targets = tensors(5, 4), tensors(9, 4), torch.tensor([1, 8, 0, 3, 3])
    logps, predicted = select("fused_linear_cross_entropy", "cuda")(hidden, weight, targets)
    ref_logps, ref_predicted = torch_fused_linear_cross_entropy(hidden, weight, targets)
    assert torch.allclose(logps, ref_logps.float()) and torch.equal(predicted, ref_predicted)
    assert logps.dtype == torch.float32 and predicted.dtype == torch.int64
    assert calls == [("liger_flce", {"reduction": "none", "tokens": True})]


@pytest.mark.parametrize("device", ["cuda", "npu"])
def test_varlen_attention_adapters(device, calls, tensors):
    q, k, v = tensors(9, 4, 8), tensors(9, 2, 8), tensors(9, 2, 8)
    bounds = torch.tensor([0, 2, 9])
    out = select("varlen_attention", device)(q, k, v, bounds, 7, 0.3)
    assert _same(out, torch_varlen_attention(q, k, v, bounds, 7, 0.3))
    name, seen = calls[-1]
    if device == "cuda":
        assert name == "flash" and seen == {"dtype": torch.int32, "causal": True, "max": (7, 7)}
    else:
        assert name == "npu_fusion_attention" and seen["layout"] == "TND"
        assert seen["head_num"] == 4 and seen["sparse_mode"] == 3 and seen["scale"] == 0.3
        assert seen["actual_seq_qlen"] == seen["actual_seq_kvlen"] == (2, 9)
        mask = seen["atten_mask"]
        assert mask.shape == (2048, 2048) and mask.dtype == torch.bool
        assert bool(mask[0, 1]) and not bool(mask[1, 0])  # True above the diagonal: masked


def test_npu_grouped_matmul_adapter(calls, tensors):
    x, weight, sizes = tensors(6, 3), tensors(2, 3, 4), torch.tensor([4, 2])
    assert _same(
        select("grouped_matmul", "npu")(x, weight, sizes), torch_grouped_matmul(x, weight, sizes)
    )
    assert calls == [("npu_grouped_matmul", {"split_item": 2, "type": 1})]
