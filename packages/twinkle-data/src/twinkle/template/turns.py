"""Find an assistant reply without ``{% generation %}`` blocks: render the conversation up
to the reply with ``add_generation_prompt=True`` and through it; the reply is what the
second adds, up to and including its last stop token (the newline some formats write
after the end-of-turn token is not the model's to write)."""

from __future__ import annotations

import json
from pathlib import Path

from transformers import PreTrainedTokenizerBase

from twinkle.template.history import common_prefix_length
from twinkle.template.rendering import Span

_BEFORE, _AFTER = 30, 50


def stop_tokens(tokenizer: PreTrainedTokenizerBase, folder: Path | None) -> tuple[str, ...]:
    """The tokens that end a reply: the tokenizer's eos token and the ``eos_token_id``
    of the model's ``generation_config.json`` (Gemma and Llama 3 end turns with a token
    other than eos), as strings, in id order."""
    ids = set() if tokenizer.eos_token_id is None else {tokenizer.eos_token_id}
    config = None if folder is None else folder / "generation_config.json"
    if config is not None and config.is_file():
        eos = json.loads(config.read_text()).get("eos_token_id")
        ids.update([eos] if isinstance(eos, int) else eos or [])
    return tuple(tokenizer.convert_ids_to_tokens(sorted(ids)))


def reply_span(prompt: str, through: str, stops: tuple[str, ...]) -> Span | str:
    """The reply's span in ``through`` (the conversation rendered through the reply),
    given ``prompt`` (rendered up to it with the generation prompt); or, when ``prompt``
    is not where ``through`` starts, a description of where they differ."""
    if not through.startswith(prompt):
        at = common_prefix_length(prompt, through)
        start = max(0, at - _BEFORE)
        return (
            f"from character {at} the generation prompt reads {prompt[start : at + _AFTER]!r} "
            f"but the conversation through the reply reads {through[start : at + _AFTER]!r}"
        )
    start = len(prompt)
    ends = [through.rfind(stop, start) + len(stop) for stop in stops if stop in through[start:]]
    return start, max(ends, default=len(through))


def nth_reply(text: str, header: str, turn: int, turns: int, stops: tuple[str, ...]) -> Span | None:
    """Where assistant turn ``turn`` of ``turns`` sits in ``text`` (a rewritten turn) when
    the whole rendering opens exactly ``turns`` replies with ``header``: from after its
    header through its first stop token; None when the headers do not count the turns."""
    if not header:
        return None
    starts = []
    at = text.find(header)
    while at != -1:
        starts.append(at + len(header))
        at = text.find(header, starts[-1])
    if len(starts) != turns:
        return None
    start = starts[turn]
    limit = starts[turn + 1] if turn + 1 < turns else len(text)
    ends = [text.find(stop, start, limit) for stop in stops]
    ends = [end + len(stop) for end, stop in zip(ends, stops, strict=True) if end != -1]
    return (start, min(ends)) if ends else None


def locate_reply(text: str, reply: str, after: int, header: str) -> Span:
    """Where a reply that the whole conversation renders differently (a rewritten turn)
    sits in ``text`` after ``after``: the longest end of ``reply`` found there (what a
    rewrite keeps is the end: the answer and its end-of-turn token), starting right after
    as much of the reply ``header`` as the whole rendering kept; an empty span when no
    part of it is found."""
    low, high = 0, len(reply)  # invariant: the last `low` characters are found
    while low < high:
        middle = (low + high + 1) // 2
        if text.find(reply[len(reply) - middle :], after) != -1:
            low = middle
        else:
            high = middle - 1
    if low == 0:
        return after, after
    start = text.find(reply[len(reply) - low :], after)
    end = start + low
    candidates = range(start, min(end, start + len(header)) + 1)
    start = max(candidates, key=lambda at: (_header_before(text, at, header), -at))
    return start, end


def _header_before(text: str, at: int, header: str) -> int:
    """How many leading characters of ``header`` end ``text`` just before ``at``."""
    for length in range(min(len(header), at), 0, -1):
        if text[at - length : at] == header[:length]:
            return length
    return 0
