"""GatedDeltaNetPaddingFreePatch: Qwen3.5 / Qwen3-Next linear attention on packed rows.

Their GatedDeltaNet layers carry a recurrent state along the whole row, so sequences
packed into one row would leak into each other (transformers' torch fallback refuses
``cu_seqlens``; its short convolution ignores them). The patch wraps, per instance:

- each decoder layer holding a ``linear_attn``: when its ``position_ids`` restart inside
  the row and no ``cu_seq_lens_q`` came with the call, it derives them, so the linear
  attention learns where the sequences are;
- each GatedDeltaNet: given ``cu_seq_lens_q`` and no cache, it runs the varlen causal
  conv1d and gated delta rule of ``twinkle.kernel`` (the torch reference on CPU,
  flash-linear-attention on CUDA when installed), whose state restarts at every boundary.
  Otherwise (generation, unpacked batches) the layer's own forward runs.

The steps of the varlen forward are separate functions (``project``, ``mix_tokens``,
``gate_and_project_out``) so that sequence parallel can put its all-to-all between them
(the documents' ``Qwen3_5GatedDeltaNetUlyssesPatch``): the kernels take ``[B, T, H, D]``
tensors with any number of heads.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from twinkle.kernel import causal_conv1d, chunk_gated_delta_rule
from twinkle.kernel.varlen import cu_seqlens_from_position_ids, is_packed
from twinkle.patch.base import PATCHES, Patch

MARK = "_twinkle_padding_free"


def is_gated_delta_net(module: nn.Module) -> bool:
    return type(module).__name__.endswith("GatedDeltaNet") and all(
        hasattr(module, name) for name in ("A_log", "dt_bias", "conv1d", "out_proj", "norm")
    )


def linear_attention_layers(model: nn.Module) -> Iterator[tuple[nn.Module, nn.Module]]:
    """``(decoder_layer, gated_delta_net)`` for every decoder layer with linear attention."""
    for module in model.modules():
        attention = getattr(module, "linear_attn", None)
        if isinstance(attention, nn.Module) and is_gated_delta_net(attention):
            yield module, attention


def project(
    module: nn.Module, hidden_states: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The input projections: ``mixed_qkv [B, T, 2*key_dim + value_dim]`` (the conv's input),
    the output gate ``z [B, T, HV, Dv]``, and ``b``, ``a`` ``[B, T, HV]``."""
    batch, length, _ = hidden_states.shape
    if hasattr(module, "in_proj_qkvz"):  # Qwen3-Next: fused projections, grouped by key head
        query, key, value, z, b, a = module.fix_query_key_value_ordering(
            module.in_proj_qkvz(hidden_states), module.in_proj_ba(hidden_states)
        )
        mixed_qkv = torch.cat([x.reshape(batch, length, -1) for x in (query, key, value)], -1)
        return mixed_qkv, z, b, a
    z = module.in_proj_z(hidden_states).reshape(batch, length, -1, module.head_v_dim)
    return (
        module.in_proj_qkv(hidden_states),
        z,
        module.in_proj_b(hidden_states),
        module.in_proj_a(hidden_states),
    )


def mix_tokens(
    module: nn.Module,
    mixed_qkv: torch.Tensor,
    b: torch.Tensor,
    a: torch.Tensor,
    cu_seqlens: torch.Tensor,
) -> torch.Tensor:
    """Short convolution, then the gated delta rule, each restarting at every boundary of
    ``cu_seqlens``; returns the core output ``[B, T, HV, Dv]``."""
    batch, length, _ = mixed_qkv.shape
    mixed_qkv = causal_conv1d(
        mixed_qkv,
        module.conv1d.weight.squeeze(1),
        module.conv1d.bias,
        activation=module.activation,
        cu_seqlens=cu_seqlens,
    )
    query, key, value = torch.split(
        mixed_qkv, [module.key_dim, module.key_dim, module.value_dim], dim=-1
    )
    query = query.reshape(batch, length, -1, module.head_k_dim)
    key = key.reshape(batch, length, -1, module.head_k_dim)
    value = value.reshape(batch, length, -1, module.head_v_dim)
    beta = b.sigmoid()
    g = -module.A_log.float().exp() * F.softplus(a.float() + module.dt_bias)
    core, _ = chunk_gated_delta_rule(
        query, key, value, g, beta, use_qk_l2norm_in_kernel=True, cu_seqlens=cu_seqlens
    )
    return core


def gate_and_project_out(module: nn.Module, core: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """The gated RMS norm per value head, then the output projection: ``[B, T, hidden]``."""
    batch, length = core.shape[:2]
    gated = module.norm(core.reshape(-1, core.shape[-1]), z.reshape(-1, z.shape[-1]))
    return module.out_proj(gated.reshape(batch, length, -1))


def varlen_forward(
    module: nn.Module,
    hidden_states: torch.Tensor,
    cu_seqlens: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """A GatedDeltaNet's forward on a packed row, each sequence on its own."""
    if attention_mask is not None and attention_mask.dim() == 2:
        hidden_states = (hidden_states * attention_mask[:, :, None]).to(hidden_states.dtype)
    mixed_qkv, z, b, a = project(module, hidden_states)
    core = mix_tokens(module, mixed_qkv, b, a, cu_seqlens)
    return gate_and_project_out(module, core, z)


def _linear_attention_forward(module: nn.Module, original):
    @functools.wraps(original)
    def forward(hidden_states, cache=None, attention_mask=None, **kwargs):
        cu_seqlens = kwargs.get("cu_seq_lens_q")
        if cu_seqlens is None:
            return original(hidden_states, cache=cache, attention_mask=attention_mask, **kwargs)
        if cache is not None:
            raise ValueError(
                "packed sequences (several per row) cannot share a cache: call the model with "
                "use_cache=False for padding-free training"
            )
        return varlen_forward(module, hidden_states, cu_seqlens, attention_mask)

    return forward


def _decoder_layer_forward(original):
    @functools.wraps(original)
    def forward(*args, **kwargs):
        positions = kwargs.get("position_ids")
        if (
            kwargs.get("cu_seq_lens_q") is None
            and positions is not None
            and positions.dim() == 2
            and positions.shape[0] == 1
            and is_packed(positions)
        ):
            kwargs["cu_seq_lens_q"] = cu_seqlens_from_position_ids(positions)
        return original(*args, **kwargs)

    return forward


@PATCHES.register
class GatedDeltaNetPaddingFreePatch(Patch):
    """Makes Qwen3.5 / Qwen3-Next linear attention keep packed sequences apart (see the
    module docstring). Applied by ``apply_for_batch`` when a packed batch meets such a model."""

    for_packed_batches = True

    def applies_to(self, model: nn.Module) -> bool:
        return next(linear_attention_layers(model), None) is not None

    def _patch(self, model: nn.Module) -> None:
        for layer, attention in linear_attention_layers(model):
            if getattr(attention, MARK, False):
                continue
            layer.forward = _decoder_layer_forward(layer.forward)
            attention.forward = _linear_attention_forward(attention, attention.forward)
            setattr(attention, MARK, True)
