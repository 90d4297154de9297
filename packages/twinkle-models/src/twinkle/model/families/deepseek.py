"""DeepSeek-V3 and GLM-4.5: multi-head latent attention (DeepSeek), experts routed by
sigmoid scores with a load-balancing bias and group-limited top-k, one shared-experts MLP
added to every token, dense first layers. MegatronModel converts both (``MegatronRules``
below): GLM-4.5 with standard attention and partial rotary, DeepSeek-V3 with megatron-core's
latent attention."""

from __future__ import annotations

from typing import Any

from twinkle.model.families.base import (
    ATTENTION_TP,
    EXPERTS_WHOLE,
    GPT_LAYER_WEIGHTS,
    MLP_TP,
    QK_NORMS_TP,
    HeadSharedTail,
    MegatronRules,
    ModelFamily,
    MoeLayout,
    TensorParallelPlan,
    mlp_tp,
)
from twinkle.model.families.routing import own_forward

MOE_WIDTHS = ("intermediate_size", "moe_intermediate_size")
"""The dense first layers' MLP and the shared experts' (n_shared_experts × this) width."""

DEEPSEEK_V3_TP_PLAN = TensorParallelPlan(
    {
        # MLA: the up-projections from the latents and the output split by heads.
        "layers.*.self_attn.q_proj": "colwise",  # when q_lora_rank is None
        "layers.*.self_attn.q_b_proj": "colwise",
        "layers.*.self_attn.kv_b_proj": "colwise",
        "layers.*.self_attn.o_proj": "rowwise",
        "layers.*.self_attn.kv_a_proj_with_mqa": HeadSharedTail("qk_rope_head_dim"),
        **MLP_TP,
        **mlp_tp("layers.*.mlp.shared_experts"),
    },
    widths=("num_attention_heads", *MOE_WIDTHS),
    whole={
        "layers.*.self_attn.q_a_proj": "the query latent (q_lora_rank) is shared by all heads",
        "layers.*.self_attn.q_a_layernorm": "normalises the whole query latent",
        "layers.*.self_attn.kv_a_proj_with_mqa": "the key/value latent (kv_lora_rank) and the "
        "rope key (qk_rope_head_dim) are shared by all heads; the rope key's gradient is "
        "summed over the tp ranks (HeadSharedTail)",
        "layers.*.self_attn.kv_a_layernorm": "normalises the whole key/value latent",
        **EXPERTS_WHOLE,
    },
)
GLM4_MOE_TP_PLAN = TensorParallelPlan(
    # Standard attention (biases split with their outputs; q/k norms when use_qk_norm).
    {**ATTENTION_TP, **QK_NORMS_TP, **MLP_TP, **mlp_tp("layers.*.mlp.shared_experts")},
    widths=("num_attention_heads", "num_key_value_heads", *MOE_WIDTHS),
    whole=EXPERTS_WHOLE,
)


def sigmoid_moe_megatron(config: Any) -> dict[str, Any]:
    """The MoE settings of DeepSeek-V3 / GLM-4.5 as megatron-core names them: sigmoid
    scores, the load-balancing bias (``e_score_correction_bias``, fixed: transformers
    never updates it), group-limited top-k, the scaling factor, one shared-experts MLP and
    the dense first layers. Refuses the settings where megatron-core's router computes
    something else than transformers'."""
    experts, topk = config.n_routed_experts, config.num_experts_per_tok
    groups, group_topk = config.n_group or 1, config.topk_group or 1
    if bool(config.norm_topk_prob) != (topk > 1):
        raise ValueError(
            f"norm_topk_prob={config.norm_topk_prob} with num_experts_per_tok={topk}: "
            "megatron-core renormalises sigmoid top-k weights exactly when k > 1"
        )
    if groups > 1 and topk // group_topk != 2:
        raise ValueError(
            f"num_experts_per_tok={topk}, topk_group={group_topk}: transformers scores a group "
            "by its top 2 experts, megatron-core by its top num_experts_per_tok // topk_group; "
            "MegatronModel converts the models where these agree"
        )
    dense = config.first_k_dense_replace
    return {
        "num_experts": experts,
        "moe_ffn_hidden_size": config.moe_intermediate_size,
        "topk": topk,
        "score_function": "sigmoid",
        "expert_bias": True,
        "num_groups": groups if groups > 1 else 0,
        "group_topk": group_topk if groups > 1 else 0,
        "scaling_factor": float(config.routed_scaling_factor),
        "shared_ffn_hidden_size": config.n_shared_experts * config.moe_intermediate_size,
        "moe_layers": tuple(i >= dense for i in range(config.num_hidden_layers)),
    }


