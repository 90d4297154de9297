"""Streaming tokens as the sampler draws them (samplers whose ``streams_tokens`` is True).

The sampler's worker thread hands each token to the event loop (``call_soon_threadsafe``),
and the response writes a chunk per token while the completion is still being generated.
A token's text is what it adds to the decoded completion so far, held back while it could
still be the start of a stop string (the sampler cuts a stop string from the text) or ends
inside a multi-byte character; the finish chunk carries whatever was held back, so a
choice's pieces add up to the whole answer's text.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from twinkle.data_format import SampleResponse
from twinkle.server.openai import answers

DONE = object()


@dataclass
class _Choice:
    tokens: list[int] = field(default_factory=list)
    sent: int = 0  # characters of text already sent


class LiveStream:
    """The queue between the worker's ``on_token`` calls and one streamed answer."""

    def __init__(self, loop: asyncio.AbstractEventLoop, per_prompt: int) -> None:
        self.loop = loop
        self.per_prompt = per_prompt
        self.queue: asyncio.Queue = asyncio.Queue()

    def listener(self, prompt: int):
        """The ``on_token`` of prompt ``prompt``'s work; called on the worker thread."""

        def heard(row: int, token: int, pairs: Any) -> None:
            item = (prompt * self.per_prompt + row, token, pairs)
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)

        return heard

    def watch(self, future: Future) -> None:
        future.add_done_callback(
            lambda _: self.loop.call_soon_threadsafe(self.queue.put_nowait, DONE)
        )

    async def first(self) -> Any:
        """The first item (a token, or DONE when the work ended without one)."""
        return await self.queue.get()

    async def events(
        self,
        first: Any,
        future: Future,
        answer: answers.Answer,
        tokenizer: Any,
        top: int | None,
        stops: tuple[str, ...],
        finish,
    ) -> AsyncIterator[str]:
        """The events from ``first`` on; ``finish(responses)`` gives the closing events."""
        choices: dict[int, _Choice] = {}
        item = first
        while item is not DONE:
            index, token, pairs = item
            choice = choices.setdefault(index, _Choice())
            choice.tokens.append(token)
            piece = _ready_text(choice, tokenizer, stops)
            position = len(choice.tokens) - 1
            yield answers.token_chunk(answer, index, position, piece, token, pairs, tokenizer, top)
            item = await self.queue.get()
        try:
            responses: list[SampleResponse] = future.result()
        except Exception as exc:  # noqa: BLE001 - the answer has begun: say so in the stream
            yield answers.error_event(exc)
            return
        for index, sequence in enumerate(answers.choices_of(responses)):
            text = sequence.text or ""
            sent = choices[index].sent if index in choices else 0
            yield answers.finish_chunk(answer, index, sequence.stop_reason, text[sent:])
        for event in finish(responses):
            yield event


def _ready_text(choice: _Choice, tokenizer: Any, stops: tuple[str, ...]) -> str:
    """The text this choice may send now: decoded so far, never past a stop string that
    occurs in it, less what could still become one (its length less one) and any half
    character."""
    text = tokenizer.decode(choice.tokens, skip_special_tokens=True)
    end = len(text) - max((len(s) - 1 for s in stops), default=0)
    found = [i for i in (text.find(s) for s in stops) if i >= 0]
    if found:
        end = min(end, min(found))
    if text.endswith("\ufffd"):
        end = min(end, len(text) - 1)
    if end <= choice.sent:
        return ""
    piece, choice.sent = text[choice.sent : end], end
    return piece
