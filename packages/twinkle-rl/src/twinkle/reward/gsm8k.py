"""Rewards for GSM8K-style answers: the final line ``#### <number>``."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from twinkle.reward.base import Reward
from twinkle.reward.completion import completion_text, ground_truth

_FINAL = re.compile(r"####\s*(-?[\d,]*\.?\d+)\s*$")


def final_answer(completion: str) -> str | None:
    """The number on the completion's last line ``#### <number>`` (commas dropped), or None."""
    match = _FINAL.search(completion.strip())
    return None if match is None else match.group(1).replace(",", "")


def _same_number(a: str, b: str) -> bool:
    try:
        return abs(float(a) - float(b)) < 1e-6
    except ValueError:
        return a.strip() == b.strip()


class GSM8KAccuracyReward(Reward):
    """1.0 when the final ``#### <number>`` equals ``user_data[0]['answer']`` (as numbers),
    else 0.0. A completion without that final line scores 0."""

    def __call__(
        self, trajectories: Sequence[Any], ground_truths: Sequence[Any] | None = None
    ) -> list[float]:
        rewards = []
        for trajectory in trajectories:
            answer = str(ground_truth(trajectory, "answer", type(self).__name__))
            given = final_answer(completion_text(trajectory))
            rewards.append(float(given is not None and _same_number(given, answer)))
        return rewards


class GSM8KFormatReward(Reward):
    """1.0 when the completion ends with a line ``#### <number>``, whatever the number."""

    def __call__(
        self, trajectories: Sequence[Any], ground_truths: Sequence[Any] | None = None
    ) -> list[float]:
        return [float(final_answer(completion_text(t)) is not None) for t in trajectories]
