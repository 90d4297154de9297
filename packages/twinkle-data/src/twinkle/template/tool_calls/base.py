"""What every tool-call format shares: the parsed call's shape, the error for a malformed
one, and the registry the formats are found in by name."""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from typing import Any

from twinkle.utils import Registry


class ToolCallError(ValueError):
    """Generated text holds a tool call that cannot be read (bad JSON, no name). ``text``
    is the call's own text, so an environment can show the model what it wrote."""

    def __init__(self, message: str, text: str) -> None:
        super().__init__(f"{message}: {text[:200]!r}")
        self.text = text


def tool_call(name: Any, arguments: Any, text: str, call_id: Any = None) -> dict[str, Any]:
    """One call in the OpenAI / Hugging Face messages shape, ``{'type': 'function',
    'function': {'name': ..., 'arguments': {...}}}`` (``arguments`` a dict, as chat
    templates take it back), with ``id`` when the format carries one."""
    if not isinstance(name, str) or not name:
        raise ToolCallError("the tool call has no function name", text)
    if isinstance(arguments, str):
        arguments = load_json(arguments, text)
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        raise ToolCallError("the tool call's arguments are not a JSON object", text)
    call: dict[str, Any] = {"type": "function", "function": {"name": name, "arguments": arguments}}
    if call_id is not None:
        call["id"] = str(call_id)
    return call


def load_json(raw: str, text: str) -> Any:
    """``raw`` parsed as JSON, or a ToolCallError quoting the call ``text``."""
    try:
        return json.loads(raw)
    except json.JSONDecodeError as err:
        raise ToolCallError(f"the tool call is not valid JSON ({err.msg})", text) from err


class ToolCallFormat(ABC):
    """How one chat format writes tool calls in the assistant's text.

    ``parse(text)`` returns ``(content, calls)``: the text outside the calls (stripped)
    and the calls in order; text without calls comes back whole with no calls.
    ``markers`` are strings whose presence in a chat template marks the format, for
    :func:`detect_tool_call_format`."""

    name = ""
    markers: tuple[str, ...] = ()

    @abstractmethod
    def parse(self, text: str) -> tuple[str, list[dict[str, Any]]]:
        """``(content, calls)`` of ``text``."""


TOOL_CALL_FORMATS: Registry[type[ToolCallFormat]] = Registry(
    "tool call format", base=ToolCallFormat
)
"""Tool-call formats by name (``'hermes'``, ``'llama3_json'``, ...); add one with
``@TOOL_CALL_FORMATS.register``."""
