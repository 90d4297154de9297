"""Render a conversation with a Jinja chat template, exactly as
``tokenizer.apply_chat_template(..., tokenize=False)`` does, optionally recording the
character spans of its ``{% generation %}`` blocks (the text the assistant writes)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from transformers.utils.chat_template_utils import render_jinja_template

Span = tuple[int, int]
"""Character offsets ``[start, end)`` into a rendered conversation."""

_GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")


def has_generation_markers(chat_template: str) -> bool:
    """Whether the chat template wraps assistant text in ``{% generation %}`` blocks."""
    return _GENERATION_TAG.search(chat_template) is not None


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
        chat_template=chat_template,
        return_assistant_tokens_mask=track_generation,
        add_generation_prompt=add_generation_prompt,
        **variables,
    )
    return Rendered(texts[0], [tuple(span) for span in spans[0]] if track_generation else [])
