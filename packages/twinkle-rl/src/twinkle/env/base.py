"""Env: what a multi-turn rollout talks to between the model's turns.

``reset(task)`` starts an episode and gives the first observation: the messages the model
reads before its first turn (a system prompt, the user's question). ``step(message)``
takes the assistant's turn (its text and any tool calls, already parsed) and gives the
observation that follows (tool results, a user's reply; may be empty), a reward, whether
the episode is over, and free-form info. The rollout renders the observation with the
chat template; an env never sees or produces tokens.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from twinkle.data_format import Message, Tool


@dataclass
class StepResult:
    """What one ``Env.step`` gives back."""

    observation: list[Message]
    reward: float = 0.0
    done: bool = False
    info: dict[str, Any] = field(default_factory=dict)


class Env(ABC):
    """One episode at a time; subclass it and implement ``reset`` and ``step``.

    ``tools`` are the functions the model may call in this env (rendered into the prompt by
    the chat template); ``user_data`` is what a reward or a log needs about the current
    task and the model must not see (the ground truth), carried into the training feature.
    """

    tools: list[Tool] | None = None

    def __init__(self) -> None:
        self.user_data: dict[str, Any] = {}

    @abstractmethod
    def reset(self, task: Mapping[str, Any]) -> list[Message]:
        """Start an episode on ``task`` (a dataset row); the first observation messages."""

    @abstractmethod
    def step(self, assistant_message: Message) -> StepResult:
        """The observation, reward and end of episode after the assistant's turn."""

    def close(self) -> None:  # noqa: B027 - only envs holding resources act
        """Release what the env holds (processes, files); the pool calls it once."""


def as_messages(messages: Any, owner: str) -> list[Message]:
    """An env's observation as Messages, with an error naming the env when it is not."""
    if not isinstance(messages, list | tuple):
        raise TypeError(f"{owner} must return a list of messages, got {type(messages).__name__}")
    return [m if isinstance(m, Message) else Message.model_validate(m) for m in messages]
