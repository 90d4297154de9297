"""Rotary position embedding of queries and keys, as transformers' ``apply_rotary_pos_emb``.

``q * cos + rotate_half(q) * sin`` (and the same for ``k``), where ``rotate_half`` swaps the
two halves of the head dimension and negates the new first half; ``cos`` and ``sin``
``[B, T, D]`` broadcast over the heads at ``unsqueeze_dim`` (1 for ``[B, H, T, D]``).
"""

from __future__ import annotations

import torch

from twinkle.kernel import registry

OP = "rotary_embedding"


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


def torch_rotary_embedding(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    unsqueeze_dim: int = 1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``q`` ``[B, H, T, D]``, ``k`` ``[B, Hkv, T, D]``, ``cos``/``sin`` ``[B, T, D]``."""
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def rotary_embedding(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    unsqueeze_dim: int = 1,
    backend: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`torch_rotary_embedding`, or a fast path for ``q``'s device (``registry``)."""
    if q.shape[-1] != cos.shape[-1] or cos.shape != sin.shape or q.shape[-1] % 2:
        raise ValueError(
            f"rotary_embedding: cos and sin must share a shape whose last dimension is q's even "
            f"head dimension, got q {tuple(q.shape)}, cos {tuple(cos.shape)}, "
            f"sin {tuple(sin.shape)}"
        )
    return registry.select(OP, q.device, backend)(q, k, cos, sin, unsqueeze_dim)


registry.register_reference(OP, torch_rotary_embedding)
