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

import functools
import json
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
    observations: Sequence[tuple[Sequence[Message], list[Tool] | None, str]],
) -> list[list[int]]:
    """The token ids to append after each of several turns, in one tokenizer call: for
    ``(observation, tools, sampled_end)``, where ``sampled_end`` is what the turn's last
    sampled token decodes to (``'<|im_end|>'`` when the model closed its turn itself)."""
    texts = []
    for observation, tools, sampled_end in observations:
        text = _cached_text(template, _key(observation), _key(tools or []))
        if sampled_end and text.startswith(sampled_end):
            text = text[len(sampled_end) :]
        texts.append(text)
    if not texts:
        return []
    return template.tokenizer(texts, add_special_tokens=False)["input_ids"]


def _key(models: Sequence[Any]) -> str:
    return json.dumps([m.to_dict() if hasattr(m, "to_dict") else m for m in models])


@functools.lru_cache(maxsize=4096)
def _cached_text(template: Any, observation_json: str, tools_json: str) -> str:
    """Observations repeat (a tool's errors, the same results): render each once."""
    observation = [Message.model_validate(m) for m in json.loads(observation_json)]
    tools = [Tool.model_validate(t) for t in json.loads(tools_json)] or None
    return observation_text(template, observation, tools)
