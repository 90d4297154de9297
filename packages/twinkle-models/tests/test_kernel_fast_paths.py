"""Where the kernel fast paths plug into the model: the chunked loss head takes the fused
linear cross-entropy, and Ulysses attention takes varlen attention for packed rows, where
the device has them. Tested on a fake platform: a CPU "fast path" that is the op's torch
reference, counted; on a real CPU neither is taken.
benchmarks/gpu/check_kernels_gpu.py runs liger-kernel and flash-attn on a GPU."""

from collections import Counter

import pytest
import torch
import torch.nn.functional as F

from twinkle.kernel import FastPath, registry
from twinkle.loss import chunked_logps
from twinkle.model.transformers.strategy.ulysses_attention import packed_attention


@pytest.fixture
def fake_cpu_fast_path(monkeypatch):
    ran = Counter()

    def install(op):
        reference = registry._references[op]

        def run(*args):
            ran[op] += 1
            return reference(*args)

        monkeypatch.setitem(
            registry._fast_paths, op, [FastPath("fake", "torch", frozenset({"cpu"}), lambda: run)]
        )

    monkeypatch.delenv("TWINKLE_KERNELS", raising=False)
    registry._load.cache_clear()
    yield install, ran
    registry._load.cache_clear()


def _head_inputs():
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(2, 6, 8, generator=generator, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(13, 8, generator=generator, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(0, 13, (2, 6), generator=generator)
    labels[0, :2] = -100
    return hidden, weight, labels


def _logps_and_grads(hidden, weight, labels, **kwargs):
    out = chunked_logps(hidden, weight, labels, **kwargs)
    hidden.grad = weight.grad = None
    out.logps.sum().backward()
    return out, hidden.grad.clone(), weight.grad.clone()


def test_the_chunked_head_takes_the_fused_cross_entropy_where_it_runs(fake_cpu_fast_path):
    install, ran = fake_cpu_fast_path
    hidden, weight, labels = _head_inputs()
    chunked, chunked_dh, chunked_dw = _logps_and_grads(hidden, weight, labels)
    assert ran["fused_linear_cross_entropy"] == 0  # no fast path on a CPU: chunked
    install("fused_linear_cross_entropy")
    fused, fused_dh, fused_dw = _logps_and_grads(hidden, weight, labels)
    assert ran["fused_linear_cross_entropy"] == 1
    assert torch.allclose(fused.logps, chunked.logps, atol=1e-12)
    assert torch.equal(fused.predicted_ids, chunked.predicted_ids)
    assert torch.allclose(fused_dh, chunked_dh, atol=1e-12)
    assert torch.allclose(fused_dw, chunked_dw, atol=1e-12)
    _logps_and_grads(hidden, weight, labels, chunk_size=3)  # an explicit chunk size: chunked
    assert ran["fused_linear_cross_entropy"] == 1


def _packed_qkv():
    generator = torch.Generator().manual_seed(1)
    query = torch.randn(1, 4, 9, 8, generator=generator, dtype=torch.float64)
    key, value = torch.randn(2, 1, 2, 9, 8, generator=generator, dtype=torch.float64)
    return query, key, value, torch.tensor([0, 4, 5, 9], dtype=torch.int32)


def test_ulysses_packed_rows_take_varlen_attention_where_it_runs(fake_cpu_fast_path):
    install, ran = fake_cpu_fast_path
    query, key, value, bounds = _packed_qkv()
    packed = {"cu_seq_lens_q": bounds, "max_length_q": 4, "scaling": 0.25}
    assert packed_attention(query, key, value, **packed) is None  # CPU: the inner attention
    install("varlen_attention")
    out = packed_attention(query, key, value, **packed)
    assert ran["varlen_attention"] == 1 and out.shape == (1, 9, 4, 8)
    owner = torch.repeat_interleave(torch.arange(3), bounds.diff())
    mask = (owner[:, None] == owner[None, :]) & torch.ones(9, 9).tril().bool()
    expected = F.scaled_dot_product_attention(
        query, key.repeat_interleave(2, 1), value.repeat_interleave(2, 1), mask, scale=0.25
    )
    assert torch.allclose(out, expected.transpose(1, 2), atol=1e-12)
    for other in ({"sliding_window": 4}, {"dropout": 0.1}, {"cu_seq_lens_q": None}):
        assert packed_attention(query, key, value, **{**packed, **other}) is None
    assert ran["varlen_attention"] == 1
