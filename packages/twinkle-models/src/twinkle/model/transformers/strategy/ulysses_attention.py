"""Ulysses attention: an attention function registered with transformers' AttentionInterface.

The model code is untouched: each attention layer projects its local sequence shard to
q, k, v (with RoPE from the global position_ids), then calls the registered function,
which all-to-alls them from sequence-sharded ``(B, H, T/sp, D)`` to head-sharded
``(B, H/sp, T, D)``, runs the model's own sdpa or eager attention on the full sequence
with the full-sequence mask, and all-to-alls the output back to ``(B, T/sp, H, D)``.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Callable

import torch
import torch.distributed as dist
from transformers import AttentionInterface
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

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


def register_ulysses_attention(inner: str, group: dist.ProcessGroup) -> str:
    """Register Ulysses attention around ``inner`` (one of SUPPORTED_INNER) over ``group``;
    returns the name to set as the model's attention implementation."""

    def ulysses_attention(module, query, key, value, attention_mask, **kwargs):
        query, key, value = (all_to_all(t, 1, 2, group) for t in (query, key, value))
        output, _ = _inner_attention(inner, module)(
            module, query, key, value, attention_mask, **kwargs
        )
        return all_to_all(output, 1, 2, group), None

    name = f"twinkle_ulysses_{inner}_{next(_names)}"
    AttentionInterface.register(name, ulysses_attention)
    WRAPPED[name] = inner
    return name
