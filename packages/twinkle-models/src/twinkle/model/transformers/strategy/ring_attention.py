"""Ring attention: exact attention over a sequence split across ranks, keys and values passed
round a ring.

Each rank of a ring holds its zigzag chunks of the sequence (``twinkle.model.zigzag``) and the
queries, keys and values its attention layers project from them. Attention runs in ``size``
steps: at step s a rank attends its queries to the key/value block of rank ``rank - s`` while
sending the block it holds to ``rank + 1`` and receiving the next from ``rank - 1``; each
step's partial output is merged into the running one by their log-sum-exps (what softmax over
the union of the blocks gives, without ever holding the whole sequence's keys). The backward
runs the same ring: the key/value blocks go round once more, and each block's gradient
accumulator travels with it, every rank adding its share, until it arrives home one step
after the last (``size - 1`` block sends and ``size`` gradient sends per layer). Both
streams travel while a rank computes: an accumulator is waited for only when the gradients
of its block are there to add.

The mask is computed per block from where the tokens sit (``RingLayout``): causal by index in
the row, and a key is visible only to queries of its own segment, the segments being the
sequences of a packed row (from the position_ids, as transformers reads them) or, in a padded
row, the real tokens (segment 0) and the padding (-1, never visible to a real token). This
is the mask transformers builds for sdpa and eager attention, so outputs equal theirs.

The blocks run in plain torch (``TorchBlocks``: float32 scores, any device), the CPU path
and the reference, or, for half-precision tensors on a device with flash-attention's varlen
kernels, through them (``ring_attention_flash.FlashBlocks``: flash-attn on CUDA).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from twinkle.model.transformers.strategy.ring_attention_flash import flash_blocks
from twinkle.model.zigzag import sequence_chunks

RING_ATTENTION = "twinkle_ring_attention"
"""The attention implementation name ring attention is registered under (transformers'
AttentionInterface); the layout of each forward arrives as the ``ring_layout`` keyword."""


@dataclass
class RingLayout:
    """Where one forward's tokens sit: the ring (``group``; this rank is ``rank`` of
    ``size``) and the (B, T) segment ids of the whole padded row, which every ring rank
    holds (context-parallel peers read the same batch)."""

    group: dist.ProcessGroup | None
    size: int
    rank: int
    segments: torch.Tensor
    _positions: dict[int, torch.Tensor] = field(default_factory=dict, repr=False)
    flash_blocks: dict = field(default_factory=dict, repr=False)
    """(query rank, key rank) -> the block's varlen form (``ring_attention_flash``), built
    once per forward on the first layer that asks."""

    @property
    def length(self) -> int:
        return self.segments.shape[1]

    def positions(self, rank: int) -> torch.Tensor:
        """The row positions of ring rank ``rank``'s tokens, in its local order."""
        if rank not in self._positions:
            self._positions[rank] = sequence_chunks(
                self.length, self.size, rank, self.segments.device
            )
        return self._positions[rank]

    def visible(self, query_rank: int, key_rank: int) -> torch.Tensor:
        """(B, Tq, Tk): which keys of ``key_rank``'s block each query of ``query_rank`` sees."""
        q_pos, k_pos = self.positions(query_rank), self.positions(key_rank)
        causal = k_pos.unsqueeze(0) <= q_pos.unsqueeze(1)
        q_seg, k_seg = self.segments[:, q_pos], self.segments[:, k_pos]
        return causal & (q_seg.unsqueeze(2) == k_seg.unsqueeze(1))


def segments_of(attention_mask: torch.Tensor | None, position_ids: torch.Tensor) -> torch.Tensor:
    """(B, T) segment ids: with a mask, 0 for its tokens and -1 for padding; without one, the
    packed sequences, a new one wherever the positions do not step by one (transformers'
    ``find_packed_sequence_indices``)."""
    if attention_mask is not None:
        return torch.where(attention_mask.bool(), 0, -1)
    steps = torch.diff(position_ids, prepend=position_ids[:, :1] - 1, dim=-1)
    return (steps != 1).cumsum(-1)


# ---- the maths of one block, on grouped heads ------------------------------------------------
# q: (B, Hkv, G, Tq, D), G query heads per key/value head; k, v: (B, Hkv, Tk, D);
# visible: (B, Tq, Tk); out: (B, Hkv, G, Tq, D); lse: (B, Hkv, G, Tq), -inf where no key is seen.


def _finite(lse: torch.Tensor) -> torch.Tensor:
    return torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))


def _scores(q, k, visible, scale) -> torch.Tensor:
    scores = torch.matmul(q, k.unsqueeze(2).transpose(-1, -2)).to(_accumulator(q.dtype)) * scale
    return scores.masked_fill(~visible[:, None, None], float("-inf"))


def _accumulator(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)


