"""The error for a row that a preprocessor, filter or template cannot handle, and the
policy for such rows: raise (the default) or drop them, counted and logged; and the error
for a dataset step called out of order."""

from __future__ import annotations

from typing import Literal

import pydantic

ON_ERROR = ("raise", "drop")
OnError = Literal["raise", "drop"]


class StageError(RuntimeError, ValueError):
    """A dataset step called out of order (encode before set_template, map after encode).
    A RuntimeError, as calling in the wrong order is, and a ValueError so that a service
    running the dataset for a client answers it as the client's mistake (a 400)."""


class DataRowError(ValueError):
    """A row failed: names the source dataset, the row's index in it, and the field."""

    def __init__(self, dataset: str, index: int, field: str | None, reason: str) -> None:
        where = f"field {field!r}" if field else "field unknown"
        super().__init__(
            f"dataset {dataset!r}, row {index}, {where}: {reason}. Fix the row, or pass "
            "on_error='drop' to skip rows like it (they are counted and logged)"
        )
        self.dataset = dataset
        self.index = index
        self.field = field
        self.reason = reason

    def __reduce__(self) -> tuple:  # survive pickling out of a datasets worker process
        return type(self), (self.dataset, self.index, self.field, self.reason)


def check_on_error(on_error: str) -> None:
    if on_error not in ON_ERROR:
        raise ValueError(
            f"on_error must be one of {', '.join(map(repr, ON_ERROR))}, got {on_error!r}"
        )


def field_of(error: BaseException, default: str | None = None) -> str | None:
    """The field an error is about, when it can tell: a RowFieldError's ``field``, the key
    of a KeyError, the first location of a pydantic ValidationError."""
    field = getattr(error, "field", None)
    if isinstance(field, str):
        return field
    if isinstance(error, KeyError) and error.args and isinstance(error.args[0], str):
        return error.args[0]
    if isinstance(error, pydantic.ValidationError) and error.errors():
        return ".".join(str(part) for part in error.errors()[0]["loc"]) or default
    return default


def reason_of(error: BaseException) -> str:
    reason = getattr(error, "reason", None)
    if isinstance(reason, str):
        return reason
    text = str(error).strip().replace("\n", " ")
    return f"{type(error).__name__}: {text}" if text else type(error).__name__
