"""The template's rendering of an observation, as the tokens a rollout appends after a turn.

The chat template is asked to render a fixed stand-in history (a user message, then an
assistant message holding a marker) followed by the observation and the generation prompt;
the text after the marker is what the template writes between the end of an assistant's
text and the start of the next assistant turn: for ChatML ``<|im_end|>\\n<|im_start|>user\\n
<tool_response>\\n...\\n</tool_response><|im_end|>\\n<|im_start|>assistant\\n``. The end-of-turn
text the model already sampled is cut from its start, so only what the model did not write
is appended. The model's own tokens are never decoded and tokenized again: a rollout's
sequence is the sampled tokens plus these.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from twinkle.data_format import Message, Tool

_MARKER = "\u2063twinkle-assistant-turn\u2063"
_STAND_IN_QUESTION = "."


def observation_text(
    template: Any, observation: Sequence[Message], tools: list[Tool] | None
) -> str:
    """The text the template writes after an assistant's reply for ``observation`` up to
    and including the next generation prompt (the reply's end-of-turn text first)."""
    history = [
        Message(role="user", content=_STAND_IN_QUESTION),
        Message(role="assistant", content=_MARKER),
    ]
    trajectory = {"messages": [*history, *observation], "tools": tools}
    text = template.render(trajectory, add_generation_prompt=True)
    at = text.rfind(_MARKER)
    if at < 0:
        raise ValueError(
            f"the chat template of {template.model_id} does not write an assistant message's "
            "content verbatim, so the observation's rendering cannot be cut from it"
        )
    return text[at + len(_MARKER) :]


def observation_tokens(
    template: Any,
    observation: Sequence[Message],
    tools: list[Tool] | None,
    sampled_end: str,
) -> list[int]:
    """The token ids to append after a turn whose last sampled token decodes to
    ``sampled_end`` (``'<|im_end|>'`` when the model closed its turn itself, else any text)."""
    text = observation_text(template, observation, tools)
    if sampled_end and text.startswith(sampled_end):
        text = text[len(sampled_end) :]
    return template.tokenizer(text, add_special_tokens=False)["input_ids"]