def block_forward(q, k, v, visible, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of ``q`` to one key/value block: (output normalised over the block, lse)."""
    scores = _scores(q, k, visible, scale)
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.exp(scores - _finite(lse).unsqueeze(-1))
    return torch.matmul(probs, v.unsqueeze(2).to(probs.dtype)), lse


def merge(out, lse, block_out, block_lse) -> tuple[torch.Tensor, torch.Tensor]:
    """Two partial attentions over disjoint key sets -> the attention over their union."""
    total = torch.logaddexp(lse, block_lse)
    safe = _finite(total)
    out = out * torch.exp(lse - safe).unsqueeze(-1) + block_out * torch.exp(
        block_lse - safe
    ).unsqueeze(-1)
    return out, total


def block_backward(dout, q, k, v, lse, delta, visible, scale: float):
    """This block's share of (dq, dk, dv), given the final output's lse and
    ``delta = (dout * out).sum(-1)`` (the softmax backward's row term)."""
    probs = torch.exp(_scores(q, k, visible, scale) - _finite(lse).unsqueeze(-1))
    acc = probs.dtype
    dout, q, k, v = (t.to(acc) for t in (dout, q, k, v))
    dv = torch.einsum("bhgqk,bhgqd->bhkd", probs, dout)
    dprobs = torch.einsum("bhgqd,bhkd->bhgqk", dout, v)
    dscores = probs * (dprobs - delta.unsqueeze(-1)) * scale
    dq = torch.einsum("bhgqk,bhkd->bhgqd", dscores, k)
    dk = torch.einsum("bhgqk,bhgqd->bhkd", dscores, q)
    return dq, dk, dv


class TorchBlocks:
    """The blocks in plain torch from the layout's masks (``block_forward``/``_backward``);
    a block no query sees is None."""

    @staticmethod
    def forward(layout: RingLayout, key_rank: int, q, k, v, scale: float, accumulate):
        visible = layout.visible(layout.rank, key_rank)
        return block_forward(q, k, v, visible, scale) if visible.any() else None

    @staticmethod
    def backward(layout: RingLayout, key_rank: int, dout, q, k, v, out, lse, scale: float):
        visible = layout.visible(layout.rank, key_rank)
        if not visible.any():
            return None
        delta = (dout * out).sum(-1)
        return block_backward(dout, q, k, v, lse, delta, visible, scale)


# ---- the ring ----------------------------------------------------------------------------------


class _Ring:
    """Send to the next rank of the group while receiving from the previous one."""

    def __init__(self, layout: RingLayout) -> None:
        self.group = layout.group
        self.next = dist.get_global_rank(self.group, (layout.rank + 1) % layout.size)
        self.prev = dist.get_global_rank(self.group, (layout.rank - 1) % layout.size)

    def pass_on(self, tensor: torch.Tensor, tag: int = 0):
        """Start passing ``tensor`` on; the returned callable waits and gives what arrived.
        ``tag`` keeps two streams in flight at once (blocks and their gradients) apart."""
        received = torch.empty_like(tensor)
        works = dist.batch_isend_irecv(
            [
                dist.P2POp(dist.isend, tensor, self.next, self.group, tag),
                dist.P2POp(dist.irecv, received, self.prev, self.group, tag),
            ]
        )

        def wait() -> torch.Tensor:
            for work in works:
                work.wait()
            return received

        return wait


class RingAttention(torch.autograd.Function):
    """Exact attention of this rank's queries to the keys and values of every ring rank;
    grouped heads as transformers lays them out, q (B, H, T, D), k/v (B, Hkv, T, D)."""

    @staticmethod
    def forward(ctx, q, k, v, layout: RingLayout, scale: float):
        batch, heads, length, dim = q.shape
        grouped = q.view(batch, k.shape[1], heads // k.shape[1], length, dim)
        ring, blocks = _Ring(layout), flash_blocks(q) or TorchBlocks()
        kv = torch.stack([k, v]).contiguous()
        out = grouped.new_zeros(grouped.shape, dtype=_accumulator(q.dtype))
        lse = out.new_full(grouped.shape[:-1], float("-inf"))
        for step in range(layout.size):
            arriving = ring.pass_on(kv) if step + 1 < layout.size else None
            key_rank = (layout.rank - step) % layout.size
            block = blocks.forward(layout, key_rank, grouped, kv[0], kv[1], scale, out.dtype)
            if block is not None:
                out, lse = merge(out, lse, *block)
            if arriving is not None:
                kv = arriving()
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.layout, ctx.scale, ctx.blocks = layout, scale, blocks
        return out.view(q.shape).to(q.dtype)

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        layout, scale, blocks = ctx.layout, ctx.scale, ctx.blocks
        grouped = q.view(out.shape)
        dout = dout.reshape(out.shape).to(out.dtype)
        ring = _Ring(layout)
        kv = torch.stack([k, v]).contiguous()
        dq = torch.zeros_like(out)
        dkv = kv.new_zeros(kv.shape, dtype=out.dtype)
        # The gradient accumulator of the block held, travelling towards this rank while the
        # block's own gradients are computed (None at step 0: this rank's block, from zero).
        accumulator = None
        for step in range(layout.size):
            arriving = ring.pass_on(kv) if step + 1 < layout.size else None
            key_rank = (layout.rank - step) % layout.size
            grads = blocks.backward(layout, key_rank, dout, grouped, kv[0], kv[1], out, lse, scale)
            if accumulator is not None:
                dkv = accumulator()
            if grads is not None:
                dq_b, dk_b, dv_b = grads
                dq += dq_b
                dkv[0] += dk_b
                dkv[1] += dv_b
            # The block's gradient goes on with it; after the last step it arrives home.
            accumulator = ring.pass_on(dkv, tag=1)
            if arriving is not None:
                kv = arriving()
        dkv = accumulator()
        return dq.view(q.shape).to(q.dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype), None, None


def ring_attention(module, query, key, value, attention_mask, scaling=None, **kwargs):
    """The attention function registered as RING_ATTENTION: transformers calls it with each
    layer's (B, H, T_local, D) projections; returns (B, T_local, H, D) and no weights."""
    layout = kwargs.get("ring_layout")
    if layout is None:
        raise RuntimeError(
            "ring attention runs inside a context-parallel forward: the batch must come "
            "through ContextParallel.shard, which passes the ring_layout"
        )
    if attention_mask is not None:
        raise ValueError("ring attention builds its mask from the ring_layout; got a mask too")
    if kwargs.get("sliding_window") is not None:
        raise NotImplementedError("ring attention runs full attention, not a sliding window")
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    output = RingAttention.apply(query, key, value, layout, scale)
    return output.transpose(1, 2).contiguous(), None
