"""Query/response rows (``query``, ``response``, optional ``system`` and ``history``)
become one conversation, their text used as written."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from twinkle.data_format import Trajectory
from twinkle.preprocessor.base import (
    PREPROCESSORS,
    Preprocessor,
    RowFieldError,
    require,
    system_turn,
)


def history_turns(row: Mapping[str, Any]) -> list[dict[str, str]]:
    """The user/assistant turns of a ``history`` column: earlier ``[query, response]`` pairs."""
    history = row.get("history")
    if not history:
        return []
    if not isinstance(history, list):
        raise RowFieldError(
            "history", f"must be a list of [query, response] pairs, got {history!r}"
        )
    turns = []
    for i, pair in enumerate(history):
        if not (
            isinstance(pair, list | tuple)
            and len(pair) == 2
            and all(isinstance(t, str) for t in pair)
        ):
            raise RowFieldError(
                "history", f"item {i} must be a [query, response] pair, got {pair!r}"
            )
        turns += [{"role": "user", "content": pair[0]}, {"role": "assistant", "content": pair[1]}]
    return turns


@PREPROCESSORS.register
class QueryResponseProcessor(Preprocessor):
    """``{'query', 'response'}`` -> user ``query``, assistant ``response``; a non-empty
    ``system`` becomes the system message and ``history`` (``[[query, response], ...]``)
    the turns before. Text is kept as written: the ``{{NAME}}``/``{{AUTHOR}}`` placeholders
    of self-cognition rows stay unless :class:`SelfCognitionProcessor` fills them."""

    def __call__(self, row: Mapping[str, Any]) -> Trajectory:
        messages = system_turn(row) + history_turns(row)
        messages += [
            {"role": "user", "content": require(row, "query")},
            {"role": "assistant", "content": require(row, "response")},
        ]
        return Trajectory(messages=messages)
