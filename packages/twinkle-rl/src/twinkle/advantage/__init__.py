"""Advantage estimators: group-relative ones (GRPO, RLOO) from rewards laid out prompt by
prompt, one advantage per completion; token-level ones (GAE for PPO with a critic, the
reverse KL of on-policy distillation), one per token; and DAPO's rollout filters."""

from twinkle.advantage.base import Advantage
from twinkle.advantage.dapo import dynamic_sampling, overlong_filter, soft_overlong_penalty
from twinkle.advantage.distillation import ReverseKLAdvantage
from twinkle.advantage.gae import GAEAdvantage
from twinkle.advantage.grpo import GRPOAdvantage
from twinkle.advantage.rloo import RLOOAdvantage

__all__ = [
    "Advantage",
    "GAEAdvantage",
    "GRPOAdvantage",
    "RLOOAdvantage",
    "ReverseKLAdvantage",
    "dynamic_sampling",
    "overlong_filter",
    "soft_overlong_penalty",
]
