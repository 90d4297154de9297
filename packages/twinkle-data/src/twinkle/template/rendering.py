"""Render a conversation with a Jinja chat template, exactly as
``tokenizer.apply_chat_template(..., tokenize=False)`` does, optionally recording the
character spans of its ``{% generation %}`` blocks (the text the assistant writes).

``apply_chat_template`` rebuilds a conversation as plain data before every render; a
Template renders each conversation (and its prefixes) several times, so it converts it once
(``template_inputs``, transformers' own conversion) and renders that."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from types import BuiltinFunctionType
from typing import Any

from jinja2.sandbox import ImmutableSandboxedEnvironment
from transformers.utils import chat_template_utils

Span = tuple[int, int]
"""Character offsets ``[start, end)`` into a rendered conversation."""

_GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")


def has_generation_markers(chat_template: str) -> bool:
    """Whether the chat template wraps assistant text in ``{% generation %}`` blocks."""
    return _GENERATION_TAG.search(chat_template) is not None


# Prepended to the chat template Twinkle renders so that it compiles into a Jinja environment
# of its own (transformers caches one per template text) that Twinkle may speed up without
# touching the one apply_chat_template uses. A comment renders nothing, and the newline
# after it is removed by the environment's trim_blocks, so the template's text is unchanged.
_OWN_COPY = "{# twinkle #}\n"
_DICT_ATTRIBUTES = frozenset(dir(dict))
_SAFE_ATTRIBUTES: dict[tuple[type, str], bool] = {}


class _MemoSandbox(ImmutableSandboxedEnvironment):
    """transformers' sandbox with the same rules, answered faster: a chat template reads
    ``message.role`` and calls ``content.startswith`` thousands of times a batch.

    - Whether an attribute is safe depends only on the object's type and the attribute's
      name (``is_internal_attribute`` and ``modifies_known_mutable`` test ``isinstance``
      and the name), so the answer is kept per (type, name): a few hundred pairs, the
      names being those the template's source spells.
    - A plain dict has exactly the attributes of ``dict``, so for any other name the
      lookup goes straight to its key instead of through a failed ``getattr``.
    - A builtin method is always a safe callable.
    """

    def is_safe_attribute(self, obj: Any, attr: str, value: Any) -> bool:
        key = (type(obj), attr)
        safe = _SAFE_ATTRIBUTES.get(key)
        if safe is None:
            safe = _SAFE_ATTRIBUTES[key] = super().is_safe_attribute(obj, attr, value)
        return safe

    def is_safe_callable(self, obj: Any) -> bool:
        # A builtin function or method (``str.startswith`` bound to a string) has no
        # attributes of its own to mark it unsafe.
        return type(obj) is BuiltinFunctionType or super().is_safe_callable(obj)

    def getattr(self, obj: Any, attribute: str) -> Any:
        if type(obj) is dict and attribute not in _DICT_ATTRIBUTES:
            try:
                return obj[attribute]
            except KeyError:
                return self.undefined(obj=obj, name=attribute)
        return super().getattr(obj, attribute)


@functools.lru_cache(maxsize=64)
def _own_copy(chat_template: str) -> Any:
    """The chat template as Twinkle renders it: its own compiled copy, in the faster
    sandbox (transformers compiles each template text once and keeps it)."""
    compiled = chat_template_utils._compile_jinja_template(_OWN_COPY + chat_template)
    if type(compiled.environment) is ImmutableSandboxedEnvironment:
        compiled.environment.__class__ = _MemoSandbox
    return compiled


def plain_data(value: Any) -> Any:
    """``value`` rebuilt from plain JSON types, as apply_chat_template gives a template
    its inputs: rich objects' methods are out of the sandbox's reach."""
    return chat_template_utils._plain_template_data(value)


def template_inputs(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """The messages and tools a template sees from apply_chat_template: plain data, each
    message's reasoning under every name templates read it by. A prefix of the messages
    is the conversion of the prefix."""
    return chat_template_utils._alias_reasoning_fields(plain_data(messages)), plain_data(tools)


@dataclass(frozen=True)
class Rendered:
    """A rendered conversation; ``generation_spans`` are the spans of its generation
    blocks in order, or empty when they were not tracked."""

    text: str
    generation_spans: list[Span]


def render(
    chat_template: str,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    *,
    add_generation_prompt: bool,
    variables: dict[str, Any],
    track_generation: bool,
) -> Rendered:
    """Render one conversation's ``template_inputs`` with the extra template variables
    (special tokens, ``enable_thinking``, already ``plain_data``), as
    ``apply_chat_template`` renders them."""
    compiled = _own_copy(chat_template)
    arguments = dict(
        messages=messages,
        tools=tools,
        documents=None,
        add_generation_prompt=add_generation_prompt,
        **variables,
    )
    if not track_generation:
        return Rendered(compiled.render(**arguments), [])
    text, spans = chat_template_utils._render_with_assistant_indices(compiled, **arguments)
    return Rendered(text, [tuple(span) for span in spans])
