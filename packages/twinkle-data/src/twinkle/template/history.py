"""Compare a trained turn as rendered in the whole conversation with the same turn rendered
turn by turn (the conversation cut right after it), which is the context the model has
when it writes that turn."""

from __future__ import annotations

import re

from twinkle.template.rendering import Span

_BEFORE, _AFTER = 30, 50


def common_prefix_length(a: str, b: str) -> int:
    """How many leading characters ``a`` and ``b`` share: a bisection over slice
    comparisons, which run in C (``os.path.commonprefix`` walks the characters in Python,
    slow on whole conversations)."""
    low, high = 0, min(len(a), len(b))
    while low < high:
        middle = (low + high + 1) // 2
        if a[low:middle] == b[low:middle]:
            low = middle
        else:
            high = middle - 1
    return low


def history_difference(
    full_text: str, full_span: Span, prefix_text: str, prefix_span: Span
) -> str | None:
    """None when the cut rendering, up to the end of the turn, equals the whole rendering
    and the turn sits at the same place in both; otherwise where and how they differ."""
    end = prefix_span[1]
    if full_span == prefix_span and full_text[:end] == prefix_text[:end]:
        return None
    at = common_prefix_length(full_text[:end], prefix_text[:end])
    if at == end:
        return (
            f"the text is the same, but the turn spans characters {list(prefix_span)} turn by "
            f"turn and {list(full_span)} in the whole conversation"
        )
    start = max(0, at - _BEFORE)
    return (
        f"from character {at} the turn-by-turn rendering reads "
        f"{prefix_text[start : at + _AFTER]!r} but the whole conversation reads "
        f"{full_text[start : at + _AFTER]!r}"
    )


def markup_run(text: str, start: int, end: int, markup: re.Pattern[str]) -> bool:
    """Whether ``text[start:end]`` is nothing but markup (added tokens and whitespace)."""
    return markup.fullmatch(text, start, end) is not None


def markup_only_rewrite(
    full_text: str, prefix_text: str, prefix_span: Span, markup: re.Pattern[str], longest: int
) -> Span | None:
    """The turn's span in the whole rendering when the turn-by-turn rendering, up to the end
    of the turn, is the whole rendering with one run of markup more (``markup`` matches
    added tokens and whitespace, the longest ``longest`` characters): a rewrite that drops
    no text of the conversation, such as the empty think block Qwen3 writes on a final
    reply and leaves out once the reply is an earlier turn. None for any other difference.

    The run may start up to ``longest`` characters before the two renderings part (a reply
    that begins like the markup, ``<tool_call>`` after ``<think>``)."""
    start, end = prefix_span
    parted = common_prefix_length(full_text[:end], prefix_text[:end])
    for at in range(parted, max(-1, parted - longest - 1), -1):
        found = markup.match(prefix_text, at, end)
        if found is None:
            continue
        for cut in range(at + 1, found.end() + 1):  # the shortest run: the reply keeps its end
            length = cut - at
            if markup_run(prefix_text, at, cut, markup) and full_text.startswith(
                prefix_text[cut:end], at
            ):
                shift = 0 if start <= at else min(length, start - at)
                return start - shift, end - length
    return None


def markup_pattern(tokens: list[str]) -> re.Pattern[str]:
    """A pattern for runs of ``tokens`` (a tokenizer's added tokens) and whitespace."""
    alternatives = sorted(tokens, key=len, reverse=True)
    return re.compile("(?:" + "|".join([*map(re.escape, alternatives), r"\s"]) + ")+")
