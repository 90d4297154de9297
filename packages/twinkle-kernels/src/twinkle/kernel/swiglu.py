"""SwiGLU, the gated activation of Llama/Qwen MLPs: ``silu(gate) * up``."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from twinkle.kernel import registry

OP = "swiglu"


def torch_swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``gate`` and ``up`` of one shape; the reference."""
    return F.silu(gate) * up


def swiglu(gate: torch.Tensor, up: torch.Tensor, backend: str | None = None) -> torch.Tensor:
    """:func:`torch_swiglu`, or a fast path for ``gate``'s device (see ``registry``)."""
    if gate.shape != up.shape:
        raise ValueError(
            f"swiglu: gate and up must have one shape, got {tuple(gate.shape)} and "
            f"{tuple(up.shape)}"
        )
    return registry.select(OP, gate.device, backend)(gate, up)


registry.register_reference(OP, torch_swiglu)
