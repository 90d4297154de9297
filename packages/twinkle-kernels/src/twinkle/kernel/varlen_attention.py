"""Causal attention over packed sequences (flash-attention's ``varlen`` layout).

``q`` ``[T, H, D]``, ``k``/``v`` ``[T, Hkv, D]`` (``H`` a multiple of ``Hkv``: grouped
queries) hold the tokens of N sequences back to back; ``cu_seqlens`` ``[N + 1]`` gives their
boundaries. Every token attends causally to the tokens of its own sequence only; the
result ``[T, H, D]`` equals running each sequence alone.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from twinkle.kernel import registry
from twinkle.kernel.varlen import check_cu_seqlens

OP = "varlen_attention"


def torch_varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """The reference: sdpa on each sequence alone (``max_seqlen`` is for the kernels)."""
    bounds = check_cu_seqlens(cu_seqlens, q.shape[0]).tolist()
    groups = q.shape[1] // k.shape[1]
    outputs = []
    for start, end in zip(bounds[:-1], bounds[1:], strict=True):
        query, key, value = (t[start:end].transpose(0, 1) for t in (q, k, v))
        key, value = (t.repeat_interleave(groups, dim=0) for t in (key, value))
        attended = F.scaled_dot_product_attention(query, key, value, is_causal=True, scale=scale)
        outputs.append(attended)
    return torch.cat(outputs, dim=1).transpose(0, 1)


def varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int | None = None,
    scale: float | None = None,
    backend: str | None = None,
) -> torch.Tensor:
    """:func:`torch_varlen_attention`, or a fast path for ``q``'s device (see ``registry``)."""
    if q.dim() != 3 or k.shape != v.shape or k.dim() != 3 or q.shape[0] != k.shape[0]:
        raise ValueError(
            f"varlen_attention takes q [T, H, D] and k, v [T, Hkv, D], got q {tuple(q.shape)}, "
            f"k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    if q.shape[1] % k.shape[1]:
        raise ValueError(
            f"varlen_attention: query heads ({q.shape[1]}) must be a multiple of key heads "
            f"({k.shape[1]})"
        )
    if max_seqlen is None:
        max_seqlen = int(cu_seqlens.diff().max())
    implementation = registry.select(OP, q.device, backend)
    return implementation(q, k, v, cu_seqlens, max_seqlen, scale)


registry.register_reference(OP, torch_varlen_attention)
