"""Rewards by name: ``REWARDS.get('GSM8KAccuracyReward')``, or a plugin's
``REWARDS.get('ms://org/repo:MyReward')``; register your own with ``@REWARDS.register``."""

from __future__ import annotations

from twinkle.reward.base import Reward
from twinkle.reward.countdown import CountdownAccuracyReward
from twinkle.reward.format import FormatReward
from twinkle.reward.gsm8k import GSM8KAccuracyReward, GSM8KFormatReward
from twinkle.utils import Registry

REWARDS: Registry[type[Reward]] = Registry("reward", base=Reward)

for _reward in (CountdownAccuracyReward, FormatReward, GSM8KAccuracyReward, GSM8KFormatReward):
    REWARDS.register(_reward)
