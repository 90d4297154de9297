"""The two extension points of data ETL: a Preprocessor turns a raw row into a Trajectory,
a Filter decides whether a row stays. Both are looked up by name in a registry, so
``dataset.map('SelfCognitionProcessor', init_args=...)`` and
``dataset.map(SelfCognitionProcessor(...))`` mean the same thing.

``Dataset.map`` hands a preprocessor plain dicts and may hash the preprocessor to
fingerprint the result for the ``datasets`` cache: keep a preprocessor's state to its
constructor arguments (no counters, no open files), so an unchanged pipeline is a cache hit.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from twinkle.data_format import Trajectory
from twinkle.utils import Registry


class RowFieldError(ValueError):
    """A row lacks a field a preprocessor needs, or the field holds the wrong kind of value.

    ``field`` names it; ``Dataset.map`` adds the dataset and the row index to the message.
    """

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"field {field!r}: {reason}")
        self.field = field
        self.reason = reason

    def __reduce__(self) -> tuple:  # survive pickling out of a datasets worker process
        return type(self), (self.field, self.reason)


def require(row: Mapping[str, Any], field: str, kind: type | tuple[type, ...] = str) -> Any:
    """``row[field]``, checked to be present, not None, and an instance of ``kind``."""
    if field not in row or row[field] is None:
        present = ", ".join(sorted(row)) or "none"
        raise RowFieldError(field, f"missing from the row (its fields: {present})")
    value = row[field]
    kinds = _as_tuple(kind)
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        names = " or ".join(k.__name__ for k in kinds)
        raise RowFieldError(field, f"must be a {names}, got {type(value).__name__}: {value!r}")
    return value


def system_turn(row: Mapping[str, Any]) -> list[dict[str, str]]:
    """The system message of a row's non-empty ``system`` column, as a list of zero or one."""
    return [{"role": "system", "content": require(row, "system")}] if row.get("system") else []


def _as_tuple(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


class Preprocessor:
    """Maps one raw row (a dict of the dataset's columns) to a :class:`Trajectory`
    (``messages``, optional ``tools``, ``user_data``). A dict with those keys is accepted
    too; ``Dataset.map`` validates it either way.

    Subclasses implement ``__call__``. Override :meth:`batch` only when rows are cheaper to
    process together; ``Dataset.map(batched=True)`` calls it with up to ``batch_size`` rows.
    Raise :class:`RowFieldError` (see :func:`require`) for a row that lacks what you need.

    ``user_data`` has one shape everywhere: a list holding one dict of the fields a reward
    reads back, e.g. ``[{'answer': '42'}]``; read it with
    ``trajectory.get('user_data', [{}])[0].get('answer')``.
    """

    def __call__(self, row: Mapping[str, Any]) -> Trajectory | dict[str, Any]:
        raise NotImplementedError(f"{type(self).__name__} must implement __call__(row)")

    def batch(self, rows: Sequence[Mapping[str, Any]]) -> list[Trajectory | dict[str, Any]]:
        """One Trajectory per row, in order; the default calls ``self(row)`` for each."""
        return [self(row) for row in rows]

    def __repr__(self) -> str:
        args = ", ".join(f"{key}={value!r}" for key, value in vars(self).items())
        return f"{type(self).__name__}({args})"


class Filter:
    """Decides whether a row stays: ``__call__(row) -> bool`` (True keeps it).

    It sees a row as the dataset hands it out: a dict before ``map``, a Trajectory after
    it, an InputFeature after ``encode``.
    """

    def __call__(self, row: Any) -> bool:
        raise NotImplementedError(f"{type(self).__name__} must implement __call__(row)")

    def __repr__(self) -> str:
        args = ", ".join(f"{key}={value!r}" for key, value in vars(self).items())
        return f"{type(self).__name__}({args})"


PREPROCESSORS: Registry = Registry("preprocessor", base=Preprocessor)
"""Preprocessors by name: ``PREPROCESSORS.register`` adds one (the name is the class name)."""

FILTERS: Registry = Registry("filter", base=Filter)
"""Filters by name."""
