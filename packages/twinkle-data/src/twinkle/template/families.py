"""Built-in chat formats: each family's chat template, written for Twinkle from the
format's public description (``formats/<name>.jinja``), with its stop tokens and its
tool-call format, as registered Templates (``set_template('Llama3Template', ...)``).

A built-in Template renders with its own format instead of the tokenizer's template (for
a base model whose tokenizer has none, or to pin the format); ``chat_template=...``
still overrides it. The tokenizer must hold the format's special tokens.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from twinkle.template.base import Template
from twinkle.template.rendering import Rendered

FORMATS = Path(__file__).parent / "formats"


@dataclass(frozen=True)
class ChatFormat:
    """``name``: the template file ``formats/<name>.jinja``; ``tokens``: the special
    tokens its markup needs; ``stops``: the tokens that end a reply; ``tool_calls``:
    the name of its tool-call format, or None when it has none."""

    name: str
    tokens: tuple[str, ...]
    stops: tuple[str, ...]
    tool_calls: str | None

    def chat_template(self) -> str:
        return (FORMATS / f"{self.name}.jinja").read_text()


class FormatTemplate(Template):
    """A Template with a built-in chat format (``chat_format``); arguments are those of
    :class:`Template`, given by keyword."""

    chat_format: ClassVar[ChatFormat]

    def __init__(self, model_id: str, **kwargs: Any) -> None:
        chat = self.chat_format
        if kwargs.get("chat_template") is None:
            kwargs["chat_template"] = chat.chat_template()
        if kwargs.get("tool_call_format") is None:
            kwargs["tool_call_format"] = chat.tool_calls
        super().__init__(model_id, **kwargs)
        vocab = self.tokenizer.get_vocab()
        missing = [token for token in chat.tokens if token not in vocab]
        if missing:
            raise ValueError(
                f"{type(self).__name__} writes the {chat.name} chat format, but the tokenizer "
                f"of {model_id} lacks its tokens {', '.join(missing)}; use the Template of this "
                "model's family, or Template to render with the tokenizer's own chat template"
            )
        self.stop_tokens = tuple(dict.fromkeys((*self.stop_tokens, *chat.stops)))


_CHATML = ("<|im_start|>", "<|im_end|>")


class Llama3Template(FormatTemplate):
    """Llama 3.1+: header tokens, ``<|eot_id|>`` turns, JSON tool calls, ipython results."""

    chat_format = ChatFormat(
        "llama3",
        ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"),
        ("<|eot_id|>", "<|eom_id|>"),
        "llama3_json",
    )


class MistralTemplate(FormatTemplate):
    """Mistral instruct with tools as v3 SentencePiece tokenizers write it (Mistral 7B
    Instruct v0.3, Mixtral 8x22B): ``[INST]`` turns, ``[TOOL_CALLS]`` JSON lists. The
    system prompt goes with the last user message, as mistral-common's v3 (and v2)
    tokenizer puts it; v1 puts it in the first user message, v7 and later give it a
    ``[SYSTEM_PROMPT]`` turn. (The Jinja template v0.3 ships writes it only when that user
    message ends the conversation, so it drops it from every training row.)

    A tool result or call arguments given as JSON text are written as the JSON value they
    hold, other text as a JSON string, as mistral-common does (the Jinja format alone
    cannot parse JSON, so this Template reads them before rendering)."""

    chat_format = ChatFormat("mistral", ("[INST]", "[/INST]", "</s>"), ("</s>",), "mistral")

    def _render(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, *args: Any
    ) -> Rendered:
        return super()._render([_json_read(message) for message in messages], tools, *args)


def _json_value(text: Any) -> Any:
    """The JSON value ``text`` holds, else ``text`` itself."""
    if not isinstance(text, str):
        return text
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _json_read(message: dict[str, Any]) -> dict[str, Any]:
    """A Mistral message with its JSON text parsed: a tool result's content, and each call's
    arguments (those that are not JSON become a JSON string, which the format writes as
    it is)."""
    if message["role"] == "tool":
        return {**message, "content": _json_value(message["content"])}
    if not message.get("tool_calls"):
        return message
    calls = []
    for call in message["tool_calls"]:
        arguments = _json_value(call["function"]["arguments"])
        if isinstance(arguments, str):
            arguments = json.dumps(arguments, ensure_ascii=False)
        calls.append({**call, "function": {**call["function"], "arguments": arguments}})
    return {**message, "tool_calls": calls}


class Gemma3Template(FormatTemplate):
    """Gemma 3: ``<start_of_turn>user``/``model`` turns ended by ``<end_of_turn>``."""

    chat_format = ChatFormat(
        "gemma3", ("<start_of_turn>", "<end_of_turn>"), ("<end_of_turn>",), None
    )


class DeepSeekV3Template(FormatTemplate):
    """DeepSeek-V3 / R1: ``<｜User｜>``/``<｜Assistant｜>`` turns, tool-call tokens.

    Thinking by default, as R1 and the template DeepSeek-V3 ships: the generation prompt
    is ``<｜Assistant｜><think>\n`` and a reply after the last user message is trained as
    the model writes it there, ``<think>\n{reasoning}\n</think>\n\n{text}`` (that
    template drops the reasoning, so its replies do not continue its own prompt).
    ``enable_thinking=False`` is V3 as a chat model: the prompt is ``<｜Assistant｜>`` and
    replies are their text."""

    chat_format = ChatFormat(
        "deepseek_v3",
        ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>"),
        ("<｜end▁of▁sentence｜>",),
        "deepseek",
    )


class Glm4Template(FormatTemplate):
    """GLM-4.5: role tokens with no end-of-turn token, key/value tool calls."""

    chat_format = ChatFormat(
        "glm4",
        ("[gMASK]", "<sop>", "<|user|>", "<|assistant|>", "<|observation|>"),
        ("<|user|>", "<|observation|>"),
        "glm45",
    )


class Phi4Template(FormatTemplate):
    """Phi-4: ``<|im_start|>ROLE<|im_sep|>...<|im_end|>`` turns."""

    chat_format = ChatFormat("phi4", (*_CHATML, "<|im_sep|>"), ("<|im_end|>",), None)


class Qwen2_5Template(FormatTemplate):
    """Qwen2.5: ChatML with a default system prompt and Hermes tool calls."""

    chat_format = ChatFormat("qwen2_5", _CHATML, ("<|im_end|>",), "hermes")


class Qwen3Template(FormatTemplate):
    """Qwen3: ChatML with thinking and Hermes tool calls."""

    chat_format = ChatFormat("qwen3", _CHATML, ("<|im_end|>",), "hermes")


class Qwen3_5FormatTemplate(FormatTemplate):
    """Qwen3.5: ChatML with thinking and XML tool calls; with tools, the system turn lists
    them with Qwen3.5's calling guide and the system prompt after it
    (``Qwen3_5Template`` renders the tokenizer's own template instead)."""

    chat_format = ChatFormat("qwen3_5", _CHATML, ("<|im_end|>",), "qwen_xml")


BUILT_IN_TEMPLATES: tuple[type[FormatTemplate], ...] = (
    Llama3Template,
    MistralTemplate,
    Gemma3Template,
    DeepSeekV3Template,
    Glm4Template,
    Phi4Template,
    Qwen2_5Template,
    Qwen3Template,
    Qwen3_5FormatTemplate,
)
