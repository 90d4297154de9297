"""The Qwen families: Qwen2 / Qwen2.5 (dense, attention biases), Qwen3 (dense, RMSNorm on
queries and keys), Qwen3-MoE (every layer softmax-routed experts) and Qwen3.5 / Qwen3.5-MoE
(linear attention layers; a shared expert behind a sigmoid gate)."""

from __future__ import annotations

from typing import Any

from twinkle.model.families.base import (
    DECODER_LAYOUT,
    DENSE_TP_PLAN,
    QK_NORM_TP_PLAN,
    MegatronRules,
    ModelFamily,
    MoeLayout,
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
)
QWEN3_5 = ModelFamily(
    "qwen3_5",
    ("qwen3_5_text", "qwen3_5", "qwen3_5_moe_text", "qwen3_5_moe", "qwen3_next"),
    moe=MoeLayout(route=softmax_top_k, shared="shared_expert", shared_gate="shared_expert_gate"),
)
