"""REINFORCE leave-one-out: each completion's baseline is the mean of its group's others."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from twinkle.advantage.base import Advantage
from twinkle.advantage.groups import batch_spread, check_scale, rewards_P_G


class RLOOAdvantage(Advantage):
    """``A_pg = r_pg - mean over g' != g of r_pg'``, an unbiased baseline (it does not use the
    completion's own reward). ``scale`` takes GRPO's options: ``'none'`` (the default, the
    unbiased estimator), ``'group'`` (divided by the group's standard deviation) or
    ``'batch'`` (by the batch's), each plus ``epsilon``; the group scale brings back a
    small bias, since the group's spread includes the completion. Several reward
    components per completion are summed."""

    def __init__(self, epsilon: float = 1e-6) -> None:
        if not epsilon > 0:
            raise ValueError(f"epsilon must be positive, got {epsilon}")
        self.epsilon = epsilon

    def __call__(
        self,
        rewards: Sequence[float] | torch.Tensor,
        *,
        num_generations: int,
        scale: str = "none",
    ) -> torch.Tensor:
        scale = check_scale(scale)
        rewards_PG = rewards_P_G(rewards, num_generations)
        if num_generations < 2:
            raise ValueError(
                "RLOOAdvantage needs num_generations >= 2 (the others are the baseline); "
                "for one completion per prompt use GRPOAdvantage(scale='batch')"
            )
        others_PG = (rewards_PG.sum(dim=1, keepdim=True) - rewards_PG) / (num_generations - 1)
        advantages_PG = rewards_PG - others_PG
        if scale == "group":
            advantages_PG = advantages_PG / (rewards_PG.std(dim=1, keepdim=True) + self.epsilon)
        elif scale == "batch":
            advantages_PG = advantages_PG / (batch_spread(rewards_PG) + self.epsilon)
        return advantages_PG.flatten()
