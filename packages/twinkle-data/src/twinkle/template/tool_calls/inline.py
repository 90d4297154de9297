"""Formats whose calls are not one tagged block each: Llama 3's bare JSON, Mistral's
``[TOOL_CALLS]`` and DeepSeek's call tokens."""

from __future__ import annotations

from typing import Any

from twinkle.template.tool_calls.base import (
    TOOL_CALL_FORMATS,
    ToolCallError,
    ToolCallFormat,
    load_json,
    tool_call,
)
from twinkle.template.tool_calls.tagged import split_blocks


@TOOL_CALL_FORMATS.register(name="llama3_json")
class Llama3JsonToolCalls(ToolCallFormat):
    """The whole reply is ``{"name": ..., "parameters": {...}}`` (Llama 3.1+ JSON tool
    calling), optionally after ``<|python_tag|>``, several joined by ``;``. A reply that
    does not start with ``{`` is plain content."""

    name = "llama3_json"
    markers = ("<|python_tag|>", '"parameters": ')

    def parse(self, text: str) -> tuple[str, list[dict[str, Any]]]:
        body = text.strip().removeprefix("<|python_tag|>").strip()
        if not body.startswith("{"):
            return text.strip(), []
        calls = []
        for part in _split_top_level(body, ";"):
            data = load_json(part, part)
            if not isinstance(data, dict):
                raise ToolCallError("the tool call is not a JSON object", part)
            arguments = data.get("parameters", data.get("arguments"))
            calls.append(tool_call(data.get("name"), arguments, part))
        return "", calls


def _split_top_level(text: str, separator: str) -> list[str]:
    """``text`` split at ``separator`` outside JSON strings and brackets."""
    parts, depth, quoted, escaped, start = [], 0, False, False, 0
    for i, char in enumerate(text):
        if quoted:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                quoted = False
        elif char == '"':
            quoted = True
        elif char in "{[":
            depth += 1
        elif char in "}]":
            depth -= 1
        elif char == separator and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [part.strip() for part in parts if part.strip()]


@TOOL_CALL_FORMATS.register(name="mistral")
class MistralToolCalls(ToolCallFormat):
    """``[TOOL_CALLS][{"name": ..., "arguments": {...}, "id": ...}]`` (v3 tokenizers) or
    ``[TOOL_CALLS]NAME[ARGS]{...}`` per call (v11 and later); the content is the text
    before the first ``[TOOL_CALLS]``."""

    name = "mistral"
    markers = ("[TOOL_CALLS]",)

    def parse(self, text: str) -> tuple[str, list[dict[str, Any]]]:
        content, *parts = text.split("[TOOL_CALLS]")
        calls = []
        for part in (p.strip() for p in parts):
            if part.startswith("["):
                data = load_json(part, part)
                for item in data if isinstance(data, list) else [data]:
                    if not isinstance(item, dict):
                        raise ToolCallError("a tool call is not a JSON object", part)
                    calls.append(
                        tool_call(item.get("name"), item.get("arguments"), part, item.get("id"))
                    )
            elif "[ARGS]" in part:
                name, arguments = part.split("[ARGS]", 1)
                call_id = None
                if "[CALL_ID]" in name:
                    name, call_id = name.split("[CALL_ID]", 1)
                calls.append(tool_call(name.strip(), arguments.strip(), part, call_id))
            else:
                raise ToolCallError("[TOOL_CALLS] is followed by neither a list nor [ARGS]", part)
        return content.strip(), calls


_CALLS_BEGIN, _CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
_CALL_BEGIN, _CALL_END, _SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"


@TOOL_CALL_FORMATS.register(name="deepseek")
class DeepSeekToolCalls(ToolCallFormat):
    """DeepSeek's call tokens: V3's ``<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME
    \\n```json\\nARGS\\n```<｜tool▁call▁end｜>`` and V3.1's ``<｜tool▁call▁begin｜>NAME
    <｜tool▁sep｜>ARGS<｜tool▁call▁end｜>``, inside ``<｜tool▁calls▁begin｜>...``."""

    name = "deepseek"
    markers = (_CALLS_BEGIN,)

    def parse(self, text: str) -> tuple[str, list[dict[str, Any]]]:
        content, groups = split_blocks(text, _CALLS_BEGIN, _CALLS_END)
        calls = []
        for group in groups:
            _, blocks = split_blocks(group, _CALL_BEGIN, _CALL_END)
            for block in blocks:
                if _SEP not in block:
                    raise ToolCallError(f"the tool call has no {_SEP}", block)
                head, rest = block.split(_SEP, 1)
                if head.strip() == "function":  # V3: the name, then the arguments fenced
                    name, _, arguments = rest.partition("\n")
                    arguments = arguments.strip().removeprefix("```json").removesuffix("```")
                else:
                    name, arguments = head, rest
                calls.append(tool_call(name.strip(), arguments.strip(), block))
        return content, calls
