"""Qwen3_5Template: the Qwen3 / Qwen3.5 chat format (ChatML)."""

from __future__ import annotations

from typing import Any

from twinkle.template.base import Template
from twinkle.template.errors import EncodeError
from twinkle.template.rendering import Rendered, Span

_ASSISTANT_HEADER = "<|im_start|>assistant\n"
_END_OF_TURN = "<|im_end|>"


class Qwen3_5Template(Template):
    """The Qwen3 / Qwen3.5 chat format, rendered by the model's own chat template.

    Turns are ChatML: ``<|im_start|>{role}\\n{content}<|im_end|>\\n``. An assistant turn
    holds its reasoning as ``<think>\\n...\\n</think>\\n\\n`` before the reply (Qwen
    templates keep it only for turns after the last user message) and its tool calls as
    ``<tool_call>`` JSON after it; tool results come back as ``<tool_response>`` blocks
    inside a user turn. With ``enable_thinking=False`` the generation prompt carries an
    empty think block, so the model answers without reasoning (and a reply's empty think
    block is the prompt's, not trained). Qwen3.5's generation prompt opens the think block
    (``<think>\\n``) even with thinking on, so there the reply starts inside it.

    The assistant's text is found by the format rather than by ``{% generation %}`` blocks
    (which the templates Qwen ships do not have): from after each
    ``<|im_start|>assistant\\n``, and after what the generation prompt writes there (the
    model never writes that text), through its ``<|im_end|>``. Arguments are those of
    :class:`Template`; the tokenizer must have the ChatML special tokens.
    """

    tracks_generation = False

    def __init__(self, model_id: str, *args: Any, **kwargs: Any) -> None:
        super().__init__(model_id, *args, **kwargs)
        vocab = self.tokenizer.get_vocab()
        missing = [token for token in ("<|im_start|>", _END_OF_TURN) if token not in vocab]
        if missing:
            raise ValueError(
                f"Qwen3_5Template needs a ChatML tokenizer, but the tokenizer of {model_id} has "
                f"no {' or '.join(missing)}; use Template for other chat formats"
            )
        prompt = self.render({"messages": [{"role": "user", "content": "?"}]}, True)
        self._prompt_opening = prompt[prompt.rfind(_ASSISTANT_HEADER) + len(_ASSISTANT_HEADER) :]
        """What the generation prompt writes after the header: nothing (Qwen3), ``<think>\\n``
        (Qwen3.5), or an empty think block (``enable_thinking=False``)."""

    def _assistant_spans(self, rendered: Rendered, turns: int, index: int) -> list[Span]:
        text = rendered.text
        spans = []
        header = text.find(_ASSISTANT_HEADER)
        while header != -1:
            start = header + len(_ASSISTANT_HEADER)
            if text.startswith(self._prompt_opening, start):
                start += len(self._prompt_opening)
            end = text.find(_END_OF_TURN, start)
            if end == -1:
                break  # a turn that never ends; the count check below reports it
            end += len(_END_OF_TURN)
            spans.append((start, end))
            header = text.find(_ASSISTANT_HEADER, end)
        if len(spans) != turns:
            raise EncodeError(
                index,
                f"the rendering has {len(spans)} ChatML assistant turn(s) for {turns} assistant "
                f"message(s); a message probably contains {_ASSISTANT_HEADER!r} or "
                f"{_END_OF_TURN!r} as text, which Qwen3_5Template cannot tell from the markup",
            )
        return spans
