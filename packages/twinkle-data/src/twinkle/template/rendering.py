"""Render a conversation with a Jinja chat template, exactly as
``tokenizer.apply_chat_template(..., tokenize=False)`` does, optionally recording the
character spans of its ``{% generation %}`` blocks (the text the assistant writes)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from types import BuiltinFunctionType
from typing import Any

from jinja2.sandbox import ImmutableSandboxedEnvironment
from transformers.utils import chat_template_utils
from transformers.utils.chat_template_utils import render_jinja_template

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


def _own_copy(chat_template: str) -> str:
    """The chat template as Twinkle renders it: its own compiled copy, in the faster
    sandbox (transformers compiles each template text once and keeps it)."""
    source = _OWN_COPY + chat_template
    environment = chat_template_utils._compile_jinja_template(source).environment
    if type(environment) is ImmutableSandboxedEnvironment:
        environment.__class__ = _MemoSandbox
    return source


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
    """Render one conversation. ``variables`` are the extra template variables
    (special tokens, ``enable_thinking``), passed as ``apply_chat_template`` passes them."""
    texts, spans = render_jinja_template(
        [messages],
        tools=tools,
        chat_template=_own_copy(chat_template),
        return_assistant_tokens_mask=track_generation,
        add_generation_prompt=add_generation_prompt,
        **variables,
    )
    return Rendered(texts[0], [tuple(span) for span in spans[0]] if track_generation else [])
