"""Reward: the protocol every reward function follows.

``reward(trajectories, ground_truths) -> list[float]``: one float per
trajectory. A trajectory is a Trajectory or an InputFeature (a sampled
sequence's ``new_input_feature``) carrying ``messages``, whose last assistant
message is the completion, and ``user_data``, whose first dict holds the
ground truth the preprocessor stored (e.g. ``[{'answer': '42'}]``).
``ground_truths`` is for rewards that take references separately; rewards
that read ``user_data`` accept it left out or empty, as the user's documents call them
both ways.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any


class Reward(ABC):
    """Scores completions; subclasses implement ``__call__``."""

    @abstractmethod
    def __call__(
        self, trajectories: Sequence[Any], ground_truths: Sequence[Any] | None = None
    ) -> list[float]:
        """One reward per trajectory, in order."""
