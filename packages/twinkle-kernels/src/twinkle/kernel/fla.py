"""flash-linear-attention's varlen kernels as fast paths, on CUDA devices only.

Registered by name only: ``fla`` is imported the first time a CUDA tensor asks for one
of these ops (see ``registry``), never at import time, and never for a CPU tensor.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

import torch

from twinkle.kernel import registry
from twinkle.kernel.causal_conv1d import OP as CAUSAL_CONV1D
from twinkle.kernel.chunk_gated_delta_rule import OP as CHUNK_GATED_DELTA_RULE

PACKAGE = "fla"
DEVICES = frozenset({"cuda"})


def _cu_seqlens(cu_seqlens: torch.Tensor | None) -> torch.Tensor | None:
    return None if cu_seqlens is None else cu_seqlens.long()  # fla indexes with int64


def load_chunk_gated_delta_rule() -> Callable:
    kernel = importlib.import_module("fla.ops.gated_delta_rule").chunk_gated_delta_rule

    def run(q, k, v, g, beta, *, cu_seqlens=None, **kwargs):
        return kernel(q, k, v, g, beta, cu_seqlens=_cu_seqlens(cu_seqlens), **kwargs)

    return run


def load_causal_conv1d() -> Callable:
    try:
        module = importlib.import_module("fla.modules.causal_conv1d")
    except ImportError:  # fla before 0.5 kept it in fla.modules.convolution
        module = importlib.import_module("fla.modules.convolution")
    kernel = module.causal_conv1d

    def run(x, weight, bias=None, *, activation=None, cu_seqlens=None):
        out, _ = kernel(x, weight, bias, activation=activation, cu_seqlens=_cu_seqlens(cu_seqlens))
        return out

    return run


registry.register_fast_path(
    CHUNK_GATED_DELTA_RULE, registry.FastPath("fla", PACKAGE, DEVICES, load_chunk_gated_delta_rule)
)
registry.register_fast_path(
    CAUSAL_CONV1D, registry.FastPath("fla", PACKAGE, DEVICES, load_causal_conv1d)
)
