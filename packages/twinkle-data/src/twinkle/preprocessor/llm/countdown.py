"""Countdown puzzles (reach ``target`` from ``nums`` with + - * /) become RL prompts."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from twinkle.data_format import Trajectory
from twinkle.preprocessor.base import PREPROCESSORS, Preprocessor, RowFieldError, require

COUNTDOWN_PROMPT = (
    "Using the numbers {nums}, write an equation that equals {target}. You may use +, -, * "
    "and / and parentheses, and must use each number exactly once. Think it through inside "
    "<think> </think>, then give only the equation inside <answer> </answer>, for example "
    "<answer> (1 + 2) * 3 </answer>."
)


def _int(value: Any, field: str) -> int:
    """An integral number (datasets may store 24 as 24.0) as an int."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
        raise RowFieldError(field, f"must hold whole numbers, got {value!r}")
    return int(value)


@PREPROCESSORS.register
class CountdownProcessor(Preprocessor):
    """``{'nums': [3, 8, 1], 'target': 24}`` -> a prompt to be sampled (no assistant turn):
    an optional system message, then a user message built from ``prompt`` (a format string
    with ``{nums}`` and ``{target}``).

    ``user_data`` is ``[{'target': 24, 'nums': [3, 8, 1]}]``, which the documents' reward
    reads with ``trajectory.get('user_data', [{}])[0].get('target')``. Encode with
    ``add_generation_prompt=True``.
    """

    def __init__(self, prompt: str = COUNTDOWN_PROMPT, system: str | None = None) -> None:
        self.prompt = prompt
        self.system = system

    def __call__(self, row: Mapping[str, Any]) -> Trajectory:
        nums = [_int(n, "nums") for n in require(row, "nums", list)]
        if not nums:
            raise RowFieldError("nums", "is empty")
        target = _int(require(row, "target", (int, float)), "target")
        messages = [{"role": "user", "content": self.prompt.format(nums=nums, target=target)}]
        if self.system is not None:
            messages.insert(0, {"role": "system", "content": self.system})
        return Trajectory(messages=messages, user_data=[{"target": target, "nums": nums}])
