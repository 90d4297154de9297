"""Sampled sequences written as OpenAI's answers: a whole ``chat.completion`` or
``text_completion``, or the chunks of its server-sent event stream.

Choices are numbered prompt by prompt, ``n`` per prompt (OpenAI's order). A stream sends,
for each choice, one chunk per generated token whose text is what that token adds to the
decoded completion (a token ending inside a multi-byte character adds nothing until the
character completes), then a chunk with the ``finish_reason``; with
``stream_options.include_usage`` a last chunk carries the usage and no choices.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from twinkle.data_format import SampledSequence, SampleResponse
from twinkle.server.errors import as_api_error
from twinkle.server.observability.requests import current_request_id
from twinkle.server.openai.errors import openai_error_body

FINISH = {"stop": "stop", "length": "length", "abort": "stop"}


@dataclass(frozen=True)
class Answer:
    """What every chunk and answer repeats."""

    id: str
    created: int
    model: str
    chat: bool

    @property
    def object(self) -> str:
        return "chat.completion" if self.chat else "text_completion"

    def head(self, chunk: bool = False) -> dict[str, Any]:
        kind = "chat.completion.chunk" if chunk and self.chat else self.object
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}


def choices_of(responses: list[SampleResponse]) -> list[SampledSequence]:
    return [sequence for response in responses for sequence in response.sequences]


def usage(responses: list[SampleResponse], prompt_tokens: list[int]) -> dict[str, int]:
    completion = sum(len(s.tokens) for s in choices_of(responses))
    prompt = sum(prompt_tokens)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def whole(
    answer: Answer,
    responses: list[SampleResponse],
    prompt_tokens: list[int],
    tokenizer: Any,
    top: int | None,
) -> dict[str, Any]:
    choices = []
    for index, sequence in enumerate(choices_of(responses)):
        text = sequence.text or ""
        choice: dict[str, Any] = {"index": index, "finish_reason": FINISH[sequence.stop_reason]}
        if answer.chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        choice["logprobs"] = None if top is None else _logprobs(answer, sequence, tokenizer, top)
        choices.append(choice)
    return {**answer.head(), "choices": choices, "usage": usage(responses, prompt_tokens)}


def stream(
    answer: Answer,
    responses: list[SampleResponse],
    prompt_tokens: list[int],
    tokenizer: Any,
    top: int | None,
    include_usage: bool,
) -> Iterator[str]:
    """The server-sent events of an answer already sampled whole, ``data: [DONE]`` last
    (for samplers that do not stream their tokens)."""
    for index, sequence in enumerate(choices_of(responses)):
        pieces = token_pieces(sequence, tokenizer)
        for position, piece in enumerate(pieces):
            pairs = (sequence.logprobs or [None] * len(pieces))[position]
            token = sequence.tokens[position]
            yield token_chunk(answer, index, position, piece, token, pairs, tokenizer, top)
        yield finish_chunk(answer, index, sequence.stop_reason)
    yield from end_chunks(answer, responses, prompt_tokens, include_usage)


def token_chunk(
    answer: Answer,
    index: int,
    position: int,
    piece: str,
    token: int,
    pairs: Any,
    tokenizer: Any,
    top: int | None,
) -> str:
    """The event of choice ``index``'s token at ``position``, adding ``piece`` to its text."""
    choice: dict[str, Any] = {"index": index, "finish_reason": None}
    if answer.chat:
        delta: dict[str, Any] = {"content": piece}
        if position == 0:
            delta["role"] = "assistant"
        choice["delta"] = delta
    else:
        choice["text"] = piece
    if top is not None and pairs is not None:
        one = SampledSequence(tokens=[token], logprobs=[pairs], stop_reason="length")
        choice["logprobs"] = _logprobs(answer, one, tokenizer, top)
    return _event({**answer.head(chunk=True), "choices": [choice]})


def finish_chunk(answer: Answer, index: int, stop_reason: str, piece: str = "") -> str:
    """Choice ``index``'s last event: the rest of its text, if any, and why it ended."""
    last: dict[str, Any] = {"index": index, "finish_reason": FINISH[stop_reason]}
    if answer.chat:
        last["delta"] = {"content": piece} if piece else {}
    else:
        last["text"] = piece
    return _event({**answer.head(chunk=True), "choices": [last]})


def end_chunks(
    answer: Answer, responses: list[SampleResponse], prompt_tokens: list[int], include_usage: bool
) -> Iterator[str]:
    if include_usage:
        body = {**answer.head(chunk=True), "choices": [], "usage": usage(responses, prompt_tokens)}
        yield _event(body)
    yield "data: [DONE]\n\n"


def token_pieces(sequence: SampledSequence, tokenizer: Any) -> list[str]:
    """Per generated token, the text it adds; together exactly ``sequence.text`` (the
    sampler cut the stop string from it, so later tokens add nothing)."""
    text = sequence.text or ""
    pieces, sent = [], 0
    for end in range(1, len(sequence.tokens) + 1):
        decoded = tokenizer.decode(sequence.tokens[:end], skip_special_tokens=True)
        if decoded.endswith("\ufffd"):  # half a character: wait for the rest of its bytes
            pieces.append("")
            continue
        reach = min(len(decoded), len(text))
        pieces.append(text[sent:reach] if reach > sent else "")
        sent = max(sent, reach)
    if pieces and sent < len(text):
        pieces[-1] += text[sent:]
    return pieces


def _logprobs(answer: Answer, sequence: SampledSequence, tokenizer: Any, top: int) -> dict:
    entries = sequence.logprobs or []
    if answer.chat:
        content = [
            {
                **_token(tokenizer, pairs[0]),
                "top_logprobs": [_token(tokenizer, pair) for pair in pairs[1 : 1 + top]],
            }
            for pairs in entries
        ]
        return {"content": content}
    tokens = [tokenizer.decode([pairs[0][0]]) for pairs in entries]
    offsets, at = [], 0
    for token in tokens:
        offsets.append(at)
        at += len(token)
    return {
        "tokens": tokens,
        "token_logprobs": [pairs[0][1] for pairs in entries],
        "top_logprobs": [
            {tokenizer.decode([t]): lp for t, lp in pairs[1 : 1 + top]} for pairs in entries
        ],
        "text_offset": offsets,
    }


def _token(tokenizer: Any, pair: tuple[int, float]) -> dict[str, Any]:
    text = tokenizer.decode([pair[0]])
    return {"token": text, "logprob": pair[1], "bytes": list(text.encode("utf-8"))}


def error_event(exc: BaseException) -> str:
    """A failure after a stream began (its 200 is sent): an event holding the error in
    OpenAI's shape, as OpenAI's own streams end on one."""
    answer = as_api_error(exc)
    body = {**answer.body(), "request_id": current_request_id()}
    return _event(openai_error_body(body, answer.status))


def _event(body: dict[str, Any]) -> str:
    return f"data: {json.dumps(body, ensure_ascii=False, separators=(',', ':'))}\n\n"
