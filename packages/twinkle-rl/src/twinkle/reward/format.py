"""FormatReward: did the completion follow ``<think> ... </think> <answer> ... </answer>``?"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from twinkle.reward.base import Reward
from twinkle.reward.completion import completion_text

_THINK_THEN_ANSWER = re.compile(r"^\s*<think>.*?</think>\s*<answer>.*?</answer>\s*$", re.DOTALL)


class FormatReward(Reward):
    """1.0 when the whole completion is a ``<think>`` block followed by an ``<answer>`` block
    (the format the Countdown prompt asks for), else 0.0."""

    def __call__(
        self, trajectories: Sequence[Any], ground_truths: Sequence[Any] | None = None
    ) -> list[float]:
        return [float(bool(_THINK_THEN_ANSWER.match(completion_text(t)))) for t in trajectories]
