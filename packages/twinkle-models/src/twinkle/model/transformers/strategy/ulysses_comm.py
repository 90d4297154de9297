"""The two collectives of Ulysses sequence parallel, with the gradients they need.

``all_to_all`` swaps which dimension is sharded across the SP group (sequence ↔ heads);
its backward is the reverse swap. ``gather_sequence`` rebuilds a full-sequence tensor on
every rank. When every rank then computes the same thing from it (the loss), the
backward keeps only this rank's slice of the gradient: summing the identical copies would
count each token ``sp`` times. When each rank keeps a different slice of what it computes
from it (a linear-attention layer run on the gathered sequence), the gradients differ per
rank and must be summed: ``reduce_grads=True``.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def _all_to_all(
    x: torch.Tensor, scatter_dim: int, gather_dim: int, group: dist.ProcessGroup
) -> torch.Tensor:
    world = dist.get_world_size(group)
    send = torch.stack(x.chunk(world, dim=scatter_dim)).contiguous()
    received = torch.empty_like(send)
    dist.all_to_all_single(received, send, group=group)
    return torch.cat(received.unbind(0), dim=gather_dim)


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, scatter_dim, gather_dim, group):
        ctx.dims, ctx.group = (scatter_dim, gather_dim), group
        return _all_to_all(x, scatter_dim, gather_dim, group)

    @staticmethod
    def backward(ctx, grad):
        scatter_dim, gather_dim = ctx.dims
        return _all_to_all(grad, gather_dim, scatter_dim, ctx.group), None, None, None


def all_to_all(
    x: torch.Tensor, scatter_dim: int, gather_dim: int, group: dist.ProcessGroup
) -> torch.Tensor:
    """Split ``x`` into ``sp`` chunks along ``scatter_dim``, send chunk ``i`` to rank ``i``,
    and concatenate what arrives along ``gather_dim`` (in rank order). Differentiable."""
    return _AllToAll.apply(x, scatter_dim, gather_dim, group)


class _GatherSequence(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, group, reduce_grads):
        ctx.dim, ctx.group, ctx.reduce_grads = dim, group, reduce_grads
        ctx.rank, ctx.world = dist.get_rank(group), dist.get_world_size(group)
        pieces = [torch.empty_like(x) for _ in range(ctx.world)]
        dist.all_gather(pieces, x.contiguous(), group=group)
        return torch.cat(pieces, dim=dim)

    @staticmethod
    def backward(ctx, grad):
        if ctx.reduce_grads:
            grad = grad.contiguous()
            dist.all_reduce(grad, group=ctx.group)
        return grad.chunk(ctx.world, dim=ctx.dim)[ctx.rank].contiguous(), None, None, None


def gather_sequence(
    x: torch.Tensor, dim: int, group: dist.ProcessGroup, reduce_grads: bool = False
) -> torch.Tensor:
    """All-gather equal shards along ``dim``. The backward keeps this rank's slice of the
    gradient, summed over ranks with ``reduce_grads`` (module docstring says which)."""
    return _GatherSequence.apply(x, dim, group, reduce_grads)
