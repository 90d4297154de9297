"""Context parallel without Transformer Engine: the sequence split over cp ranks, attention
over the whole of it.

Megatron cuts a sequence of length T into 2 × cp equal chunks and gives rank r chunks
r and 2 × cp - 1 - r (``megatron.core.utils.get_batch_on_this_cp_rank``), so every rank
gets as much causal work as the others; its rotary embedding takes the same chunks of
the positions (``get_pos_emb_on_this_cp_rank``). ``twinkle.model.zigzag.sequence_chunks``
follows that split.

megatron-core 0.16 runs context parallel only in Transformer Engine's attention; the
local spec's ``DotProductAttention`` refuses it. ``ContextParallelAttention`` takes its
place in the local spec: each rank all-gathers the keys and values of the cp group
(autograd-aware: the backward sums their gradients back onto the rank that computed
them) and attends with its own queries to all of them under a causal mask built from
global positions. A plain all-gather, not ring attention: the memory of the full keys
and values on every rank, without overlapping communication and compute (ring attention
is the optimisation).

The loss sees the whole sequence: per-token logps computed on each rank's chunks are
gathered back into sequence order (``gather_sequence``), and every cp rank computes the
same loss from them. The backward of that gather keeps a rank's own positions only, so
each contribution to the gradient is counted once when Megatron's DDP sums gradients
over data × context parallel ranks.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from twinkle.loss.base import IGNORE_INDEX
from twinkle.model.zigzag import rank_order, sequence_chunks


def cp_size() -> int:
    from megatron.core import parallel_state

    return parallel_state.get_context_parallel_world_size()


def _local_positions(length: int, device=None) -> torch.Tensor:
    from megatron.core import parallel_state

    rank = parallel_state.get_context_parallel_rank()
    return sequence_chunks(length, cp_size(), rank, device)


def split_sequence(tensor: torch.Tensor) -> torch.Tensor:
    """This cp rank's chunks of a (B, T, ...) tensor."""
    return tensor.index_select(1, _local_positions(tensor.shape[1], tensor.device))


