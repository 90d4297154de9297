"""Conversations: what a Preprocessor produces and a Template encodes.

Field names follow the OpenAI chat format that datasets and chat templates already use;
``to_openai()`` gives the exact dicts a Hugging Face chat template expects.
"""

from __future__ import annotations

from typing import Any, Literal, Self

from pydantic import Field, field_validator, model_validator

from twinkle.data_format._base import DataModel

Role = Literal["system", "user", "assistant", "tool"]


def _unwrap_function(data: Any, kind: str) -> Any:
    """Accept the OpenAI form ``{'type': 'function', 'function': {...}, ...}`` by lifting
    the inner dict; anything else is left for field validation."""
    if not (isinstance(data, dict) and "function" in data):
        return data
    outer = dict(data)
    if outer.pop("type", "function") != "function":
        raise ValueError(f"{kind} type must be 'function', got {data['type']!r}")
    function = outer.pop("function")
    if not isinstance(function, dict):
        raise ValueError(f"{kind} 'function' must be a dict, got {type(function).__name__}")
    return {**outer, **function}


class Tool(DataModel):
    """A function the model may call. ``parameters`` is a JSON schema. The OpenAI form
    ``{'type': 'function', 'function': {...}}`` is accepted as input."""

    name: str = Field(min_length=1)
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _accept_openai_form(cls, data: Any) -> Any:
        return _unwrap_function(data, "Tool")

    def to_openai(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }


class ToolCall(DataModel):
    """One call an assistant message makes. ``arguments`` is a JSON string (as a model
    writes it, possibly malformed) or an already parsed dict."""

    id: str | None = None
    name: str = Field(min_length=1)
    arguments: str | dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _accept_openai_form(cls, data: Any) -> Any:
        return _unwrap_function(data, "ToolCall")

    @field_validator("arguments", mode="before")
    @classmethod
    def _check_arguments(cls, value: Any) -> Any:
        if not isinstance(value, (str, dict)):
            raise ValueError(
                f"arguments must be a JSON string or a dict, got {type(value).__name__}"
            )
        return value

    def to_openai(self) -> dict[str, Any]:
        call: dict[str, Any] = {
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }
        if self.id is not None:
            call["id"] = self.id
        return call


class Message(DataModel):
    """One turn. ``content`` is text, or a list of content parts for multimodal input
    (``{'type': 'text', 'text': ...}``, ``{'type': 'image', 'image': ...}``).
    ``tool_calls`` and ``reasoning_content`` belong to assistant turns, ``tool_call_id``
    to tool turns."""

    role: Role
    content: str | list[dict[str, Any]] = ""
    tool_calls: list[ToolCall] | None = None
    name: str | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _check_content(cls, value: Any) -> Any:
        if isinstance(value, str):
            return value
        if not isinstance(value, list):
            raise ValueError(
                f"content must be a str or a list of content-part dicts, got {type(value).__name__}"
            )
        for i, part in enumerate(value):
            if not (isinstance(part, dict) and isinstance(part.get("type"), str)):
                raise ValueError(
                    f"content[{i}] must be a dict with a 'type' key, "
                    f"such as {{'type': 'text', 'text': ...}}; got {part!r}"
                )
        return value

    @model_validator(mode="after")
    def _check_role_fields(self) -> Self:
        for field, role in (
            ("tool_calls", "assistant"),
            ("reasoning_content", "assistant"),
            ("tool_call_id", "tool"),
        ):
            if getattr(self, field) is not None and self.role != role:
                raise ValueError(f"{field} is only allowed on {role} messages, not on {self.role}")
        return self

    def to_openai(self) -> dict[str, Any]:
        """A plain dict for a chat template; unset fields are left out."""
        message = {key: value for key, value in self.items() if key != "tool_calls"}
        if self.tool_calls is not None:
            message["tool_calls"] = [call.to_openai() for call in self.tool_calls]
        return message


class Trajectory(DataModel):
    """A conversation with its tools and per-sample data. ``user_data`` carries what the
    reward needs and the model must not see, such as ground truth:
    ``[{'target': 24, 'nums': [3, 8, 1]}]``. Messages given as dicts are validated into
    :class:`Message`."""

    messages: list[Message]
    tools: list[Tool] | None = None
    user_data: list[dict[str, Any]] = Field(default_factory=list)
