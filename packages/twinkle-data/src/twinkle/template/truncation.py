"""Fit an encoded sequence into ``max_length`` tokens."""

from __future__ import annotations

from typing import Literal, TypeAlias

import numpy as np

from twinkle.template.errors import EncodeError
from twinkle.template.labels import IGNORE_INDEX

TruncationStrategy: TypeAlias = Literal["raise", "left", "right", "delete"]
TRUNCATION_STRATEGIES: tuple[str, ...] = ("raise", "left", "right", "delete")


def truncate(
    input_ids: np.ndarray,
    labels: np.ndarray | None,
    *,
    max_length: int | None,
    strategy: TruncationStrategy,
    index: int,
) -> tuple[np.ndarray, np.ndarray | None] | None:
    """The sequence cut to ``max_length`` tokens, or None for ``'delete'``.

    ``'left'`` keeps the last tokens, ``'right'`` the first. ``labels`` is None for a
    generation prompt, which ``'right'`` would cut off from its assistant header, so that
    is an error, as is a training row left without a single labelled token.
    """
    length = len(input_ids)
    if max_length is None or length <= max_length:
        return input_ids, labels
    if strategy == "delete":
        return None
    if strategy == "raise":
        raise EncodeError(
            index,
            f"is {length} tokens long, more than max_length={max_length}; raise max_length or "
            "pass truncation_strategy='left', 'right' or 'delete'",
        )
    if labels is None and strategy == "right":
        raise EncodeError(
            index,
            f"is a {length}-token generation prompt; cutting it to max_length={max_length} from "
            "the right would remove the assistant header it ends with; use "
            "truncation_strategy='left' or 'delete' for prompts",
        )
    kept = slice(-max_length, None) if strategy == "left" else slice(0, max_length)
    input_ids = input_ids[kept]
    if labels is not None:
        labels = labels[kept]
        if not (labels != IGNORE_INDEX).any():
            raise EncodeError(
                index,
                f"has no assistant token left after truncation_strategy={strategy!r} cut it "
                f"from {length} to max_length={max_length} tokens; raise max_length or pass "
                "truncation_strategy='delete'",
            )
    return input_ids, labels
