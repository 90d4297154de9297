"""Megatron's local layer spec (neither Transformer Engine nor apex), with norms that allow
sequence parallel.

The local spec builds its norms with megatron-core's ``WrappedTorchNorm``, which refuses
``sequence_parallel`` (megatron/core/transformer/torch_norm.py, ``assert not
config.sequence_parallel``): under sequence parallel each tensor-parallel rank normalises
a slice of the sequence, so the norm's weight gradient is partial and must be summed over
the tensor-parallel ranks. ``TorchRMSNorm`` is the same torch RMSNorm with its weight
marked ``sequence_parallel``, the attribute ``finalize_model_grads`` sums by; every norm
of the spec (layers and the final one) is swapped for it. Without sequence parallel the
mark is False and nothing changes. Under context parallel the local ``DotProductAttention``
(which refuses it) is swapped for ``context_parallel.ContextParallelAttention``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from twinkle.model.megatron.config import GPTSpec
from twinkle.model.megatron.context_parallel import context_parallel_attention


class TorchRMSNorm(torch.nn.RMSNorm):
    """torch's RMSNorm, built with Megatron's norm arguments, sequence-parallel aware."""

    def __init__(self, config: Any, hidden_size: int, eps: float = 1e-5, **unused: Any) -> None:
        super().__init__(hidden_size, eps=eps)
        self.weight.sequence_parallel = bool(config.sequence_parallel)


def _swap(node: Any, old: type, new: type) -> Any:
    """``node`` (a ModuleSpec, a submodules dataclass or a class) with ``old`` swapped for
    ``new`` throughout."""
    from megatron.core.transformer.spec_utils import ModuleSpec

    if node is old:
        return new
    if isinstance(node, ModuleSpec):
        module = new if node.module is old else node.module
        submodules = _swap(node.submodules, old, new)
        return dataclasses.replace(node, module=module, submodules=submodules)
    if dataclasses.is_dataclass(node) and not isinstance(node, type):
        fields = dataclasses.fields(node)
        changes = {f.name: _swap(getattr(node, f.name), old, new) for f in fields}
        return dataclasses.replace(node, **changes)
    return node


def latent_attention_core() -> type:
    """megatron-core 0.16's local ``DotProductAttention`` with the key and value widths
    multi-head latent attention passes (``k_channels``, ``v_channels``).

    NOTE: its MLASelfAttention builds the core attention with those two arguments, which
    only Transformer Engine's attention takes (the base Attention first builds one without
    them): the local spec with MLA fails at build time. The local maths is already right
    for queries and keys of one width and values of another, but for the output's width,
    which it takes from ``kv_channels``."""
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    class LatentDotProductAttention(DotProductAttention):
        def __init__(
            self, *args: Any, k_channels: int | None = None, v_channels: int | None = None, **kw
        ) -> None:
            super().__init__(*args, **kw)
            if v_channels is not None:
                heads = self.num_attention_heads_per_partition
                self.hidden_size_per_partition = heads * v_channels

    return LatentDotProductAttention


def local_block_spec(spec: GPTSpec, config: Any, vp_stage: int | None):
    """The transformer block of this pipeline (and virtual) stage, local spec, torch norms;
    under context parallel, ContextParallelAttention as the core attention."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.dot_product_attention import DotProductAttention
    from megatron.core.transformer.torch_norm import WrappedTorchNorm
    from megatron.core.transformer.transformer_block import (
        TransformerBlockSubmodules,
        get_num_layers_to_build,
    )
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    def layer_spec(moe: bool):
        layer = get_gpt_layer_local_spec(
            num_experts=spec.num_experts if moe else None,
            moe_grouped_gemm=False,
            qk_layernorm=spec.qk_norm,
            multi_latent_attention=bool(spec.mla),
            normalization="RMSNorm",
        )
        layer = _swap(layer, WrappedTorchNorm, TorchRMSNorm)
        if spec.mla:
            layer = _swap(layer, DotProductAttention, latent_attention_core())
        if config.context_parallel_size > 1:
            layer = _swap(layer, DotProductAttention, context_parallel_attention())
        return layer

    layers = get_num_layers_to_build(config, vp_stage=vp_stage)
    offset = get_transformer_layer_offset(config, vp_stage=vp_stage)
    moe_layers = spec.moe_layers or (bool(spec.num_experts),) * spec.num_layers
    specs = {moe: layer_spec(moe) for moe in set(moe_layers)}
    local = [specs[moe_layers[offset + i]] for i in range(layers)]
    return TransformerBlockSubmodules(layer_specs=local, layer_norm=TorchRMSNorm)
