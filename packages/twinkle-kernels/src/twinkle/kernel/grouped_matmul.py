"""Grouped matmul of MoE experts: rows sorted by expert, each group times its own weight.

``x`` ``[N, K]`` holds the tokens routed to expert 0, then expert 1, ...; ``group_sizes``
``[E]`` says how many; ``weight`` ``[E, K, M]``. Row ``i`` of group ``e`` comes out as
``x[i] @ weight[e]``, ``[N, M]`` in all. On CUDA torch's own ``grouped_mm`` is the fast path
(one kernel for every expert instead of one matmul each).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from twinkle.kernel import registry

OP = "grouped_matmul"


def torch_grouped_matmul(
    x: torch.Tensor, weight: torch.Tensor, group_sizes: torch.Tensor
) -> torch.Tensor:
    """The reference: one matmul per expert."""
    parts = x.split(group_sizes.tolist(), dim=0)
    return torch.cat([part @ weight[e] for e, part in enumerate(parts)], dim=0)


def grouped_matmul(
    x: torch.Tensor, weight: torch.Tensor, group_sizes: torch.Tensor, backend: str | None = None
) -> torch.Tensor:
    """:func:`torch_grouped_matmul`, or a fast path for ``x``'s device (see ``registry``)."""
    if x.dim() != 2 or weight.dim() != 3 or weight.shape[1] != x.shape[1]:
        raise ValueError(
            f"grouped_matmul takes x [N, K] and weight [E, K, M], got {tuple(x.shape)} and "
            f"{tuple(weight.shape)}"
        )
    if group_sizes.shape != weight.shape[:1]:
        raise ValueError(
            f"grouped_matmul: group_sizes must be [{weight.shape[0]}] (one row count per "
            f"expert, summing to x's {x.shape[0]} rows), got {tuple(group_sizes.shape)}"
        )
    return registry.select(OP, x.device, backend)(x, weight, group_sizes)


def load_torch_grouped_mm():
    """torch's ``grouped_mm`` (CUDA, sm80+): group ends as int32 offsets."""

    def run(x, weight, group_sizes):
        offsets = group_sizes.cumsum(0).to(torch.int32)
        return F.grouped_mm(x, weight, offs=offsets)

    return run


registry.register_reference(OP, torch_grouped_matmul)
registry.register_fast_path(
    OP, registry.FastPath("torch_grouped_mm", "torch", frozenset({"cuda"}), load_torch_grouped_mm)
)
