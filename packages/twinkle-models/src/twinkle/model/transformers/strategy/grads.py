"""Gradient norm and clipping over parameters that may be sharded DTensors.

The norm of a sharded gradient is a partial value on each rank; ``full_tensor()``
reduces it over the mesh, so every rank clips with the same global norm. Gradients on
different meshes (dense parameters over dp × fsdp, experts over ep_fsdp) are normed
per mesh and combined, since one fused kernel cannot take DTensors of two meshes.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch.distributed.tensor import DTensor


def _group_by_mesh(grads: Iterable[torch.Tensor]) -> list[list[torch.Tensor]]:
    groups: dict[object, list[torch.Tensor]] = {}
    for grad in grads:
        key = (grad.device_mesh, grad.placements) if isinstance(grad, DTensor) else None
        groups.setdefault(key, []).append(grad)
    return list(groups.values())


def global_grad_norm(params: Iterable[torch.nn.Parameter]) -> torch.Tensor:
    """The L2 norm of all gradients together, the same value on every rank."""
    params = [p for p in params if p.grad is not None]
    if not params:
        return torch.tensor(0.0)
    # Expert-parallel weights (moe/expert_parallel.py) differ per EP rank: their squares are
    # summed over the EP group as well.
    by_ep_group: dict[object, list[torch.Tensor]] = {}
    for param in params:
        by_ep_group.setdefault(getattr(param, "expert_parallel_group", None), []).append(param.grad)
    squares = []
    for ep_group, grads in by_ep_group.items():
        for group in _group_by_mesh(grads):
            norm = torch.nn.utils.get_total_norm(group, norm_type=2.0)
            if isinstance(norm, DTensor):
                norm = norm.full_tensor()
            square = norm.float().pow(2)
            if ep_group is not None:
                torch.distributed.all_reduce(square, group=ep_group)
            squares.append(square)
    return torch.stack([s.to(squares[0].device) for s in squares]).sum().sqrt()


def clip_grad_norm(
    params: Iterable[torch.nn.Parameter], max_norm: float, *, norm: float | None = None
) -> float:
    """Scale every gradient so their global norm is at most ``max_norm``; returns the norm
    before clipping. Same coefficient as ``torch.nn.utils.clip_grad_norm_``. ``norm``: the
    global norm when the caller computed it (pipeline stages combine theirs)."""
    params = [p for p in params if p.grad is not None]
    total = float(global_grad_norm(params)) if norm is None else norm
    coefficient = max_norm / (total + 1e-6)
    if coefficient < 1.0:
        for param in params:
            param.grad.mul_(coefficient)
    return total
