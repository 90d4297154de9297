"""Ring attention's maths in one process: every rank of a ring simulated in turn, in float64.

Each simulated rank takes its zigzag chunks of the queries, runs the ring's steps over every
rank's key/value block (block_forward, merged by log-sum-exp) and its backward
(block_backward, each block's gradient summed over the ranks, as the ring carries it home);
the result is held against transformers' own mask and torch's sdpa on the whole sequence,
for a padded batch (left and right padding) and a packed row. The ring's communication runs
under torchrun in test_context_parallel.
"""

import pytest
import torch
from transformers import AutoConfig, masking_utils

from twinkle.hub import resolve_model
from twinkle.model.transformers.strategy.ring_attention import (
    RingLayout,
    block_backward,
    block_forward,
    merge,
    segments_of,
)
from twinkle.model.zigzag import rank_order, sequence_chunks, sequence_order

BATCH, HEADS, KV_HEADS, DIM = 2, 4, 2, 8
SCALE = DIM**-0.5


def hf_mask(length, attention_mask, position_ids) -> torch.Tensor:
    """The (B, 1, T, T) boolean mask transformers builds for sdpa from these inputs."""
    config = AutoConfig.from_pretrained(resolve_model("bundled://tiny-qwen3"))
    config._attn_implementation = "sdpa"
    embeds = torch.empty(position_ids.shape[0], length, 0, dtype=torch.float64)
    return masking_utils.create_causal_mask(
        config=config,
        inputs_embeds=embeds,
        attention_mask=attention_mask,
        cache=None,
        position_ids=position_ids,
        allow_is_causal_skip=False,
    )


def reference(q, k, v, mask):
    group = HEADS // KV_HEADS
    k, v = (t.repeat_interleave(group, dim=1) for t in (k, v))
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=SCALE)


def ring(q, k, v, segments, size):
    """Every rank's forward and backward of the ring, simulated; returns the full output and a
    function from the output's gradient to (dq, dk, dv)."""
    batch, _, length, dim = q.shape
    grouped = q.view(batch, KV_HEADS, HEADS // KV_HEADS, length, dim)
    layouts = [RingLayout(None, size, rank, segments) for rank in range(size)]
    states = []
    out = torch.zeros_like(grouped)
    for rank, layout in enumerate(layouts):
        mine = layout.positions(rank)
        acc, lse = torch.zeros_like(grouped[..., mine, :]), None
        lse = acc.new_full(acc.shape[:-1], float("-inf"))
        for step in range(size):
            source = (rank - step) % size
            keys = layout.positions(source)
            visible = layout.visible(rank, source)
            block = block_forward(
                grouped[..., mine, :], k[:, :, keys], v[:, :, keys], visible, SCALE
            )
            acc, lse = merge(acc, lse, *block)
        out[..., mine, :] = acc
        states.append((mine, acc, lse))

    def backward(dout):
        dout = dout.view(grouped.shape)
        dq, dk, dv = torch.zeros_like(grouped), torch.zeros_like(k), torch.zeros_like(v)
        for rank, (mine, acc, lse) in enumerate(states):
            delta = (dout[..., mine, :] * acc).sum(-1)
            for source in range(size):
                keys = layouts[rank].positions(source)
                visible = layouts[rank].visible(rank, source)
                dq_b, dk_b, dv_b = block_backward(
                    dout[..., mine, :],
                    grouped[..., mine, :],
                    k[:, :, keys],
                    v[:, :, keys],
                    lse,
                    delta,
                    visible,
                    SCALE,
                )
                dq[..., mine, :] += dq_b
                dk[:, :, keys] += dk_b
                dv[:, :, keys] += dv_b
        return dq.view(q.shape), dk, dv

    return out.view(q.shape), backward


def inputs(length, seed=0):
    generator = torch.Generator().manual_seed(seed)
    shapes = [(BATCH, HEADS, length, DIM), (BATCH, KV_HEADS, length, DIM)]
    q, k, v = (
        torch.randn(s, generator=generator, dtype=torch.float64)
        for s in shapes[:1] + shapes[1:] * 2
    )
    return q, k, v, torch.randn(q.shape, generator=generator, dtype=torch.float64)


def check(size, length, attention_mask, position_ids):
    q, k, v, weight = inputs(length)
    mask = hf_mask(length, attention_mask, position_ids)
    real = (attention_mask if attention_mask is not None else torch.ones(BATCH, length)).bool()
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    expected = reference(*leaves, mask)
    # Only real tokens' outputs count: a padding query's output is never read.
    (expected * weight * real[:, None, :, None]).sum().backward()
    got, backward = ring(q, k, v, segments_of(attention_mask, position_ids), size)
    assert got.shape == expected.shape
    diff = (got - expected.detach()).abs() * real[:, None, :, None]
    assert float(diff.max()) < 1e-12
    grads = backward(weight * real[:, None, :, None])
    for leaf, grad in zip(leaves, grads, strict=True):
        assert float((leaf.grad - grad).abs().max()) < 1e-12
    assert float(leaves[1].grad.abs().max()) > 1e-3  # gradients reached the keys


@pytest.mark.parametrize("size", [2, 3])
def test_ring_equals_full_attention_on_padded_rows(size):
    length = 4 * size
    mask = torch.ones(BATCH, length, dtype=torch.long)
    mask[0, length - 3 :] = 0  # right padding
    mask[1, :2] = 0  # left padding
    positions = torch.arange(length).expand(BATCH, -1)
    check(size, length, mask, positions)


@pytest.mark.parametrize("size", [2, 4])
def test_ring_equals_full_attention_on_a_packed_row(size):
    """Packed sequences of 3, 6, 5 and 2 tokens: boundaries fall inside and across chunks."""
    lengths = [3, 6, 5, 2]
    positions = torch.cat([torch.arange(n) for n in lengths]).expand(BATCH, -1)
    check(size, sum(lengths), None, positions)


def test_a_fully_masked_block_merges_to_nothing():
    """A block no query sees (lse -inf) leaves the running result as it was, without NaN."""
    q, k, v, _ = inputs(4)
    grouped = q.view(BATCH, KV_HEADS, 2, 4, DIM)
    out, lse = block_forward(grouped, k, v, torch.ones(BATCH, 4, 4, dtype=torch.bool), SCALE)
    nothing = torch.zeros(BATCH, 4, 4, dtype=torch.bool)
    block = block_forward(grouped, k, v, nothing, SCALE)
    assert bool(torch.isneginf(block[1]).all()) and float(block[0].abs().max()) == 0.0
    merged = merge(out, lse, *block)
    assert torch.equal(merged[0], out) and torch.equal(merged[1], lse)
    empty = merge(torch.zeros_like(out), torch.full_like(lse, float("-inf")), *block)
    assert not bool(torch.isnan(empty[0]).any())


def test_zigzag_order_puts_gathered_pieces_back():
    order = rank_order(12, 3)
    assert order.tolist() == [0, 1, 10, 11, 2, 3, 8, 9, 4, 5, 6, 7]
    assert torch.equal(order[sequence_order(12, 3)], torch.arange(12))
    assert sequence_chunks(8, 2, 1).tolist() == [2, 3, 4, 5]


def test_segments_follow_transformers_packing_and_padding():
    positions = torch.tensor([[0, 1, 2, 0, 1, 0]])
    assert segments_of(None, positions).tolist() == [[0, 0, 0, 1, 1, 2]]
    mask = torch.tensor([[0, 1, 1, 1, 0, 0]])
    assert segments_of(mask, torch.arange(6)[None]).tolist() == [[-1, 0, 0, 0, -1, -1]]
