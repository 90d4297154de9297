"""Token labels from character spans: the bridge between a rendered conversation and its
tokens."""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from typing import TYPE_CHECKING

import numpy as np

from twinkle.template.rendering import Span

if TYPE_CHECKING:
    from tokenizers import Encoding

IGNORE_INDEX = -100
"""The label of a token outside the loss."""


def labels_from_spans(input_ids: np.ndarray, encoding: Encoding, spans: list[Span]) -> np.ndarray:
    """``labels[i] = input_ids[i]`` for every token whose characters overlap a span, else
    -100; not shifted. ``encoding`` is the fast tokenizer's encoding of the rendered text.

    A token that straddles a span boundary (a BPE merge across it) is labelled, the rule
    ``apply_chat_template(return_assistant_tokens_mask=True)`` follows: the model has to
    produce that token to write the span.
    """
    labels = np.full(len(input_ids), IGNORE_INDEX, dtype=np.int64)
    for start, end in spans:
        first, stop = _overlapping_tokens(encoding, start, end)
        labels[first:stop] = input_ids[first:stop]
    return labels


def _overlapping_tokens(encoding: Encoding, start: int, end: int) -> tuple[int, int]:
    """``[first, stop)``: the tokens whose characters overlap ``[start, end)``; tokens come
    in text order, so they are contiguous."""
    if start < end:
        # Fast path, no offset list: the first token holding each end character...
        first, last = encoding.char_to_token(start), encoding.char_to_token(end - 1)
        if first is not None and last is not None:
            # ...plus the tokens after it that share that character (byte-level BPE splits
            # a multi-byte character into several tokens with the same offsets).
            while last + 1 < len(encoding):
                chars = encoding.token_to_chars(last + 1)  # None for a token with no text
                if chars is None or chars[0] >= end:
                    break
                last += 1
            return first, last + 1
    # An empty span, or an end character no token holds (a normalizer dropped it).
    offsets = encoding.offsets
    first = bisect_right(offsets, start, key=lambda offset: offset[1])
    return first, bisect_left(offsets, end, lo=first, key=lambda offset: offset[0])
