"""Rewards by name: ``REWARDS.get('GSM8KAccuracyReward')``, or a plugin's
``REWARDS.get('ms://org/repo:MyReward')``; register your own with ``@REWARDS.register``.
Every reward ``twinkle.reward`` exports is registered."""

from __future__ import annotations

import twinkle.reward
from twinkle.reward.base import Reward
from twinkle.utils import Registry

REWARDS: Registry[type[Reward]] = Registry("reward", base=Reward)
REWARDS.register_exported(twinkle.reward)
