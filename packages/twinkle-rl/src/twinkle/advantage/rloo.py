"""REINFORCE leave-one-out: each completion's baseline is the mean of its group's others."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from twinkle.advantage.base import Advantage
from twinkle.advantage.groups import check_scale, rewards_P_G


class RLOOAdvantage(Advantage):
    """``A_pg = r_pg - mean over g' != g of r_pg'``, an unbiased baseline (it does not use the
    completion's own reward). ``scale='batch'`` further divides by the batch's standard
    deviation (plus ``epsilon``); ``'group'`` is not offered, since dividing by a group
    statistic that includes the completion would bias the baseline again."""

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
        if check_scale(scale) == "group":
            raise ValueError("RLOOAdvantage takes scale='none' or 'batch', not 'group'")
        rewards_PG = rewards_P_G(rewards, num_generations)
        if num_generations < 2:
            raise ValueError(
                "RLOOAdvantage needs num_generations >= 2 (the others are the baseline)"
            )
        others_PG = (rewards_PG.sum(dim=1, keepdim=True) - rewards_PG) / (num_generations - 1)
        advantages_PG = rewards_PG - others_PG
        if scale == "batch":
            spread = rewards_PG.std() if rewards_PG.numel() > 1 else rewards_PG.new_zeros(())
            advantages_PG = advantages_PG / (spread + self.epsilon)
        return advantages_PG.flatten()
