"""liger-kernel's Triton kernels as fast paths on CUDA: RMSNorm, RoPE, SwiGLU and the fused
linear cross-entropy. Registered by name; ``liger_kernel`` is imported the first time a
CUDA tensor asks for one of these ops (see ``registry``)."""

from __future__ import annotations

import importlib
from collections.abc import Callable

from twinkle.kernel import registry
from twinkle.kernel.fused_linear_cross_entropy import OP as FUSED_LINEAR_CROSS_ENTROPY
from twinkle.kernel.rms_norm import OP as RMS_NORM
from twinkle.kernel.rotary_embedding import OP as ROTARY_EMBEDDING
from twinkle.kernel.swiglu import OP as SWIGLU

PACKAGE = "liger_kernel"
DEVICES = frozenset({"cuda"})


def _functional():
    return importlib.import_module("liger_kernel.transformers.functional")


def load_rms_norm() -> Callable:
    kernel = _functional().liger_rms_norm

    def run(x, weight, eps):
        return kernel(x, weight, eps, offset=0.0, casting_mode="llama", in_place=False)

    return run


def load_rotary_embedding() -> Callable:
    kernel = _functional().liger_rope

    def run(q, k, cos, sin, unsqueeze_dim=1):
        return kernel(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)

    return run


def load_swiglu() -> Callable:
    return _functional().liger_swiglu


def load_fused_linear_cross_entropy() -> Callable:
    kernel = _functional().liger_fused_linear_cross_entropy

    def run(hidden, weight, targets, bias=None):
        out = kernel(hidden, weight, targets, bias, reduction="none", return_predicted_tokens=True)
        return out.loss.float().neg(), out.predicted_tokens.long()

    return run


for _op, _load in (
    (RMS_NORM, load_rms_norm),
    (ROTARY_EMBEDDING, load_rotary_embedding),
    (SWIGLU, load_swiglu),
    (FUSED_LINEAR_CROSS_ENTROPY, load_fused_linear_cross_entropy),
):
    registry.register_fast_path(_op, registry.FastPath("liger", PACKAGE, DEVICES, _load))
