"""The Qwen families: Qwen2 / Qwen2.5 (dense, attention biases), Qwen3 (dense, RMSNorm on
queries and keys), Qwen3-MoE (every layer softmax-routed experts) and Qwen3.5 / Qwen3.5-MoE
(linear attention layers; a shared expert behind a sigmoid gate)."""

from __future__ import annotations

from typing import Any

from twinkle.model.families.base import (
    ATTENTION_TP,
    DECODER_LAYOUT,
    DENSE_TP_PLAN,
    EXPERTS_WHOLE,
    MLP_TP,
    QK_NORM_TP_PLAN,
    QK_NORMS_TP,
    MegatronRules,
    ModelFamily,
    MoeLayout,
    TensorParallelPlan,
    mlp_tp,
)
from twinkle.model.families.routing import softmax_top_k


def qwen3_moe_megatron(config: Any) -> dict[str, Any]:
    """Qwen3-MoE's MoE settings as megatron-core names them."""
    if getattr(config, "decoder_sparse_step", 1) != 1 or getattr(config, "mlp_only_layers", None):
        raise ValueError(
            "MegatronModel converts Qwen3-MoE models whose every layer is a mixture of "
            "experts (decoder_sparse_step=1, no mlp_only_layers)"
        )
    return {
        "num_experts": config.num_experts,
        "moe_ffn_hidden_size": config.moe_intermediate_size,
        "topk": config.num_experts_per_tok,
        "pre_softmax": not config.norm_topk_prob,
    }


QWEN2 = ModelFamily(
    "qwen2",
    ("qwen2",),
    megatron=MegatronRules(qkv_bias=True),
    tp_plan=DENSE_TP_PLAN,
    pipeline=DECODER_LAYOUT,
)
QWEN3 = ModelFamily(
    "qwen3",
    ("qwen3",),
    megatron=MegatronRules(qk_norm=True),
    tp_plan=QK_NORM_TP_PLAN,
    pipeline=DECODER_LAYOUT,
)
QWEN3_MOE = ModelFamily(
    "qwen3_moe",
    ("qwen3_moe",),
    moe=MoeLayout(route=softmax_top_k),
    megatron=MegatronRules(qk_norm=True, moe=qwen3_moe_megatron),
    # Attention as Qwen3; the MLP patterns split the dense layers (mlp_only_layers).
    tp_plan=TensorParallelPlan(QK_NORM_TP_PLAN.styles, whole=EXPERTS_WHOLE),
)
QWEN3_5_TP_PLAN = TensorParallelPlan(
    # Full-attention layers: q_proj holds each head's query and output gate side by side
    # (head_dim × 2 per head), so a split by heads keeps both on one rank.
    {**ATTENTION_TP, **QK_NORMS_TP, **MLP_TP, **mlp_tp("layers.*.mlp.shared_expert")},
    widths=(
        "num_attention_heads",
        "num_key_value_heads",
        "intermediate_size",
        "shared_expert_intermediate_size",
    ),
    whole={
        "layers.*.linear_attn": "GatedDeltaNet's fused in_proj_qkv (in_proj_qkvz in "
        "Qwen3-Next) and its depthwise conv1d hold the queries, keys and values of all heads "
        "one after the other: a contiguous split would give one rank all the queries, so "
        "the linear-attention layers stay whole on every tp rank",
        "layers.*.mlp.shared_expert_gate": "one output (the shared expert's scalar gate)",
        **EXPERTS_WHOLE,
    },
)
QWEN3_5_MEGATRON_MISSING = (
    "Qwen3.5's Gated DeltaNet linear-attention layers: megatron-core 0.16's GatedDeltaNet "
    "(experimental_attention_variant='gated_delta_net') computes the delta rule only with "
    "flash-linear-attention's Triton kernels (the GPU-only fla extra; it has no torch path "
    "for the CPU mode), and refuses sequence parallel and packed sequences"
)
QWEN3_5 = ModelFamily(
    "qwen3_5",
    ("qwen3_5_text", "qwen3_5", "qwen3_5_moe_text", "qwen3_5_moe", "qwen3_next"),
    moe=MoeLayout(route=softmax_top_k, shared="shared_expert", shared_gate="shared_expert_gate"),
    tp_plan=QWEN3_5_TP_PLAN,
    megatron_missing=QWEN3_5_MEGATRON_MISSING,
)
