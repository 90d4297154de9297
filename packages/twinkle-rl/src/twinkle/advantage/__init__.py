"""Advantage estimators (GRPO and friends): rewards laid out prompt by prompt in, one
advantage per completion out."""

from twinkle.advantage.base import Advantage
from twinkle.advantage.grpo import GRPOAdvantage
from twinkle.advantage.rloo import RLOOAdvantage

__all__ = ["Advantage", "GRPOAdvantage", "RLOOAdvantage"]
