"""Ulysses attention: an attention function registered with transformers' AttentionInterface.

The model code is untouched: each attention layer projects its local sequence shard to
q, k, v (with RoPE from the global position_ids), then calls the registered function,
which all-to-alls them from sequence-sharded ``(B, H, T/sp, D)`` to head-sharded
``(B, H/sp, T, D)``, runs the model's own sdpa or eager attention on the full sequence
with the full-sequence mask, and all-to-alls the output back to ``(B, T/sp, H, D)``.

A packed row (``cu_seq_lens_q`` in the call) on a device with a varlen attention fast path
(flash-attn on CUDA, torch_npu on NPU: ``twinkle.kernel``) runs that kernel on the heads
instead of the masked sdpa/eager; on a CPU the model's own attention runs, as before.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Callable

import torch
import torch.distributed as dist
from transformers import AttentionInterface
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from twinkle.kernel import fast_path
from twinkle.model.transformers.strategy.ulysses_comm import all_to_all

SUPPORTED_INNER = ("sdpa", "eager")
_names = itertools.count()
WRAPPED: dict[str, str] = {}
"""Each registered Ulysses attention's name -> the implementation it runs on the heads it
holds (what decides, for instance, whether packed sequences stay apart)."""


def _inner_attention(name: str, module: torch.nn.Module) -> Callable:
    if name == "eager":
        # Eager attention lives in each model's modeling file, not in the shared registry.
        return sys.modules[type(module).__module__].eager_attention_forward
    return ALL_ATTENTION_FUNCTIONS[name]


def packed_attention(query, key, value, **kwargs) -> torch.Tensor | None:
    """``(1, T, H, D)`` from head-sharded ``(1, H, T, D)`` q/k/v of a packed row through the
    varlen fast path, or None where the inner attention should run (no fast path on this
    device, not a packed row, a sliding window or dropout)."""
    bounds = kwargs.get("cu_seq_lens_q")
    if bounds is None or query.shape[0] != 1 or kwargs.get("sliding_window") is not None:
        return None
    if kwargs.get("dropout") or kwargs.get("softcap") is not None:
        return None
    varlen = fast_path("varlen_attention", query.device)
    if varlen is None:
        return None
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))
    longest = kwargs.get("max_length_q") or int(bounds.diff().max())
    return varlen(q, k, v, bounds, longest, kwargs.get("scaling")).unsqueeze(0)


def register_ulysses_attention(inner: str, group: dist.ProcessGroup) -> str:
    """Register Ulysses attention around ``inner`` (one of SUPPORTED_INNER) over ``group``;
    returns the name to set as the model's attention implementation."""

    def ulysses_attention(module, query, key, value, attention_mask, **kwargs):
        query, key, value = (all_to_all(t, 1, 2, group) for t in (query, key, value))
        output = packed_attention(query, key, value, **kwargs)
        if output is None:
            output, _ = _inner_attention(inner, module)(
                module, query, key, value, attention_mask, **kwargs
            )
        return all_to_all(output, 1, 2, group), None

    name = f"twinkle_ulysses_{inner}_{next(_names)}"
    AttentionInterface.register(name, ulysses_attention)
    WRAPPED[name] = inner
    return name