class _GatherSequence(torch.autograd.Function):
    """(B, T/cp, ...) chunks of every cp rank -> (B, T, ...) in sequence order. Every rank
    then computes the same function of the result, so the gradient of a rank's chunks is
    its own slice of the output's gradient (no sum over ranks)."""

    @staticmethod
    def forward(ctx, local: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist
        from megatron.core import parallel_state

        group = parallel_state.get_context_parallel_group()
        size = cp_size()
        parts = [torch.empty_like(local) for _ in range(size)]
        dist.all_gather(parts, local.contiguous(), group=group)
        length = local.shape[1] * size
        order = rank_order(length, size, local.device)
        full = torch.empty(
            (local.shape[0], length, *local.shape[2:]), dtype=local.dtype, device=local.device
        )
        full[:, order] = torch.cat(parts, dim=1)
        ctx.length = length
        return full

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return grad.index_select(1, _local_positions(ctx.length, grad.device))


def gather_sequence(local: torch.Tensor) -> torch.Tensor:
    """The full sequence from every cp rank's chunks (autograd-aware, see _GatherSequence)."""
    return _GatherSequence.apply(local)


def shifted_targets(labels: torch.Tensor) -> torch.Tensor:
    """``targets[:, t] = labels[:, t + 1]``: what the logits at t predict, IGNORE_INDEX last.
    Cut into chunks with the inputs, they need no shift across chunk bounds."""
    targets = torch.full_like(labels, IGNORE_INDEX)
    targets[:, :-1] = labels[:, 1:]
    return targets


class _GatherKV(torch.autograd.Function):
    """[s/cp, b, g, h] keys or values of every cp rank, concatenated in rank order along s.
    Every rank's attention used all of them, so the backward sums the gradients over the
    cp group and keeps this rank's slice (a reduce-scatter; gloo has none, so an
    all-reduce there)."""

    @staticmethod
    def forward(ctx, local: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist
        from megatron.core import parallel_state

        group = parallel_state.get_context_parallel_group()
        full = local.new_empty((local.shape[0] * cp_size(), *local.shape[1:]))
        dist.all_gather_into_tensor(full, local.contiguous(), group=group)
        return full

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist
        from megatron.core import parallel_state

        group = parallel_state.get_context_parallel_group()
        grad = grad.contiguous()
        local = grad.shape[0] // cp_size()
        if dist.get_backend(group) == "gloo":
            grad = grad.clone()  # reduced in place; autograd may still hold the original
            dist.all_reduce(grad, group=group)
            start = parallel_state.get_context_parallel_rank() * local
            return grad[start : start + local]
        mine = grad.new_empty((local, *grad.shape[1:]))
        dist.reduce_scatter_tensor(mine, grad, group=group)
        return mine


def _gather_kv(local: torch.Tensor) -> torch.Tensor:
    return _GatherKV.apply(local)


def _rank_order_positions(local_length: int, device) -> torch.Tensor:
    """Global positions of the keys ``_gather_kv`` returns, in its order."""
    size = cp_size()
    return rank_order(local_length * size, size, device)


def _make_attention_class():
    from megatron.core.transformer.module import MegatronModule

    class ContextParallelAttention(MegatronModule):
        """Causal core attention of this cp rank's queries over the keys and values of the
        whole sequence; the local DotProductAttention's maths (grouped-query heads repeated,
        softmax scale 1/sqrt(head_dim), softmax in fp32 when the config says so)."""

        def __init__(
            self,
            config: Any,
            layer_number: int,
            attn_mask_type: Any,
            attention_type: str,
            attention_dropout: float | None = None,
            softmax_scale: float | None = None,
            cp_comm_type: str | None = None,
            pg_collection: Any = None,
        ) -> None:
            super().__init__(config=config)
            from megatron.core import parallel_state

            if config.softmax_type != "vanilla" or config.window_size is not None:
                raise ValueError(
                    "context parallel without Transformer Engine supports plain softmax "
                    "attention over the whole sequence; this model uses "
                    f"softmax_type={config.softmax_type!r}, window_size={config.window_size!r}"
                )
            tp = parallel_state.get_tensor_model_parallel_world_size()
            self.heads = config.num_attention_heads // tp
            self.groups = config.num_query_groups // tp
            self.softmax_scale = softmax_scale or 1.0 / math.sqrt(config.kv_channels)
            self.softmax_in_fp32 = bool(config.attention_softmax_in_fp32)
            self.dropout = torch.nn.Dropout(
                config.attention_dropout if attention_dropout is None else attention_dropout
            )

        def forward(
            self,
            query: torch.Tensor,
            key: torch.Tensor,
            value: torch.Tensor,
            attention_mask: torch.Tensor | None,
            attn_mask_type: Any = None,
            attention_bias: torch.Tensor | None = None,
            packed_seq_params: Any = None,
        ) -> torch.Tensor:
            """[s/cp, b, heads, h] queries, [s/cp, b, groups, h] keys/values -> [s/cp, b, hp]."""
            from megatron.core import tensor_parallel

            if attention_mask is not None or attention_bias is not None or packed_seq_params:
                raise ValueError(
                    "context parallel attention builds its causal mask itself; it takes no "
                    "attention mask, bias or packed sequence parameters"
                )
            key, value = _gather_kv(key), _gather_kv(value)
            if self.heads > self.groups:
                key = key.repeat_interleave(self.heads // self.groups, dim=2)
                value = value.repeat_interleave(self.heads // self.groups, dim=2)
            q = query.permute(1, 2, 0, 3)  # [b, n, sq, h]
            k = key.permute(1, 2, 3, 0)  # [b, n, h, sk]
            scores = torch.matmul(q, k) * self.softmax_scale
            local = query.shape[0]
            q_pos = _local_positions(local * cp_size(), query.device)
            k_pos = _rank_order_positions(local, query.device)
            future = k_pos.unsqueeze(0) > q_pos.unsqueeze(1)  # [sq, sk]
            dtype = scores.dtype
            if self.softmax_in_fp32:
                scores = scores.float()
            probs = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1).to(dtype)
            if self.config.sequence_parallel:
                probs = self.dropout(probs)
            else:
                with tensor_parallel.get_cuda_rng_tracker().fork():
                    probs = self.dropout(probs)
            context = torch.matmul(probs, value.permute(1, 2, 0, 3))  # [b, n, sq, h]
            context = context.permute(2, 0, 1, 3).contiguous()
            return context.view(*context.shape[:2], -1)

    return ContextParallelAttention


_ATTENTION_CLASS: type | None = None


def context_parallel_attention() -> type:
    """The ContextParallelAttention class (built on first use: megatron-core is imported
    only when a MegatronModel is built)."""
    global _ATTENTION_CLASS
    if _ATTENTION_CLASS is None:
        _ATTENTION_CLASS = _make_attention_class()
    return _ATTENTION_CLASS


def context_parallel_logps(
    local_logits: torch.Tensor, labels: torch.Tensor, vocab_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``vocab_parallel_logps`` for logits of this cp rank's chunks and the full (B, T)
    labels: (logps, predicted ids) of the whole sequence, the same on every cp rank."""
    from twinkle.model.megatron.logps import align_with_labels, next_token_logps

    targets = split_sequence(shifted_targets(labels))
    token_logps, predicted = next_token_logps(local_logits, targets, vocab_size)
    token_logps, predicted = gather_sequence(token_logps), gather_sequence(predicted)
    return align_with_labels(token_logps[:, :-1], predicted[:, :-1], labels)
