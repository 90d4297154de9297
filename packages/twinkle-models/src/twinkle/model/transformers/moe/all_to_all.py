"""All-to-all with uneven splits and its gradient: the token exchange of expert parallel."""

from __future__ import annotations

import torch
import torch.distributed as dist


def _exchange(x, output_splits, input_splits, group) -> torch.Tensor:
    out = x.new_empty((sum(output_splits), *x.shape[1:]))
    dist.all_to_all_single(out, x.contiguous(), output_splits, input_splits, group=group)
    return out


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, output_splits, input_splits, group):
        ctx.splits, ctx.group = (output_splits, input_splits), group
        return _exchange(x, output_splits, input_splits, group)

    @staticmethod
    def backward(ctx, grad):
        output_splits, input_splits = ctx.splits
        return _exchange(grad, input_splits, output_splits, ctx.group), None, None, None


def all_to_all(
    x: torch.Tensor,
    output_splits: list[int],
    input_splits: list[int],
    group: dist.ProcessGroup,
) -> torch.Tensor:
    """Send rows ``x[sum(input_splits[:i]) : ...]`` to rank ``i``; receive
    ``output_splits[i]`` rows from rank ``i``, in rank order. The backward sends the
    gradients back the way the rows came."""
    return _AllToAll.apply(x, output_splits, input_splits, group)


def exchange_counts(counts: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """``counts`` (ep, n): row ``i`` goes to rank ``i``; returns (ep, n), row ``i`` from
    rank ``i``. No gradient: these are token counts."""
    received = torch.empty_like(counts)
    dist.all_to_all_single(received.view(-1), counts.contiguous().view(-1), group=group)
    return received
