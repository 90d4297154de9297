"""RMSNorm as Llama, Qwen2 and Qwen3 compute it: normalised in float32, cast back, scaled.

``weight * (x / sqrt(mean(x**2) + eps)).to(x.dtype)``: the scale multiplies after the cast
(transformers' ``LlamaRMSNorm``, liger's ``casting_mode='llama'``).
"""

from __future__ import annotations

import torch

from twinkle.kernel import registry

OP = "rms_norm"


def torch_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``x`` ``[..., D]``, ``weight`` ``[D]``; the reference."""
    hidden = x.float()
    hidden = hidden * torch.rsqrt(hidden.pow(2).mean(-1, keepdim=True) + eps)
    return weight * hidden.to(x.dtype)


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, backend: str | None = None
) -> torch.Tensor:
    """:func:`torch_rms_norm`, or a fast path for ``x``'s device (see ``registry``)."""
    if weight.shape != x.shape[-1:]:
        raise ValueError(
            f"rms_norm: weight must be [{x.shape[-1]}] (x's last dimension), got "
            f"{tuple(weight.shape)}"
        )
    return registry.select(OP, x.device, backend)(x, weight, eps)


registry.register_reference(OP, torch_rms_norm)
