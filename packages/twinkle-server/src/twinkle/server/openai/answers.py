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
    """The server-sent events of the whole answer, ``data: [DONE]`` last."""
    for index, sequence in enumerate(choices_of(responses)):
        pieces = token_pieces(sequence, tokenizer)
        for position, piece in enumerate(pieces):
            delta: dict[str, Any] = {"content": piece} if answer.chat else {}
            if answer.chat and position == 0:
                delta["role"] = "assistant"
            choice: dict[str, Any] = {"index": index, "finish_reason": None}
            if answer.chat:
                choice["delta"] = delta
            else:
                choice["text"] = piece
            if top is not None:
                one = sequence.model_copy(
                    update={
                        "tokens": sequence.tokens[position : position + 1],
                        "logprobs": (sequence.logprobs or [])[position : position + 1],
                    }
                )
                choice["logprobs"] = _logprobs(answer, one, tokenizer, top)
            yield _event({**answer.head(chunk=True), "choices": [choice]})
        last: dict[str, Any] = {"index": index, "finish_reason": FINISH[sequence.stop_reason]}
        if answer.chat:
            last["delta"] = {}
        else:
            last["text"] = ""
        yield _event({**answer.head(chunk=True), "choices": [last]})
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


def _event(body: dict[str, Any]) -> str:
    return f"data: {json.dumps(body, ensure_ascii=False, separators=(',', ':'))}\n\n"
