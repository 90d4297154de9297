"""DeepSeek-V3 and GLM-4.5: multi-head latent attention (DeepSeek), experts routed by
sigmoid scores with a load-balancing bias and group-limited top-k, one shared-experts MLP
added to every token, dense first layers."""

from __future__ import annotations

from twinkle.model.families.base import (
    ATTENTION_TP,
    EXPERTS_WHOLE,
    MLP_TP,
    QK_NORMS_TP,
    HeadSharedTail,
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

DEEPSEEK_V3 = ModelFamily(
    "deepseek_v3",
    ("deepseek_v3",),
    moe=MoeLayout(route=own_forward, shared="shared_experts"),
    tp_plan=DEEPSEEK_V3_TP_PLAN,
)
GLM4_MOE = ModelFamily(
    "glm4_moe",
    ("glm4_moe",),
    moe=MoeLayout(route=own_forward, shared="shared_experts"),
    tp_plan=GLM4_MOE_TP_PLAN,
)
