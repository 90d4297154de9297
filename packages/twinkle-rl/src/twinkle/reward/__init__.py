"""Reward functions: ``reward(trajectories, ground_truths=None) -> list[float]``, reading the
completion from the last assistant message and the ground truth from ``user_data``."""

from twinkle.reward.base import Reward
from twinkle.reward.countdown import CountdownAccuracyReward
from twinkle.reward.format import FormatReward
from twinkle.reward.gsm8k import GSM8KAccuracyReward, GSM8KFormatReward

__all__ = [
    "CountdownAccuracyReward",
    "FormatReward",
    "GSM8KAccuracyReward",
    "GSM8KFormatReward",
    "Reward",
]
