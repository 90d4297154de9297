"""Compare a trained turn as rendered in the whole conversation with the same turn rendered
turn by turn (the conversation cut right after it), which is the context the model has
when it writes that turn."""

from __future__ import annotations

import os

from twinkle.template.rendering import Span

_BEFORE, _AFTER = 30, 50


def history_difference(
    full_text: str, full_span: Span, prefix_text: str, prefix_span: Span
) -> str | None:
    """None when the cut rendering, up to the end of the turn, equals the whole rendering
    and the turn sits at the same place in both; otherwise where and how they differ."""
    end = prefix_span[1]
    if full_span == prefix_span and full_text[:end] == prefix_text[:end]:
        return None
    at = len(os.path.commonprefix([full_text[:end], prefix_text[:end]]))
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
