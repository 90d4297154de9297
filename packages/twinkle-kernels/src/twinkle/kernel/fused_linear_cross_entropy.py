"""Per-token cross-entropy of an lm_head, from hidden states, returned as log-probabilities.

``logps[i] = log_softmax(hidden[i] @ weight.T + bias)[targets[i]]`` (the negative per-token
cross-entropy) and ``predicted[i]``, the argmax token. A fused kernel (liger's) computes
both without ever holding the ``[N, V]`` logits; the reference here does hold them, in
float32: it is what the fast path is checked against. Training on CPU does not use it:
``twinkle.loss``'s chunked logps keeps one chunk of logits at a time, and asks this op for
its fast path only (``registry.fast_path``).
"""

from __future__ import annotations

import torch

from twinkle.kernel import registry

OP = "fused_linear_cross_entropy"


def torch_fused_linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``hidden`` ``[N, H]``, ``weight`` ``[V, H]``, ``targets`` ``[N]``, ``bias`` ``[V]``:
    ``(logps [N] float32 (float64 for float64 inputs), predicted [N] int64)``."""
    logits = hidden @ weight.T if bias is None else torch.addmm(bias, hidden, weight.T)
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    logps = torch.log_softmax(logits, dim=-1).gather(1, targets[:, None].long()).squeeze(1)
    return logps, logits.argmax(dim=-1)


def fused_linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    bias: torch.Tensor | None = None,
    backend: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`torch_fused_linear_cross_entropy`, or a fast path for ``hidden``'s device."""
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(
            f"fused_linear_cross_entropy: hidden [N, H] and weight [V, H] must share H, got "
            f"{tuple(hidden.shape)} and {tuple(weight.shape)}"
        )
    if targets.shape != hidden.shape[:1]:
        raise ValueError(
            f"fused_linear_cross_entropy: targets must be [{hidden.shape[0]}], got "
            f"{tuple(targets.shape)}"
        )
    return registry.select(OP, hidden.device, backend)(hidden, weight, targets, bias)


registry.register_reference(OP, torch_fused_linear_cross_entropy)
