"""Advantage: the protocol every advantage estimator follows.

``advantage(rewards, num_generations=G, scale=...) -> torch.Tensor``: rewards
are laid out prompt by prompt, ``G`` consecutive completions per prompt (the
order a sampler returns ``prompts * G`` in is regrouped by the caller); the
result has one advantage per completion, in the same order, for the loss's
``advantages`` input.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

import torch


class Advantage(ABC):
    """Turns rewards into advantages; subclasses implement ``__call__``."""

    @abstractmethod
    def __call__(
        self, rewards: Sequence[float] | torch.Tensor, *, num_generations: int, scale: str = "group"
    ) -> torch.Tensor:
        """One advantage per completion, in the order of ``rewards``."""
