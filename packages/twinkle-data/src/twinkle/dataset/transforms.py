"""The functions ``datasets.map`` runs over batches of stored rows: preprocess, filter,
encode. Each is a small picklable object whose state is exactly what it was built with,
so ``datasets`` fingerprints it the same way every run (an unchanged pipeline is a cache
hit) and can ship it to ``num_proc`` worker processes.

Each also carries a hash of its component's code (see ``fingerprint.py``), so an edited
preprocessor is not served the rows its old code wrote.

A row that raises is retried alone to find out which one it was, then either raises a
DataRowError (``on_error='raise'``) or is dropped and logged (``on_error='drop'``); a
batch that drops rows returns fewer rows, which is how the caller counts them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from twinkle.data_format import InputFeature, Trajectory
from twinkle.dataset.errors import DataRowError, field_of, reason_of
from twinkle.dataset.fingerprint import STORAGE_FORMAT, code_fingerprint
from twinkle.dataset.rows import (
    ENCODED_FEATURES,
    RAW,
    ROW,
    SOURCE,
    TRAJECTORY,
    TRAJECTORY_FEATURES,
    as_trajectory,
    feature_to_row,
    public,
    row_to_feature,
    row_to_trajectory,
    trajectory_dict,
    trajectory_to_row,
)
from twinkle.preprocessor import Filter, Preprocessor
from twinkle.utils import get_logger

logger = get_logger("twinkle.dataset")
_SHOWN_PER_BATCH = 3


def describe(component: object, limit: int = 60) -> str:
    """A component's repr for logs and progress bars, cut to ``limit`` characters."""
    text = repr(component)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def rows_of(batch: dict[str, list]) -> list[dict[str, Any]]:
    names = list(batch)
    count = len(batch[names[0]]) if names else 0
    return [{name: batch[name][i] for name in names} for i in range(count)]


def columns_of(rows: Sequence[dict[str, Any]], names: Sequence[str]) -> dict[str, list]:
    return {name: [row[name] for row in rows] for name in names}


def decode(row: dict[str, Any], stage: str) -> Any:
    """A stored row as the dataset hands it out at ``stage``."""
    if stage == RAW:
        return public(row)
    if stage == TRAJECTORY:
        return row_to_trajectory(row)
    return row_to_feature(row)


class _RowFailures:
    """Turns a failing row into a DataRowError, raised or kept for the drop log."""

    def __init__(self, what: str, on_error: str, default_field: str | None) -> None:
        self.what = what
        self.on_error = on_error
        self.default_field = default_field
        self.dropped: list[DataRowError] = []

    def fail(self, row: dict[str, Any], error: Exception) -> None:
        failure = DataRowError(
            row[SOURCE], row[ROW], field_of(error, self.default_field), reason_of(error)
        )
        if self.on_error == "raise":
            raise failure from error
        self.dropped.append(failure)

    def log(self) -> None:
        if not self.dropped:
            return
        shown = "; ".join(
            f"row {e.index} of {e.dataset!r}, field {e.field!r}: {e.reason}"
            for e in self.dropped[:_SHOWN_PER_BATCH]
        )
        more = len(self.dropped) - _SHOWN_PER_BATCH
        logger.warning(
            "%s dropped %d row(s) (on_error='drop'): %s%s",
            self.what,
            len(self.dropped),
            shown,
            f"; and {more} more" if more > 0 else "",
        )


def _apply(
    rows: Sequence[dict[str, Any]],
    batch_call: Callable[[], Sequence[Any]] | None,
    row_call: Callable[[int], Any],
    check: Callable[[int, Any], Any],
    failures: _RowFailures,
) -> list[tuple[int, Any]]:
    """``(index, checked result)`` for every row that succeeds, in order.

    ``batch_call`` (when given) handles all rows at once; if it raises, or returns a wrong
    count, or any result fails ``check``, each row is redone with ``row_call`` so the bad
    one is named. ``check(i, result)`` validates and converts a result.
    """
    if batch_call is not None:
        try:
            results = list(batch_call())
            if len(results) == len(rows):
                return [(i, check(i, out)) for i, out in enumerate(results)]
        except Exception:  # noqa: BLE001  (redone row by row below, which names the row)
            pass
    kept = []
    for i, row in enumerate(rows):
        try:
            kept.append((i, check(i, row_call(i))))
        except Exception as error:  # noqa: BLE001  (reported with the row, or dropped)
            failures.fail(row, error)
    return kept


