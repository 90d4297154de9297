"""ShareGPT rows (``conversations``: turns of ``from``/``value``, optional ``system`` and
``tools``) become a conversation in the chat format."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from twinkle.data_format import Trajectory
from twinkle.preprocessor.base import PREPROCESSORS, Preprocessor, RowFieldError, system_turn
from twinkle.preprocessor.messages import json_or_list

SHAREGPT_ROLES = {
    "system": "system",
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "model": "assistant",
    "bot": "assistant",
    "observation": "tool",
    "tool": "tool",
    "function_response": "tool",
}
"""The chat role of each ShareGPT speaker (``from``); ``function_call`` turns are the
assistant's tool calls, their ``value`` a JSON ``{"name", "arguments"}`` (or a list)."""


@PREPROCESSORS.register
class ShareGPTProcessor(Preprocessor):
    """``{'conversations': [{'from': 'human', 'value': ...}, {'from': 'gpt', ...}]}`` -> the
    same turns as chat messages (speakers mapped by ``SHAREGPT_ROLES``). A non-empty
    ``system`` column becomes the first message; ``tools`` (a list or JSON string) the
    tools. ``field`` names the column holding the turns."""

    def __init__(self, field: str = "conversations") -> None:
        if not isinstance(field, str) or not field:
            raise ValueError(f"field must be a column name, got {field!r}")
        self.field = field

    def __call__(self, row: Mapping[str, Any]) -> Trajectory:
        turns = json_or_list(row, self.field)
        messages = system_turn(row) + [self._message(i, turn) for i, turn in enumerate(turns)]
        trajectory: dict[str, Any] = {"messages": messages}
        if row.get("tools"):
            trajectory["tools"] = json_or_list(row, "tools")
        return Trajectory.model_validate(trajectory)

    def _message(self, i: int, turn: Any) -> dict[str, Any]:
        if not isinstance(turn, Mapping) or not isinstance(turn.get("from"), str):
            raise RowFieldError(
                self.field, f"turn {i} must be a dict with 'from' and 'value', got {turn!r}"
            )
        speaker, value = turn["from"], turn.get("value", "")
        if speaker == "function_call":
            return {
                "role": "assistant",
                "content": "",
                "tool_calls": _tool_calls(self.field, i, value),
            }
        role = SHAREGPT_ROLES.get(speaker)
        if role is None:
            known = ", ".join([*SHAREGPT_ROLES, "function_call"])
            raise RowFieldError(
                self.field, f"turn {i} is from {speaker!r}; known speakers: {known}"
            )
        return {"role": role, "content": value}


def _tool_calls(field: str, i: int, value: Any) -> list[Any]:
    try:
        calls = json.loads(value) if isinstance(value, str) else value
    except json.JSONDecodeError as err:
        raise RowFieldError(field, f"turn {i} (function_call) is not valid JSON ({err})") from None
    return calls if isinstance(calls, list) else [calls]
