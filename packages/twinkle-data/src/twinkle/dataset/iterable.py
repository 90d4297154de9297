"""IterableDataset: the Dataset pipeline in ``datasets`` streaming mode, for data too big
to preprocess ahead: rows are read, preprocessed and encoded as iteration reaches them."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import datasets

from twinkle.dataset.auto_map import SAMPLE_ROWS, announce_auto_preprocessing
from twinkle.dataset.dataset import BATCH_SIZE, check_stage
from twinkle.dataset.errors import StageError, check_on_error
from twinkle.dataset.loading import load
from twinkle.dataset.meta import DatasetMeta
from twinkle.dataset.rows import (
    ENCODED,
    ENCODED_FEATURES,
    RAW,
    TRAJECTORY,
    TRAJECTORY_FEATURES,
    public,
)
from twinkle.dataset.transforms import EncodeRows, FilterRows, MapRows, decode
from twinkle.infra import remote_class, remote_function
from twinkle.preprocessor import (
    AutoPreprocessor,
    Filter,
    Preprocessor,
    build_filter,
    build_preprocessor,
)


@remote_class(execute="first")
class IterableDataset:
    """A streamed dataset: ``map``, ``filter``, ``set_template`` and ``encode`` as on
    :class:`~twinkle.dataset.Dataset`, applied lazily while iterating.

    In: a :class:`DatasetMeta` (local files and folders are read with ``datasets``
    streaming; in-memory rows are streamed too). Out: ``for row in dataset`` gives rows as
    :class:`~twinkle.dataset.Dataset` does (dicts, Trajectories, InputFeatures); each
    ``for`` starts from the beginning. There is no ``len`` and no indexing, no cache and
    no ``num_proc``. ``data_slice`` must be a forward range or slice with step 1.

    Bad rows raise a DataRowError naming the dataset, row and field, or with
    ``on_error='drop'`` are dropped and logged per batch (a stream has no total to count).
    """

    def __init__(self, dataset_meta: DatasetMeta) -> None:
        if not isinstance(dataset_meta, DatasetMeta):
            raise TypeError(
                f"IterableDataset takes a DatasetMeta, got {type(dataset_meta).__name__}"
            )
        self._adopt(load(dataset_meta, streaming=True), dataset_meta.name, RAW, None)

    def _adopt(self, rows: datasets.IterableDataset, name: str, stage: str, template: Any) -> None:
        self._rows = rows
        self.name = name
        self.stage = stage
        self.template = template

    @remote_function(dispatch="all", execute="first", collect="first")
    def map(
        self,
        preprocessor: str | type[Preprocessor] | Preprocessor | Callable[..., Any],
        init_args: Mapping[str, Any] | None = None,
        batched: bool = True,
        on_error: str = "raise",
    ) -> None:
        """As :meth:`Dataset.map`, applied while iterating."""
        check_stage(self, "map", (RAW, TRAJECTORY))
        check_on_error(on_error)
        built = build_preprocessor(preprocessor, init_args)
        self._run(MapRows(built, self.stage, batched, on_error), TRAJECTORY_FEATURES)
        self.stage = TRAJECTORY

    @remote_function(dispatch="all", execute="first", collect="first")
    def filter(
        self,
        filter: str | type[Filter] | Filter | Callable[[Any], bool],
        init_args: Mapping[str, Any] | None = None,
        on_error: str = "raise",
    ) -> None:
        """As :meth:`Dataset.filter`, applied while iterating."""
        check_stage(self, "filter", (RAW, TRAJECTORY, ENCODED))
        check_on_error(on_error)
        built = build_filter(filter, init_args)
        self._rows = self._rows.filter(
            FilterRows(built, self.stage, on_error), batched=True, batch_size=BATCH_SIZE
        )

    @remote_function(dispatch="all", execute="first", collect="first")
    def set_template(self, template: Any, **kwargs: Any) -> None:
        """As :meth:`Dataset.set_template`."""
        from twinkle.template import build_template

        self.template = build_template(template, **kwargs)

    @remote_function(dispatch="all", execute="first", collect="first")
    def encode(
        self, batched: bool = True, add_generation_prompt: bool = False, on_error: str = "raise"
    ) -> None:
        """As :meth:`Dataset.encode` (raw rows go through ``AutoPreprocessor`` first),
        applied while iterating."""
        check_stage(self, "encode", (RAW, TRAJECTORY))
        check_on_error(on_error)
        if self.template is None:
            raise StageError(
                f"dataset {self.name!r} has no template: call set_template(...) before encode()"
            )
        if self.stage == RAW:
            sample = [public(row) for row in self._rows.take(SAMPLE_ROWS)]
            announce_auto_preprocessing(self.name, sample)
            self.map(AutoPreprocessor(), batched=batched, on_error=on_error)
        encode = EncodeRows(self.template, batched, add_generation_prompt, on_error)
        self._run(encode, ENCODED_FEATURES)
        self.stage = ENCODED

    def _run(self, function: MapRows | EncodeRows, features: datasets.Features) -> None:
        columns = self._rows.column_names or list(next(iter(self._rows), {}))
        self._rows = self._rows.map(
            function,
            batched=True,
            batch_size=BATCH_SIZE,
            remove_columns=columns,
            features=features,
        )

    def __iter__(self) -> Iterator[Any]:
        for row in self._rows:
            yield decode(row, self.stage)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, streaming, {self.stage})"
