"""Ops with a torch reference implementation and registered fast paths.

The torch references run anywhere and are what CPU tests use; a fast path (today
flash-linear-attention's Triton kernels) runs only where its package is installed and
the tensors are on its device. ``backend='torch'`` forces the reference.
"""

from twinkle.kernel import fla as _fla  # noqa: F401  (registers the fast paths; imports no fla)
from twinkle.kernel.causal_conv1d import causal_conv1d, torch_causal_conv1d
from twinkle.kernel.chunk_gated_delta_rule import (
    chunk_gated_delta_rule,
    l2norm,
    torch_chunk_gated_delta_rule,
)
from twinkle.kernel.registry import FastPath, backends, register_fast_path, select
from twinkle.kernel.varlen import cu_seqlens_from_position_ids, is_packed

__all__ = [
    "FastPath",
    "backends",
    "causal_conv1d",
    "chunk_gated_delta_rule",
    "cu_seqlens_from_position_ids",
    "is_packed",
    "l2norm",
    "register_fast_path",
    "select",
    "torch_causal_conv1d",
    "torch_chunk_gated_delta_rule",
]
