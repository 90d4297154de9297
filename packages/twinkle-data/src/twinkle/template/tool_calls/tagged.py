"""Formats that wrap each call in tags: Hermes JSON (Qwen2.5, Qwen3), Qwen3.5's XML
parameters, GLM-4.5's key/value pairs and Phi-4-mini's JSON list."""

from __future__ import annotations

import json
import re
from typing import Any

from twinkle.template.tool_calls.base import (
    TOOL_CALL_FORMATS,
    ToolCallError,
    ToolCallFormat,
    load_json,
    tool_call,
)


def split_blocks(text: str, open_tag: str, close_tag: str) -> tuple[str, list[str]]:
    """The text outside ``open_tag ... close_tag`` blocks (stripped) and each block's
    inside, in order. An opened block that never closes is an error (a cut-off call)."""
    outside, blocks, at = [], [], 0
    while (start := text.find(open_tag, at)) != -1:
        end = text.find(close_tag, start + len(open_tag))
        if end == -1:
            raise ToolCallError(f"a tool call opened with {open_tag} never closes", text[start:])
        outside.append(text[at:start])
        blocks.append(text[start + len(open_tag) : end])
        at = end + len(close_tag)
    outside.append(text[at:])
    return "".join(outside).strip(), blocks


def _value(raw: str) -> Any:
    """A parameter written as text: JSON when it reads as JSON (numbers, lists), else the
    string itself, as the XML formats write strings unquoted."""
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


@TOOL_CALL_FORMATS.register(name="hermes")
class HermesToolCalls(ToolCallFormat):
    """``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``, one block per
    call (Qwen2.5, Qwen3 and the Hermes models)."""

    name = "hermes"
    markers = ("<tool_call>",)

    def parse(self, text: str) -> tuple[str, list[dict[str, Any]]]:
        content, blocks = split_blocks(text, "<tool_call>", "</tool_call>")
        calls = []
        for block in blocks:
            data = load_json(block.strip(), block)
            if not isinstance(data, dict):
                raise ToolCallError("the tool call is not a JSON object", block)
            calls.append(tool_call(data.get("name"), data.get("arguments"), block))
        return content, calls


_FUNCTION = re.compile(r"<function=([^>\n]+)>(.*?)</function>", re.DOTALL)
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", re.DOTALL)


@TOOL_CALL_FORMATS.register(name="qwen_xml")
class QwenXmlToolCalls(ToolCallFormat):
    """``<tool_call>\\n<function=NAME>\\n<parameter=KEY>\\nVALUE\\n</parameter>\\n
    </function>\\n</tool_call>`` (Qwen3.5, Qwen3-Coder)."""

    name = "qwen_xml"
    markers = ("<function=",)

    def parse(self, text: str) -> tuple[str, list[dict[str, Any]]]:
        content, blocks = split_blocks(text, "<tool_call>", "</tool_call>")
        calls = []
        for block in blocks:
            function = _FUNCTION.search(block)
            if function is None:
                raise ToolCallError("the tool call has no <function=NAME> ... </function>", block)
            arguments = {k: _value(v) for k, v in _PARAMETER.findall(function.group(2))}
            calls.append(tool_call(function.group(1).strip(), arguments, block))
        return content, calls


_ARGUMENT = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL)


@TOOL_CALL_FORMATS.register(name="glm45")
class Glm45ToolCalls(ToolCallFormat):
    """``<tool_call>NAME\\n<arg_key>KEY</arg_key>\\n<arg_value>VALUE</arg_value>\\n
    </tool_call>`` (GLM-4.5 and later)."""

    name = "glm45"
    markers = ("<arg_key>",)

    def parse(self, text: str) -> tuple[str, list[dict[str, Any]]]:
        content, blocks = split_blocks(text, "<tool_call>", "</tool_call>")
        calls = []
        for block in blocks:
            name = block.split("<arg_key>", 1)[0].strip()
            arguments = {k.strip(): _value(v) for k, v in _ARGUMENT.findall(block)}
            calls.append(tool_call(name, arguments, block))
        return content, calls


@TOOL_CALL_FORMATS.register(name="phi4_mini")
class Phi4MiniToolCalls(ToolCallFormat):
    """``<|tool_call|>[{"name": ..., "arguments": {...}}, ...]<|/tool_call|>``
    (Phi-4-mini)."""

    name = "phi4_mini"
    markers = ("<|tool_call|>",)

    def parse(self, text: str) -> tuple[str, list[dict[str, Any]]]:
        content, blocks = split_blocks(text, "<|tool_call|>", "<|/tool_call|>")
        calls = []
        for block in blocks:
            data = load_json(block.strip(), block)
            for item in data if isinstance(data, list) else [data]:
                if not isinstance(item, dict):
                    raise ToolCallError("a tool call is not a JSON object", block)
                calls.append(tool_call(item.get("name"), item.get("arguments"), block))
        return content, calls
