"""Mixed precision: which autocast dtype a device computes fast, and the context that applies it.

Weights stay in the dtype they were loaded in (float32 unless the user asks
otherwise), so optimizer updates are exact; only the forward pass runs in the
lower precision. On a CPU without fast bf16 kernels, bf16 autocast is 16-22x
slower than float32 (measured on these machines), so 'auto' picks float32 there.
"""

from __future__ import annotations

import contextlib

import torch

PRECISIONS = ("auto", "bf16", "fp16", "fp32", "no")
_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def resolve_precision(mixed_precision: str, device_type: str) -> str:
    """Turn 'auto' into the precision that fits the device; check explicit choices."""
    if mixed_precision not in PRECISIONS:
        raise ValueError(
            f"unknown mixed_precision {mixed_precision!r}; use one of {', '.join(PRECISIONS)}"
        )
    if mixed_precision == "no":
        return "fp32"
    if mixed_precision != "auto":
        return mixed_precision
    if device_type == "cuda" and torch.cuda.is_bf16_supported():
        return "bf16"
    if device_type == "npu":
        return "bf16"
    return "fp32"


def autocast(precision: str, device_type: str) -> contextlib.AbstractContextManager:
    """The autocast context for a forward pass (a no-op for fp32)."""
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device_type, dtype=_DTYPES[precision])
