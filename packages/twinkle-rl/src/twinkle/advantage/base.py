"""Advantage: the base of every advantage estimator.

Group-relative estimators (GRPO, RLOO) are called as
``advantage(rewards, num_generations=G, scale=...) -> torch.Tensor``: rewards are laid out
prompt by prompt, ``G`` consecutive completions per prompt (the order a sampler returns
``prompts * G`` in is regrouped by the caller); the result has one advantage per
completion, in the same order, for the loss's ``advantages`` input. Token-level estimators
(GAE, the reverse KL of distillation) take per-token inputs and give one advantage per
token, (B, T) aligned with labels; each documents its call.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any


class Advantage(ABC):
    """Turns rewards (or per-token signals) into advantages; subclasses implement
    ``__call__`` with the inputs they need."""

    @abstractmethod
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """The advantages, in the order of the inputs."""
