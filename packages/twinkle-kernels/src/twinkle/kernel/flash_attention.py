"""flash-attn's varlen kernel as the fast path of ``varlen_attention`` on CUDA. Registered by
name; ``flash_attn`` is imported the first time a CUDA tensor asks (see ``registry``)."""

from __future__ import annotations

import importlib
from collections.abc import Callable

import torch

from twinkle.kernel import registry
from twinkle.kernel.varlen_attention import OP as VARLEN_ATTENTION

PACKAGE = "flash_attn"


def load_varlen_attention() -> Callable:
    kernel = importlib.import_module("flash_attn").flash_attn_varlen_func

    def run(q, k, v, cu_seqlens, max_seqlen, scale=None):
        bounds = cu_seqlens.to(torch.int32)  # flash-attn takes int32 boundaries
        return kernel(
            q, k, v, bounds, bounds, max_seqlen, max_seqlen, softmax_scale=scale, causal=True
        )

    return run


registry.register_fast_path(
    VARLEN_ATTENTION,
    registry.FastPath("flash_attn", PACKAGE, frozenset({"cuda"}), load_varlen_attention),
)
