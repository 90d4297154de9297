"""GRPO's group-relative advantage: each completion's reward minus its group's mean."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from twinkle.advantage.base import Advantage
from twinkle.advantage.groups import batch_spread, check_scale, rewards_P_G


class GRPOAdvantage(Advantage):
    """``A_pg = (r_pg - mean_g r_pg) / s``, where ``s`` is the group's standard deviation
    (``scale='group'``, GRPO), the whole batch's (``'batch'``, less noisy for small groups)
    or 1 (``'none'``, Dr. GRPO's unscaled form). ``epsilon`` keeps the division finite: a
    group whose rewards are all equal gets advantage 0 everywhere, never NaN.
    Standard deviations are the unbiased ones (``torch.std``).

    Rewards may hold several components per completion (a list each, or a 2-D array):
    they are summed. With ``num_generations=1`` a group of one has no baseline of its own,
    so the batch's mean is the baseline (REINFORCE with a batch baseline); ``scale`` is then
    ``'batch'`` or ``'none'``."""

    def __init__(self, epsilon: float = 1e-6) -> None:
        if not epsilon > 0:
            raise ValueError(f"epsilon must be positive, got {epsilon}")
        self.epsilon = epsilon

    def __call__(
        self,
        rewards: Sequence[float] | torch.Tensor,
        *,
        num_generations: int,
        scale: str = "group",
    ) -> torch.Tensor:
        scale = check_scale(scale)
        rewards_PG = rewards_P_G(rewards, num_generations)
        if num_generations == 1:
            if scale == "group":
                raise ValueError(
                    "scale='group' needs num_generations >= 2 to measure a spread; with one "
                    "completion per prompt use scale='batch' or 'none' (the batch mean is "
                    "the baseline)"
                )
            centered_PG = rewards_PG - rewards_PG.mean()
        else:
            centered_PG = rewards_PG - rewards_PG.mean(dim=1, keepdim=True)
        if scale == "none":
            return centered_PG.flatten()
        if scale == "group":
            spread = rewards_PG.std(dim=1, keepdim=True)
        else:
            spread = batch_spread(rewards_PG)
        return (centered_PG / (spread + self.epsilon)).flatten()