class MapRows:
    """Preprocess a batch: stored rows at ``stage`` -> stored Trajectory rows."""

    def __init__(
        self, preprocessor: Preprocessor, stage: str, batched: bool, on_error: str
    ) -> None:
        self.preprocessor = preprocessor
        self.code = code_fingerprint(preprocessor)
        self.storage_format = STORAGE_FORMAT
        self.stage = stage
        self.batched = batched
        self.on_error = on_error

    def __call__(self, batch: dict[str, list]) -> dict[str, list]:
        rows = rows_of(batch)
        inputs = [self._input(row) for row in rows]
        failures = _RowFailures(f"map({describe(self.preprocessor)})", self.on_error, None)
        batch_call = (lambda: self.preprocessor.batch(inputs)) if self.batched else None
        kept = _apply(
            rows,
            batch_call,
            lambda i: self.preprocessor(inputs[i]),
            lambda i, out: trajectory_to_row(as_trajectory(out)),
            failures,
        )
        failures.log()
        out = [{**stored, SOURCE: rows[i][SOURCE], ROW: rows[i][ROW]} for i, stored in kept]
        return columns_of(out, list(TRAJECTORY_FEATURES))

    def _input(self, row: dict[str, Any]) -> dict[str, Any]:
        if self.stage == RAW:
            return public(row)
        return trajectory_dict(row_to_trajectory(row))


class FilterRows:
    """Filter a batch: a keep/drop mask, from the Filter's verdict on each decoded row."""

    def __init__(self, filter_: Filter, stage: str, on_error: str) -> None:
        self.filter = filter_
        self.code = code_fingerprint(filter_)
        self.storage_format = STORAGE_FORMAT
        self.stage = stage
        self.on_error = on_error

    def __call__(self, batch: dict[str, list]) -> list[bool]:
        rows = rows_of(batch)
        failures = _RowFailures(f"filter({describe(self.filter)})", self.on_error, None)
        kept = _apply(
            rows,
            None,
            lambda i: self.filter(decode(rows[i], self.stage)),
            lambda i, verdict: _as_bool(verdict),
            failures,
        )
        failures.log()
        mask = [False] * len(rows)
        for i, verdict in kept:
            mask[i] = verdict
        return mask


def _as_bool(verdict: Any) -> bool:
    if not isinstance(verdict, bool | np.bool_):
        raise TypeError(f"a filter must return True or False, got {verdict!r}")
    return bool(verdict)


class EncodeRows:
    """Encode a batch: stored Trajectory rows -> stored InputFeature rows.

    A row the template deletes (``truncation_strategy='delete'`` returns None) is left out
    and logged whatever ``on_error`` says: deleting it is what the template was asked to do.
    """

    def __init__(
        self, template: Any, batched: bool, add_generation_prompt: bool, on_error: str
    ) -> None:
        self.template = template
        self.code = code_fingerprint(template)
        self.storage_format = STORAGE_FORMAT
        self.batched = batched
        self.add_generation_prompt = add_generation_prompt
        self.on_error = on_error

    def __call__(self, batch: dict[str, list]) -> dict[str, list]:
        rows = rows_of(batch)
        failures = _RowFailures(
            f"encode({type(self.template).__name__})", self.on_error, "messages"
        )
        trajectories = [row_to_trajectory(row) for row in rows]
        kept = _apply(
            rows,
            self._batch_call(trajectories) if self.batched else None,
            lambda i: self.template.encode(
                trajectories[i], add_generation_prompt=self.add_generation_prompt
            ),
            lambda i, feature: self._check(feature, trajectories[i], rows[i]),
            failures,
        )
        failures.log()
        deleted = [rows[i] for i, stored in kept if stored is None]
        if deleted:
            logger.warning(
                "encode deleted %d row(s) longer than max_length=%s "
                "(truncation_strategy='delete'), e.g. dataset %r row %d",
                len(deleted),
                self.template.max_length,
                deleted[0][SOURCE],
                deleted[0][ROW],
            )
        out = [
            {**stored, SOURCE: rows[i][SOURCE], ROW: rows[i][ROW]} for i, stored in kept if stored
        ]
        return columns_of(out, list(ENCODED_FEATURES))

    def _batch_call(self, trajectories: list[Trajectory]) -> Callable[[], Sequence[Any]]:
        return lambda: self.template.batch_encode(
            trajectories, add_generation_prompt=self.add_generation_prompt
        )

    @staticmethod
    def _check(
        feature: Any, trajectory: Trajectory, source_row: dict[str, Any]
    ) -> dict[str, Any] | None:
        if feature is None:
            return None
        if not isinstance(feature, InputFeature):
            raise TypeError(f"a template must return InputFeatures, got {type(feature).__name__}")
        return feature_to_row(feature, trajectory, source_row)
