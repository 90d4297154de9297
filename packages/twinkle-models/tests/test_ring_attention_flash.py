"""Ring attention's flash-attention path on the CPU, everything up to the kernels: each
block's varlen form (which tokens, which sequences, causal or not) computes exactly the
layout's mask, and the blocks run through ``varlen_attention_lse`` (here its torch reference
stands in for flash-attn, as a CPU "fast path") give the torch blocks' outputs and gradients
in float64. benchmarks/gpu/validate.py runs the real kernels on a GPU."""

import pytest
import torch

from twinkle.kernel import FastPath, registry
from twinkle.kernel.varlen_attention_lse import BACKWARD_OP, OP
from twinkle.model.transformers.strategy import ring_attention_flash
from twinkle.model.transformers.strategy.ring_attention import (
    RingLayout,
    TorchBlocks,
    merge,
    segments_of,
)
from twinkle.model.transformers.strategy.ring_attention_flash import (
    FlashBlocks,
    flash_blocks,
    plan_block,
)

BATCH, HEADS, KV_HEADS, DIM = 2, 4, 2, 8
SCALE = DIM**-0.5


def padded(size):
    length = 4 * size
    mask = torch.ones(BATCH, length, dtype=torch.long)
    mask[0, length - 3 :] = 0  # right padding
    mask[1, :2] = 0  # left padding
    return segments_of(mask, torch.arange(length).expand(BATCH, -1))


def packed(size):
    """Sequences of 3, 6, 5 and 2 tokens padded to 2 × size blocks: boundaries inside and
    across chunks; a second row of one sequence."""
    lengths = [3, 6, 5, 2]
    total = sum(lengths) + (-sum(lengths) % (2 * size))
    first = torch.cat([torch.arange(n) for n in [*lengths, total - sum(lengths)] if n])
    return segments_of(None, torch.stack([first, torch.arange(total)]))


LAYOUTS = [(make, size) for make in (padded, packed) for size in (2, 3, 4)]


@pytest.mark.parametrize(("make", "size"), LAYOUTS)
def test_each_blocks_varlen_form_computes_the_layouts_mask(make, size):
    segments = make(size)
    local = segments.shape[1] // size
    for query_rank in range(size):
        layout = RingLayout(None, size, query_rank, segments)
        for key_rank in range(size):
            visible = layout.visible(query_rank, key_rank)
            plan = plan_block(layout, query_rank, key_rank)
            if plan is None:
                assert not visible.any()
                continue
            assert plan.causal == (query_rank == key_rank)
            assert plan.cu_seqlens_q.dtype == torch.int32
            assert torch.equal(plan.mask(BATCH, local), visible), (query_rank, key_rank)
            assert plan.max_seqlen_q == int(plan.cu_seqlens_q.diff().max())


def ring(blocks, q, k, v, dout, segments, size):
    """Every rank's ring forward and backward through ``blocks``, simulated in one process:
    (output, dq, dk, dv) of the whole sequence."""
    batch, _, length, dim = q.shape
    grouped = q.view(batch, KV_HEADS, HEADS // KV_HEADS, length, dim)
    dout = dout.view(grouped.shape)
    out, dq = torch.zeros_like(grouped), torch.zeros_like(grouped)
    dk, dv = torch.zeros_like(k), torch.zeros_like(v)
    for rank in range(size):
        layout = RingLayout(None, size, rank, segments)
        mine = layout.positions(rank)
        acc = torch.zeros_like(grouped[..., mine, :])
        lse = acc.new_full(acc.shape[:-1], float("-inf"))
        for source in range(size):
            keys = layout.positions(source)
            block = blocks.forward(
                layout,
                source,
                grouped[..., mine, :],
                k[:, :, keys],
                v[:, :, keys],
                SCALE,
                acc.dtype,
            )
            if block is not None:
                acc, lse = merge(acc, lse, *block)
        out[..., mine, :] = acc
        for source in range(size):
            keys = layout.positions(source)
            grads = blocks.backward(
                layout,
                source,
                dout[..., mine, :],
                grouped[..., mine, :],
                k[:, :, keys],
                v[:, :, keys],
                acc,
                lse,
                SCALE,
            )
            if grads is not None:
                dq[..., mine, :] += grads[0]
                dk[:, :, keys] += grads[1]
                dv[:, :, keys] += grads[2]
    return out.view(q.shape), dq.view(q.shape), dk, dv


@pytest.mark.parametrize(("make", "size"), LAYOUTS)
def test_flash_blocks_train_like_the_torch_blocks(make, size):
    segments = make(size)
    length = segments.shape[1]
    generator = torch.Generator().manual_seed(size)
    shapes = [(BATCH, HEADS, length, DIM), *[(BATCH, KV_HEADS, length, DIM)] * 2]
    q, k, v = (torch.randn(s, generator=generator, dtype=torch.float64) for s in shapes)
    dout = torch.randn(q.shape, generator=generator, dtype=torch.float64)
    kernels = registry._references[OP], registry._references[BACKWARD_OP]
    expected = ring(TorchBlocks(), q, k, v, dout, segments, size)
    got = ring(FlashBlocks(*kernels), q, k, v, dout, segments, size)
    for a, b in zip(got, expected, strict=True):
        assert float((a - b).abs().max()) < 1e-12
    assert float(expected[2].abs().max()) > 1e-3  # gradients reached the keys


def test_flash_blocks_run_for_half_precision_where_the_fast_path_is(monkeypatch):
    query = torch.zeros(1, HEADS, 4, DIM, dtype=torch.bfloat16)
    assert flash_blocks(query) is None  # no fast path on a CPU
    kernels = {op: lambda *args, op=op: registry._references[op](*args) for op in (OP, BACKWARD_OP)}
    for op, kernel in kernels.items():
        fake = FastPath("fake", "torch", frozenset({"cpu"}), lambda kernel=kernel: kernel)
        monkeypatch.setitem(registry._fast_paths, op, [fake])
    monkeypatch.delenv("TWINKLE_KERNELS", raising=False)
    registry._load.cache_clear()
    try:
        blocks = flash_blocks(query)
        assert isinstance(blocks, FlashBlocks)
        assert (blocks.forward_kernel, blocks.backward_kernel) == tuple(kernels.values())
        assert flash_blocks(query.float()) is None  # flash-attention takes half precision
        monkeypatch.setenv("TWINKLE_KERNELS", "off")
        assert flash_blocks(query) is None
    finally:
        registry._load.cache_clear()
    assert torch.bfloat16 in ring_attention_flash.FLASH_DTYPES
