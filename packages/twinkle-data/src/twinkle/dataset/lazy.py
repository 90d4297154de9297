"""LazyDataset: preprocess and encode a row when it is read, for datasets too big to
process ahead of training."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from numbers import Integral
from typing import Any

from twinkle.dataset.auto_map import SAMPLE_ROWS, announce_auto_preprocessing
from twinkle.dataset.dataset import check_stage
from twinkle.dataset.errors import DataRowError, StageError, field_of, reason_of
from twinkle.dataset.loading import load
from twinkle.dataset.meta import DatasetMeta
from twinkle.dataset.rows import (
    ENCODED,
    RAW,
    ROW,
    SOURCE,
    TRAJECTORY,
    as_trajectory,
    public,
    trajectory_dict,
)
from twinkle.infra import remote_class, remote_function
from twinkle.preprocessor import AutoPreprocessor, Preprocessor, build_preprocessor


@remote_class(execute="first")
class LazyDataset:
    """Random access without a preprocessing pass: ``map``, ``set_template`` and
    ``encode`` are recorded, and ``dataset[i]`` runs them on row ``i`` alone.

    In: a :class:`DatasetMeta`. Out: ``dataset[i]``, a dict, Trajectory or InputFeature
    depending on the steps recorded, as from :class:`~twinkle.dataset.Dataset`;
    ``len(dataset)`` is the number of source rows. The source rows are loaded (memory-mapped
    Arrow) as usual; only the work on them is deferred, and redone on every read.

    Not supported, because each needs a pass over every row: ``filter`` and dropping rows
    (a row that fails raises a DataRowError naming the dataset, row and field; a row the
    template deletes with ``truncation_strategy='delete'`` raises too; use ``'left'`` or
    ``'right'``), mixing and packing. Use :class:`~twinkle.dataset.Dataset` for those.
    """

    def __init__(self, dataset_meta: DatasetMeta) -> None:
        if not isinstance(dataset_meta, DatasetMeta):
            raise TypeError(f"LazyDataset takes a DatasetMeta, got {type(dataset_meta).__name__}")
        self._rows = load(dataset_meta)
        self.name = dataset_meta.name
        self.stage = RAW
        self.template: Any = None
        self._preprocessors: list[Preprocessor] = []
        self._add_generation_prompt = False

    @remote_function(dispatch="all", execute="first", collect="first")
    def map(
        self,
        preprocessor: str | type[Preprocessor] | Preprocessor | Callable[..., Any],
        init_args: Mapping[str, Any] | None = None,
    ) -> None:
        """Record a preprocessor (as for :meth:`Dataset.map`) to run on each row read."""
        check_stage(self, "map", (RAW, TRAJECTORY))
        self._preprocessors.append(build_preprocessor(preprocessor, init_args))
        self.stage = TRAJECTORY

    @remote_function(dispatch="all", execute="first", collect="first")
    def set_template(self, template: Any, **kwargs: Any) -> None:
        """As :meth:`Dataset.set_template`."""
        from twinkle.template import build_template

        self.template = build_template(template, **kwargs)

    @remote_function(dispatch="all", execute="first", collect="first")
    def encode(self, add_generation_prompt: bool = False) -> None:
        """Encode each row read with the template, after the preprocessors (with none
        recorded, after ``AutoPreprocessor``, as :meth:`Dataset.encode` does)."""
        check_stage(self, "encode", (RAW, TRAJECTORY))
        if self.template is None:
            raise StageError(
                f"dataset {self.name!r} has no template: call set_template(...) before encode()"
            )
        if self.stage == RAW:
            sample = self._rows.select(range(min(SAMPLE_ROWS, len(self._rows))))
            announce_auto_preprocessing(self.name, [public(row) for row in sample])
            self.map(AutoPreprocessor())
        self._add_generation_prompt = add_generation_prompt
        self.stage = ENCODED

    @remote_function(dispatch="all", execute="first", collect="first")
    def __len__(self) -> int:
        return len(self._rows)

    @remote_function(dispatch="all", execute="first", collect="first")
    def __getitem__(self, index: int) -> Any:
        """Row ``index`` with the recorded steps applied."""
        if not isinstance(index, Integral) or isinstance(index, bool):
            raise TypeError(f"a LazyDataset is indexed by an int, got {index!r}")
        row = self._rows[int(index)]
        value: Any = public(row)
        last = len(self._preprocessors) - 1
        for step, preprocessor in enumerate(self._preprocessors):
            try:
                value = as_trajectory(preprocessor(value))
            except Exception as error:
                raise _row_error(row, error, None) from error
            if step < last:  # by position: the same preprocessor may be mapped twice
                value = trajectory_dict(value)
        if self.stage != ENCODED:
            return value
        try:
            feature = self.template.encode(value, add_generation_prompt=self._add_generation_prompt)
        except Exception as error:
            raise _row_error(row, error, "messages") from error
        if feature is None:
            reason = (
                f"longer than max_length={self.template.max_length}, and truncation_strategy="
                "'delete' cannot drop a row of a LazyDataset; use 'left' or 'right'"
            )
            raise DataRowError(row[SOURCE], row[ROW], "messages", reason)
        return feature

    def __iter__(self) -> Iterator[Any]:
        for index in range(len(self._rows)):
            yield self[index]

    def __repr__(self) -> str:
        return f"LazyDataset({self.name!r}, {len(self._rows)} rows, {self.stage} on access)"


def _row_error(row: Mapping[str, Any], error: Exception, field: str | None) -> DataRowError:
    return DataRowError(row[SOURCE], row[ROW], field_of(error, field), reason_of(error))
