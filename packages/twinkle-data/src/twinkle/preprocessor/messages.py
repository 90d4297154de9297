"""Rows already in the chat format (``messages``, optional ``tools``) pass through."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from twinkle.data_format import Trajectory
from twinkle.preprocessor.base import PREPROCESSORS, Preprocessor, RowFieldError, require


def _drop_nulls(value: Any) -> Any:
    """Arrow gives every struct the union of keys seen in the column, unset ones as None;
    drop those so a message reads as it was written."""
    if isinstance(value, Mapping):
        return {key: _drop_nulls(item) for key, item in value.items() if item is not None}
    if isinstance(value, list):
        return [_drop_nulls(item) for item in value]
    return value


def json_or_list(row: Mapping[str, Any], field: str) -> list:
    """``row[field]`` as a list: as stored, or decoded from the JSON string some datasets
    store instead; unset struct keys dropped."""
    value = require(row, field, (list, str))
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as err:
            raise RowFieldError(field, f"is a string but not valid JSON ({err})") from None
        if not isinstance(value, list):
            raise RowFieldError(field, f"must decode to a list, got {type(value).__name__}")
    return _drop_nulls(value)


@PREPROCESSORS.register
class MessagesProcessor(Preprocessor):
    """``{'messages': [...], 'tools': [...]}`` -> the same conversation as a Trajectory.

    ``messages`` and ``tools`` may be lists or JSON strings (as some datasets store them);
    tools may be in the OpenAI form. ``user_data_fields`` copies those columns into
    ``user_data`` (``[{field: value, ...}]``) for rewards, e.g. ``('answer',)``. A row that
    already has a ``user_data`` column keeps it when no fields are named.
    """

    def __init__(self, user_data_fields: Sequence[str] = ()) -> None:
        if isinstance(user_data_fields, str):
            raise TypeError(f"user_data_fields must be a list of names, not {user_data_fields!r}")
        self.user_data_fields = tuple(user_data_fields)

    def __call__(self, row: Mapping[str, Any]) -> Trajectory:
        trajectory: dict[str, Any] = {"messages": json_or_list(row, "messages")}
        if row.get("tools"):
            trajectory["tools"] = json_or_list(row, "tools")
        if self.user_data_fields:
            fields = {name: require(row, name, object) for name in self.user_data_fields}
            trajectory["user_data"] = [fields]
        elif row.get("user_data"):
            trajectory["user_data"] = json_or_list(row, "user_data")
        return Trajectory.model_validate(trajectory)
