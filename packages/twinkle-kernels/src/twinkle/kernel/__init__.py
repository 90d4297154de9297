"""Ops with a torch reference implementation and registered fast paths, and ``kernelize``.

The torch references run anywhere and are what CPU tests use; a fast path (liger-kernel,
flash-attn, flash-linear-attention and torch's grouped_mm on CUDA; torch_npu's fused ops on
NPU) runs only where its package is installed, the tensors are on its device and the
switches (``twinkle.kernel.switches``) allow it. ``backend='torch'`` forces the reference.
"""

# Importing these registers their fast paths by name; none imports its package.
from twinkle.kernel import fla as _fla  # noqa: F401
from twinkle.kernel import flash_attention as _flash_attention  # noqa: F401
from twinkle.kernel import liger as _liger  # noqa: F401
from twinkle.kernel import npu as _npu  # noqa: F401
from twinkle.kernel.causal_conv1d import causal_conv1d, torch_causal_conv1d
from twinkle.kernel.chunk_gated_delta_rule import (
    chunk_gated_delta_rule,
    l2norm,
    torch_chunk_gated_delta_rule,
)
from twinkle.kernel.fused_linear_cross_entropy import (
    fused_linear_cross_entropy,
    torch_fused_linear_cross_entropy,
)
from twinkle.kernel.grouped_matmul import grouped_matmul, torch_grouped_matmul
from twinkle.kernel.kernelize import KernelReport, Replacement, kernelize
from twinkle.kernel.registry import (
    FastPath,
    backends,
    fast_path,
    register_fast_path,
    select,
)
from twinkle.kernel.rms_norm import rms_norm, torch_rms_norm
from twinkle.kernel.rotary_embedding import rotary_embedding, torch_rotary_embedding
from twinkle.kernel.swiglu import swiglu, torch_swiglu
from twinkle.kernel.varlen import cu_seqlens_from_position_ids, is_packed
from twinkle.kernel.varlen_attention import torch_varlen_attention, varlen_attention
from twinkle.kernel.varlen_attention_lse import (
    torch_varlen_attention_lse,
    torch_varlen_attention_lse_backward,
)

__all__ = [
    "FastPath",
    "KernelReport",
    "Replacement",
    "backends",
    "causal_conv1d",
    "chunk_gated_delta_rule",
    "cu_seqlens_from_position_ids",
    "fast_path",
    "fused_linear_cross_entropy",
    "grouped_matmul",
    "is_packed",
    "kernelize",
    "l2norm",
    "register_fast_path",
    "rms_norm",
    "rotary_embedding",
    "select",
    "swiglu",
    "torch_causal_conv1d",
    "torch_chunk_gated_delta_rule",
    "torch_fused_linear_cross_entropy",
    "torch_grouped_matmul",
    "torch_rms_norm",
    "torch_rotary_embedding",
    "torch_swiglu",
    "torch_varlen_attention",
    "torch_varlen_attention_lse",
    "torch_varlen_attention_lse_backward",
    "varlen_attention",
]
