"""The expert-parallel MoE forward: route, count, permute, exchange, run, exchange back.

Shapes: N tokens on this rank, k experts per token, E experts in all, ``ep`` ranks each
holding ``E / ep`` consecutive experts (rank ``i`` holds experts ``i*E/ep`` onwards).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

from twinkle.model.transformers.moe.all_to_all import all_to_all, exchange_counts


class _ScaleGradient(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, scale):
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.scale, None


def run_local_experts(experts: nn.Module, tokens: torch.Tensor, counts: list[int]):
    """The experts module's forward under EP: ``tokens`` grouped by local expert, ``counts``
    rows each. A forward of the module (not a read of its weights from outside) so that
    FSDP over ``ep_fsdp`` gathers the weights around it; ``gradient_scale`` (set by
    ``expert_fsdp``) scales the weights' gradients."""
    gate_up, down = experts.gate_up_proj, experts.down_proj
    scale = getattr(experts, "gradient_scale", 1.0)
    if scale != 1.0:
        gate_up, down = _ScaleGradient.apply(gate_up, scale), _ScaleGradient.apply(down, scale)
    outputs = []
    for index, chunk in enumerate(tokens.split(counts)):
        gate, up = F.linear(chunk, gate_up[index]).chunk(2, dim=-1)
        outputs.append(F.linear(experts.act_fn(gate) * up, down[index]))
    return torch.cat(outputs)


def dispatch_and_combine(
    experts: nn.Module,
    hidden: torch.Tensor,
    weights: torch.Tensor,
    expert_ids: torch.Tensor,
    group: dist.ProcessGroup,
) -> torch.Tensor:
    """``hidden`` (N, H), ``weights`` and ``expert_ids`` (N, k) -> (N, H): the weighted sum
    of each token's k expert outputs, the experts running on whichever rank holds them
    (``experts`` is a sharded experts module whose forward is ``run_local_experts``)."""
    ep, local = dist.get_world_size(group), experts.num_experts
    top_k = expert_ids.shape[1]
    flat_ids = expert_ids.reshape(-1)
    # Permute: one row per (token, slot), sorted by global expert, so rank i's rows are
    # contiguous and within them each local expert's rows are too.
    order = torch.argsort(flat_ids, stable=True)
    send = hidden[order // top_k]
    counts = torch.bincount(flat_ids, minlength=ep * local).view(ep, local)
    received_counts = exchange_counts(counts, group)  # [source rank, local expert]
    send_splits, recv_splits = counts.sum(1).tolist(), received_counts.sum(1).tolist()
    received = all_to_all(send, recv_splits, send_splits, group)
    # Arrivals are grouped by source rank; regroup them by local expert.
    local_ids = torch.arange(local, device=hidden.device).repeat(ep)
    by_expert = torch.argsort(
        torch.repeat_interleave(local_ids, received_counts.flatten()), stable=True
    )
    outputs = experts(received[by_expert], received_counts.sum(0).tolist())
    outputs = torch.zeros_like(outputs).index_copy(0, by_expert, outputs)
    returned = all_to_all(outputs, send_splits, recv_splits, group)
    per_slot = torch.zeros_like(returned).index_copy(0, order, returned)
    per_slot = per_slot.view(-1, top_k, hidden.shape[-1])
    return (per_slot * weights.unsqueeze(-1).to(per_slot.dtype)).sum(dim=1)