SIGMOID_MOE_WEIGHTS = {
    "mlp.router.expert_bias": ("copy", ("mlp.gate.e_score_correction_bias",)),
    "mlp.shared_experts.linear_fc1.weight": (
        "fc1",
        ("mlp.shared_experts.gate_proj.weight", "mlp.shared_experts.up_proj.weight"),
    ),
    "mlp.shared_experts.linear_fc2.weight": ("row", ("mlp.shared_experts.down_proj.weight",)),
}
"""The router's bias and the shared experts (tensor-parallel like a dense MLP)."""


def mla_megatron(config: Any) -> dict[str, Any]:
    """DeepSeek-V3's multi-head latent attention as megatron-core's MLATransformerConfig
    names it. megatron-core de-interleaves the rope dimensions as transformers does with
    ``rope_interleave``; its latent norms take the model's epsilon, transformers' 1e-6."""
    if not getattr(config, "rope_interleave", True):
        raise ValueError(
            "rope_interleave=False: megatron-core's latent attention always reads the rope "
            "dimensions interleaved"
        )
    if config.attention_bias:
        raise ValueError("attention_bias=True: MegatronModel converts MLA without biases")
    if config.rms_norm_eps != 1e-6:
        raise ValueError(
            f"rms_norm_eps={config.rms_norm_eps}: transformers normalises MLA's latents with "
            "1e-6 and megatron-core with the model's epsilon; MegatronModel converts models "
            "where the two agree (1e-6)"
        )
    return {
        "q_lora_rank": config.q_lora_rank,
        "kv_lora_rank": config.kv_lora_rank,
        "qk_head_dim": config.qk_nope_head_dim,
        "qk_pos_emb_head_dim": config.qk_rope_head_dim,
        "v_head_dim": config.v_head_dim,
    }


MLA_WEIGHTS = {
    "input_layernorm.weight": ("copy", ("input_layernorm.weight",)),
    "self_attention.linear_q_proj.weight": ("column", ("self_attn.q_proj.weight",)),
    "self_attention.linear_q_down_proj.weight": ("column", ("self_attn.q_a_proj.weight",)),
    "self_attention.q_layernorm.weight": ("copy", ("self_attn.q_a_layernorm.weight",)),
    "self_attention.linear_q_up_proj.weight": ("column", ("self_attn.q_b_proj.weight",)),
    "self_attention.linear_kv_down_proj.weight": (
        "column",
        ("self_attn.kv_a_proj_with_mqa.weight",),
    ),
    "self_attention.kv_layernorm.weight": ("copy", ("self_attn.kv_a_layernorm.weight",)),
    "self_attention.linear_kv_up_proj.weight": ("column", ("self_attn.kv_b_proj.weight",)),
    "self_attention.linear_proj.weight": ("row", ("self_attn.o_proj.weight",)),
    **{k: v for k, v in GPT_LAYER_WEIGHTS.items() if k.startswith(("pre_mlp", "mlp."))},
}
"""MLA's projections: megatron-core's local layers split the down-projections' outputs
over tp too (and gather them back), the up-projections by heads."""

DEEPSEEK_V3_MEGATRON = MegatronRules(
    qk_norm=True,  # the query and key/value latents' norms
    moe=sigmoid_moe_megatron,
    weights={**MLA_WEIGHTS, **SIGMOID_MOE_WEIGHTS},
    attention=mla_megatron,
)

GLM4_MOE_MEGATRON = MegatronRules(
    qk_norm=lambda config: bool(config.use_qk_norm),
    moe=sigmoid_moe_megatron,
    weights={**GPT_LAYER_WEIGHTS, **SIGMOID_MOE_WEIGHTS},
)

DEEPSEEK_V3 = ModelFamily(
    "deepseek_v3",
    ("deepseek_v3",),
    moe=MoeLayout(route=own_forward, shared="shared_experts"),
    megatron=DEEPSEEK_V3_MEGATRON,
    tp_plan=DEEPSEEK_V3_TP_PLAN,
)
GLM4_MOE = ModelFamily(
    "glm4_moe",
    ("glm4_moe",),
    moe=MoeLayout(route=own_forward, shared="shared_experts"),
    megatron=GLM4_MOE_MEGATRON,
    tp_plan=GLM4_MOE_TP_PLAN,
)
