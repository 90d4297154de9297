"""Tool calls in generated text: one parser per chat format, found by name or from the
chat template that writes them.

``parse(text)`` gives ``(content, calls)``, each call in the OpenAI / Hugging Face
messages shape ``{'type': 'function', 'function': {'name': ..., 'arguments': {...}}}``,
so an assistant message built from them renders back through the same chat template.
"""

from __future__ import annotations

from twinkle.template.tool_calls.base import (
    TOOL_CALL_FORMATS,
    ToolCallError,
    ToolCallFormat,
    tool_call,
)
from twinkle.template.tool_calls.inline import (
    DeepSeekToolCalls,
    Llama3JsonToolCalls,
    MistralToolCalls,
)
from twinkle.template.tool_calls.tagged import (
    Glm45ToolCalls,
    HermesToolCalls,
    Phi4MiniToolCalls,
    QwenXmlToolCalls,
)

# Most specific first: Qwen3.5's XML and GLM's pairs sit inside <tool_call> tags too.
_DETECTION_ORDER = (
    QwenXmlToolCalls,
    Glm45ToolCalls,
    HermesToolCalls,
    Phi4MiniToolCalls,
    MistralToolCalls,
    DeepSeekToolCalls,
    Llama3JsonToolCalls,
)


def detect_tool_call_format(chat_template: str) -> ToolCallFormat | None:
    """The format whose markers the chat template writes, or None when it writes none
    of the known ones."""
    for cls in _DETECTION_ORDER:
        if any(marker in chat_template for marker in cls.markers):
            return cls()
    return None


__all__ = [
    "TOOL_CALL_FORMATS",
    "DeepSeekToolCalls",
    "Glm45ToolCalls",
    "HermesToolCalls",
    "Llama3JsonToolCalls",
    "MistralToolCalls",
    "Phi4MiniToolCalls",
    "QwenXmlToolCalls",
    "ToolCallError",
    "ToolCallFormat",
    "detect_tool_call_format",
    "tool_call",
]
