"""The torch references of the fused ops equal what transformers (or plain torch) computes,
and reject malformed inputs with errors that name the problem."""

import pytest
import torch
import torch.nn.functional as F
from transformers.models.qwen3 import modeling_qwen3

from twinkle.kernel import (
    fused_linear_cross_entropy,
    grouped_matmul,
    rms_norm,
    rotary_embedding,
    swiglu,
    varlen_attention,
)

DOUBLE = {"dtype": torch.float64}


@pytest.fixture
def generator():
    return torch.Generator().manual_seed(0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_equals_qwen3s(dtype, generator):
    layer = modeling_qwen3.Qwen3RMSNorm(16, eps=1e-6).to(dtype)
    layer.weight.data = torch.rand(16, generator=generator).to(dtype) + 0.5
    x = torch.randn(3, 5, 16, generator=generator).to(dtype)
    assert torch.equal(rms_norm(x, layer.weight, layer.variance_epsilon), layer(x))


def test_rotary_embedding_equals_transformers(generator):
    q, k = (
        torch.randn(2, 4, 7, 8, generator=generator),
        torch.randn(2, 2, 7, 8, generator=generator),
    )
    cos, sin = torch.randn(2, 2, 7, 8, generator=generator)
    ours = rotary_embedding(q, k, cos, sin)
    theirs = modeling_qwen3.apply_rotary_pos_emb(q, k, cos, sin)
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs, strict=True))


def test_swiglu_is_silu_gate_times_up(generator):
    gate, up = torch.randn(2, 3, 6, generator=generator)
    assert torch.equal(swiglu(gate, up), F.silu(gate) * up)


def test_fused_linear_cross_entropy_is_minus_the_per_token_cross_entropy(generator):
    hidden, weight = torch.randn(6, 8, generator=generator), torch.randn(11, 8, generator=generator)
    bias, targets = torch.randn(11, generator=generator), torch.tensor([0, 3, 10, 2, 2, 7])
    logps, predicted = fused_linear_cross_entropy(hidden, weight, targets, bias)
    logits = hidden @ weight.T + bias
    assert torch.allclose(logps, -F.cross_entropy(logits, targets, reduction="none"), atol=1e-6)
    assert torch.equal(predicted, logits.argmax(-1))


def test_varlen_attention_keeps_packed_sequences_apart(generator):
    lengths, heads, kv_heads = [3, 1, 6], 4, 2
    total = sum(lengths)
    q = torch.randn(total, heads, 8, generator=generator, **DOUBLE)
    k, v = torch.randn(2, total, kv_heads, 8, generator=generator, **DOUBLE)
    cu_seqlens = torch.tensor([0, 3, 4, 10], dtype=torch.int32)
    out = varlen_attention(q, k, v, cu_seqlens)
    # Independently: one attention over the row with a block-diagonal causal mask.
    owner = torch.repeat_interleave(torch.arange(3), torch.tensor(lengths))
    mask = (owner[:, None] == owner[None, :]) & torch.ones(total, total).tril().bool()
    expected = F.scaled_dot_product_attention(
        q.transpose(0, 1),
        k.repeat_interleave(2, dim=1).transpose(0, 1),
        v.repeat_interleave(2, dim=1).transpose(0, 1),
        attn_mask=mask,
    ).transpose(0, 1)
    assert torch.allclose(out, expected, atol=1e-12)


def test_grouped_matmul_multiplies_each_row_by_its_experts_weight(generator):
    x, weight = torch.randn(7, 4, generator=generator), torch.randn(3, 4, 5, generator=generator)
    sizes = torch.tensor([2, 0, 5])
    expert = torch.repeat_interleave(torch.arange(3), sizes)
    expected = torch.stack([x[i] @ weight[expert[i]] for i in range(7)])
    assert torch.allclose(grouped_matmul(x, weight, sizes), expected, atol=1e-6)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: rms_norm(torch.ones(2, 4), torch.ones(3)), r"weight must be \[4\]"),
        (lambda: swiglu(torch.ones(2), torch.ones(3)), "gate and up must have one shape"),
        (
            lambda: rotary_embedding(
                *torch.ones(2, 1, 2, 3, 4), torch.ones(1, 3, 5), torch.ones(1, 3, 5)
            ),
            "cos and sin must share a shape",
        ),
        (
            lambda: fused_linear_cross_entropy(torch.ones(2, 3), torch.ones(5, 4), torch.ones(2)),
            "must share H",
        ),
        (
            lambda: varlen_attention(
                torch.ones(6, 3, 2), *torch.ones(2, 6, 2, 2), torch.tensor([0, 6])
            ),
            r"query heads \(3\) must be a multiple of key heads \(2\)",
        ),
        (
            lambda: varlen_attention(*torch.ones(3, 6, 2, 2), torch.tensor([0, 4])),
            "cu_seqlens must rise strictly from 0 to the packed length 6",
        ),
        (
            lambda: grouped_matmul(torch.ones(3, 2), torch.ones(2, 2, 2), torch.tensor([3])),
            r"group_sizes must be \[2\]",
        ),
    ],
)
def test_malformed_inputs_are_named(call, match):
    with pytest.raises(ValueError, match=match):
        call()
