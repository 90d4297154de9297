"""Mixture-of-experts support: expert parallel for fused-expert Hugging Face MoE models."""

from twinkle.model.transformers.moe.expert_parallel import (
    ExpertParallelConfig,
    apply_expert_parallel,
    expert_data_parallel_groups,
    expert_parameters,
    gather_expert_weights,
    sync_expert_gradients,
)

__all__ = [
    "ExpertParallelConfig",
    "apply_expert_parallel",
    "expert_data_parallel_groups",
    "expert_parameters",
    "gather_expert_weights",
    "sync_expert_gradients",
]
