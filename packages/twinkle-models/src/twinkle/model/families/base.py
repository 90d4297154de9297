"""What a model family declares, read by the generic code: where its MoE blocks keep
their router, experts and shared experts and how the router picks experts (expert
parallel), and how Megatron converts it. One family, one file in this package; adding a
family means adding a file and its tests, not editing branches elsewhere."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

Router = Callable[
    [nn.Module, torch.Tensor, torch.dtype, bool], tuple[Any, torch.Tensor, torch.Tensor]
]
"""``(router module, hidden (N, H), router dtype, keep logits) -> (router logits or None,
top-k weights (N, k), top-k expert ids (N, k))``."""


@dataclass(frozen=True)
class MoeLayout:
    """A family's MoE block: the attribute holding the router (``router``), the fused
    experts (``experts``: 3-D ``gate_up_proj (E, 2I, H)`` and ``down_proj (E, H, I)``),
    the shared experts added to every token's output (``shared``, or None) and the
    sigmoid gate scaling them (``shared_gate``, or None); ``route`` is how the router
    picks the experts (``twinkle.model.families.routing``)."""

    route: Router
    router: str = "gate"
    experts: str = "experts"
    shared: str | None = None
    shared_gate: str | None = None


GPT_LAYER_WEIGHTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "input_layernorm.weight": ("copy", ("input_layernorm.weight",)),
    "self_attention.linear_qkv.weight": (
        "qkv",
        ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"),
    ),
    "self_attention.linear_qkv.bias": (
        "qkv",
        ("self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"),
    ),
    "self_attention.q_layernorm.weight": ("copy", ("self_attn.q_norm.weight",)),
    "self_attention.k_layernorm.weight": ("copy", ("self_attn.k_norm.weight",)),
    "self_attention.linear_proj.weight": ("row", ("self_attn.o_proj.weight",)),
    "pre_mlp_layernorm.weight": ("copy", ("post_attention_layernorm.weight",)),
    "mlp.linear_fc1.weight": ("fc1", ("mlp.gate_proj.weight", "mlp.up_proj.weight")),
    "mlp.linear_fc2.weight": ("row", ("mlp.down_proj.weight",)),
    "mlp.router.weight": ("copy", ("mlp.gate.weight",)),
}
"""The weights of one layer of transformers' standard decoder (Llama, Qwen2/3, Mistral) as
Megatron's GPTModel names them: Megatron name (after ``decoder.layers.<i>.``) -> (layout
kind, Hugging Face names after ``model.layers.<L>.``). The layout kinds are those of
``twinkle.model.megatron.convert`` (``copy``, ``row``, ``qkv``, ``fc1``, ``qkv_fused``,
``fc1_fused``); a family with other names declares its own table."""


@dataclass(frozen=True)
class MegatronRules:
    """How MegatronModel converts a family: ``qk_norm`` (RMSNorm on queries and keys, or
    how the config says whether it has them),
    ``qkv_bias`` (the default when the config has no ``attention_bias``), ``moe`` (reads
    the MoE settings from the config as megatron-core names them, or None for a dense
    family), ``weights`` (its layers' weight names, :data:`GPT_LAYER_WEIGHTS` by default)
    ``lora`` (None when MegatronModel's LoRA, which keeps peft's per-projection form
    (q/k/v/o/gate/up/down, latent attention's q_a/q_b/kv_a/kv_b/o), fits the family;
    otherwise why it does not) and ``attention``
    (None for standard attention; otherwise reads multi-head latent attention's settings
    from the config as megatron-core's MLATransformerConfig names them)."""

    qk_norm: bool | Callable[[Any], bool] = False
    qkv_bias: bool = False
    moe: Callable[[Any], dict[str, Any]] | None = None
    weights: dict[str, tuple[str, tuple[str, ...]]] = field(
        default_factory=lambda: GPT_LAYER_WEIGHTS
    )
    lora: str | None = None
    attention: Callable[[Any], dict[str, Any]] | None = None


TP_STYLES = ("colwise", "rowwise", "replicated_with_grad_allreduce")
"""How a tensor-parallel plan shards a module: ``colwise`` splits a linear's outputs
(each rank computes its heads / its slice of the MLP), ``rowwise`` splits its inputs and
sums the outputs, ``replicated_with_grad_allreduce`` keeps a weight whole on every rank
but sums its gradient, which each rank computes from its own heads (q/k norms)."""


@dataclass(frozen=True)
class HeadSharedTail:
    """A module kept whole on every tp rank whose last ``config.<attribute>`` output
    features feed every attention head: MLA's ``kv_a_proj_with_mqa``, whose rope key
    (``qk_rope_head_dim`` features) is shared by all heads. Each rank's backward gives the
    gradient of its own heads only, so tensor parallel sums that part over the tp ranks."""

    attribute: str


@dataclass(frozen=True)
class TensorParallelPlan:
    """A family's tensor-parallel plan for TransformersModel: ``styles`` maps module name
    patterns under the decoder to a style of ``TP_STYLES`` (or a :class:`HeadSharedTail`);
    ``widths`` are the config attributes the split divides (checked at setup against
    tp_size); ``whole`` names the modules the plan keeps replicated on purpose, and why
    (the modules it names nowhere are replicated too: norms, embeddings, routers)."""

    styles: dict[str, str | HeadSharedTail]
    widths: tuple[str, ...] = ("num_attention_heads", "num_key_value_heads", "intermediate_size")
    whole: dict[str, str] = field(default_factory=dict)


ATTENTION_TP = {
    "layers.*.self_attn.q_proj": "colwise",
    "layers.*.self_attn.k_proj": "colwise",
    "layers.*.self_attn.v_proj": "colwise",
    "layers.*.self_attn.o_proj": "rowwise",
}
QK_NORMS_TP = {
    "layers.*.self_attn.q_norm": "replicated_with_grad_allreduce",
    "layers.*.self_attn.k_norm": "replicated_with_grad_allreduce",
}
MLP_TP = {
    "layers.*.mlp.gate_proj": "colwise",
    "layers.*.mlp.up_proj": "colwise",
    "layers.*.mlp.down_proj": "rowwise",
}


def mlp_tp(prefix: str) -> dict[str, str]:
    """An MLP's split under ``prefix`` (``layers.*.mlp.shared_expert``, say)."""
    return {f"{prefix}.{pattern.rsplit('.', 1)[1]}": s for pattern, s in MLP_TP.items()}


EXPERTS_WHOLE = {
    "layers.*.mlp.experts": "the routed experts stay whole on every tp rank (each computes "
    "them for the same tokens); they split over ep ranks instead (ep_size)",
}

DENSE_TP_PLAN = TensorParallelPlan({**ATTENTION_TP, **MLP_TP})
"""Megatron's layout of a standard decoder: attention heads and MLP width split over the
tensor-parallel ranks, one all-reduce after each of attention and MLP."""

QK_NORM_TP_PLAN = TensorParallelPlan({**ATTENTION_TP, **QK_NORMS_TP, **MLP_TP})


@dataclass(frozen=True)
class PipelineLayout:
    """Where a decoder keeps what pipeline parallel splits: the attribute names, on the
    decoder (``model.get_decoder()``), of the token embedding (first stage), the list of
    layers (split over the stages), the final norm and the rotary embedding (every stage
    computes it), and, on the causal LM, of its head (last stage). Each layer is called as
    transformers' decoders call theirs: ``layer(hidden, attention_mask=<mask of its layer
    type>, position_embeddings=..., position_ids=...)``."""

    embed: str = "embed_tokens"
    layers: str = "layers"
    norm: str = "norm"
    rotary: str = "rotary_emb"
    head: str = "lm_head"


DECODER_LAYOUT = PipelineLayout()
"""The layout of transformers' standard decoders (Llama, Qwen2, Qwen3)."""


@dataclass(frozen=True, eq=False)
class ModelFamily:
    """One family: its name, the ``model_type`` values of its configs, its MoE layout
    (None when dense), its Megatron rules (None when MegatronModel does not convert it)
    its tensor-parallel plan for TransformersModel (``TensorParallelPlan``; None when it
    has none) and its ``pipeline`` layout
    (None: TransformersModel does not split it into pipeline stages); ``megatron_missing``
    says, for a family without Megatron rules, what megatron-core lacks to express it (the
    refusal MegatronModel gives). Compared and hashed by identity: a registered family is
    one object."""

    name: str
    model_types: tuple[str, ...]
    moe: MoeLayout | None = None
    megatron: MegatronRules | None = None
    megatron_missing: str | None = None
    tp_plan: TensorParallelPlan | None = None
    pipeline: PipelineLayout | None = None

    def is_moe_block(self, module: nn.Module) -> bool:
        """Whether ``module`` is one of this family's MoE blocks."""
        if self.moe is None:
            return False
        experts = unwrapped(getattr(module, self.moe.experts, None))
        return (
            isinstance(getattr(module, self.moe.router, None), nn.Module)
            and isinstance(experts, nn.Module)
            and all(getattr(getattr(experts, n, None), "ndim", 0) == 3 for n in EXPERT_WEIGHTS)
        )


EXPERT_WEIGHTS = ("gate_up_proj", "down_proj")


def unwrapped(module: nn.Module | None) -> nn.Module | None:
    """The module under peft's adapter wrappers (``base_layer`` chains)."""
    while isinstance(getattr(module, "base_layer", None), nn.Module):
        module = module.base_layer
    return module
