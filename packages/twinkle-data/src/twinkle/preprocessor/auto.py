"""The preprocessor ``encode()`` uses when no ``map`` came first: it recognises the common
shapes of raw rows and converts each with the built-in preprocessor for that shape.

The shapes, tried in this order (a field counts when it is present and not None):

- ``messages``: chat turns of ``role``/``content`` (optional ``tools``), as
  :class:`MessagesProcessor`; turns of ``from``/``value`` go through :class:`ShareGPTProcessor`;
- ``conversations``: ShareGPT turns of ``from``/``value`` (optional ``system``, ``tools``);
- ``instruction`` + ``output``: Alpaca (optional ``input``, ``system``);
- ``query`` + ``response``: one exchange (optional ``system``, ``history``), text as
  written; self-cognition placeholders stay unless ``SelfCognitionProcessor`` fills them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from twinkle.data_format import Trajectory
from twinkle.preprocessor.alpaca import AlpacaProcessor
from twinkle.preprocessor.base import PREPROCESSORS, Preprocessor
from twinkle.preprocessor.messages import MessagesProcessor, json_or_list
from twinkle.preprocessor.query_response import QueryResponseProcessor
from twinkle.preprocessor.sharegpt import ShareGPTProcessor

ROW_SHAPES = {
    "messages": "messages (role/content turns; optional tools)",
    "sharegpt": "conversations (ShareGPT from/value turns; optional system, tools)",
    "alpaca": "instruction + output (Alpaca; optional input, system)",
    "query_response": "query + response (optional system, history)",
}
"""Each shape the automatic preprocessor knows, by name, with the fields that make it."""


class UnknownRowShapeError(ValueError):
    """A raw row matches none of ``ROW_SHAPES``; names its fields and the known shapes."""

    def __init__(self, fields: list[str]) -> None:
        self.fields = fields
        self.field = None
        self.reason = (
            f"encode() without map() converts raw rows of a known shape, but this row's fields "
            f"are {', '.join(fields) or 'none'}; the shapes it knows are: "
            f"{'; '.join(ROW_SHAPES.values())}. Rename the columns to one of these, or call "
            "map(...) with a preprocessor (or a function row -> Trajectory) before encode()"
        )
        super().__init__(self.reason)

    def __reduce__(self) -> tuple:  # survive pickling out of a datasets worker process
        return type(self), (self.fields,)


def _present(row: Mapping[str, Any], *fields: str) -> bool:
    return all(row.get(field) is not None for field in fields)


def _speaks_sharegpt(row: Mapping[str, Any], field: str) -> bool:
    """Whether the first turn of ``row[field]`` is a ShareGPT ``from``/``value`` turn."""
    try:
        turns = json_or_list(row, field)
    except ValueError:
        return False  # not a list: the messages preprocessor reports it
    return bool(turns) and isinstance(turns[0], Mapping) and "from" in turns[0]


def row_shape(row: Mapping[str, Any]) -> str | None:
    """The name (a key of ``ROW_SHAPES``) of the first shape ``row`` has, or None."""
    if _present(row, "messages"):
        return "sharegpt" if _speaks_sharegpt(row, "messages") else "messages"
    if _present(row, "conversations"):
        return "sharegpt"
    if _present(row, "instruction", "output"):
        return "alpaca"
    if _present(row, "query", "response"):
        return "query_response"
    return None


@PREPROCESSORS.register
class AutoPreprocessor(Preprocessor):
    """Converts each raw row by its shape (see ``ROW_SHAPES``); a row of another shape
    raises :class:`UnknownRowShapeError`. What ``encode()`` maps with when nothing was
    mapped before."""

    def __init__(self) -> None:
        # Held as attributes so the datasets cache key covers their code (fingerprint.py).
        self.messages = MessagesProcessor()
        self.sharegpt = ShareGPTProcessor()
        self.sharegpt_messages = ShareGPTProcessor(field="messages")
        self.alpaca = AlpacaProcessor()
        self.query_response = QueryResponseProcessor()

    def __call__(self, row: Mapping[str, Any]) -> Trajectory:
        shape = row_shape(row)
        if shape is None:
            fields = [key if row[key] is not None else f"{key} (empty)" for key in sorted(row)]
            raise UnknownRowShapeError(fields)
        if shape == "sharegpt" and _present(row, "messages"):
            return self.sharegpt_messages(row)
        return getattr(self, shape)(row)

    def __repr__(self) -> str:
        return "AutoPreprocessor()"
