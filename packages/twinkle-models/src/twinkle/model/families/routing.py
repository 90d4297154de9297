"""How MoE routers pick experts, as expert parallel runs them: the families' files name
one of these as their ``MoeLayout.route``."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional as F


def softmax_top_k(
    gate: nn.Module, hidden: torch.Tensor, dtype: torch.dtype, keep_logits: bool
) -> tuple[Any, torch.Tensor, torch.Tensor]:
    """Softmax over the experts, top-k, renormalised when ``gate.norm_topk_prob`` (Qwen3-MoE,
    Qwen3.5-MoE), with the router matmul in ``dtype`` outside autocast."""
    hidden = hidden.reshape(-1, gate.weight.shape[-1])
    with torch.autocast(hidden.device.type, enabled=False):
        logits = F.linear(hidden.to(dtype), gate.weight.to(dtype))
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    weights, experts = torch.topk(probs, gate.top_k, dim=-1)
    if getattr(gate, "norm_topk_prob", True):
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return (logits if keep_logits else None), weights.to(hidden.dtype), experts


def own_forward(
    gate: nn.Module, hidden: torch.Tensor, dtype: torch.dtype, keep_logits: bool
) -> tuple[Any, torch.Tensor, torch.Tensor]:
    """The router module's own forward, for routers whose choice is more than a softmax:
    DeepSeek-V3's and GLM-4.5's sigmoid scores with a load-balancing bias, group-limited
    top-k and a scaling factor. Those routers compute in float32 whatever ``dtype``;
    a lower router precision is refused where expert parallel is set up."""
    logits, weights, experts = type(gate).forward(gate, hidden)
    return (logits if keep_logits else None), weights.to(hidden.dtype), experts
