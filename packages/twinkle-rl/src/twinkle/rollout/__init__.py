"""Multi-turn rollouts (token in, token out) and asynchronous RL with bounded staleness."""

from twinkle.rollout.async_rl import AsyncRollouts, VersionedBatch
from twinkle.rollout.multi_turn import MultiTurnRollout, ResponseParser
from twinkle.rollout.observation import observation_text, observation_tokens
from twinkle.rollout.trajectory import RolloutTrajectory

__all__ = [
    "AsyncRollouts",
    "MultiTurnRollout",
    "RolloutTrajectory",
    "VersionedBatch",
    "ResponseParser",
    "observation_text",
    "observation_tokens",
]
