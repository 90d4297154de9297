"""Load what a DatasetMeta names into a Hugging Face ``datasets`` object: local files and
folders, hub ids (through ``twinkle.hub``), or in-memory rows; then select the slice and
stamp every row with its origin (see ``rows.py``)."""

from __future__ import annotations

from pathlib import Path

import datasets
import numpy as np
import pyarrow as pa

from twinkle.dataset.meta import DatasetMeta
from twinkle.dataset.rows import ROW, SOURCE
from twinkle.hub import resolve_dataset
from twinkle.utils import get_logger

logger = get_logger("twinkle.dataset")

BUILDERS = {
    ".json": "json",
    ".jsonl": "json",
    ".csv": "csv",
    ".parquet": "parquet",
    ".txt": "text",
    ".arrow": "arrow",
}
"""The ``datasets`` builder for each file suffix a single-file dataset may have."""


def load(meta: DatasetMeta, streaming: bool = False) -> datasets.Dataset | datasets.IterableDataset:
    """The rows ``meta`` names, sliced, with the hidden origin columns added."""
    if meta.data is not None:
        loaded = _from_rows(meta)
        if streaming:
            loaded = loaded.to_iterable_dataset()
    else:
        path = Path(resolve_dataset(meta.dataset_id))
        try:
            loaded = _load_path(path, meta, streaming)
        except ValueError as err:
            raise ValueError(f"dataset {meta.name!r} ({path}): {err}") from err
    if streaming:
        return _stamp_stream(loaded, meta)
    # Stamp the origin before slicing, so the hidden index is the row's index in the source.
    return _slice(_stamp(loaded, meta), meta)


def _load_path(
    path: Path, meta: DatasetMeta, streaming: bool
) -> datasets.Dataset | datasets.IterableDataset:
    if path.is_file():
        builder = BUILDERS.get(path.suffix.lower())
        if builder is None:
            raise ValueError(
                f"cannot tell the format of {path.name}: use one of {', '.join(BUILDERS)}"
            )
        files = {meta.split: str(path)}
        return datasets.load_dataset(
            builder, data_files=files, split=meta.split, streaming=streaming
        )
    subset_dir = path / meta.subset_name if meta.subset_name else None
    if subset_dir is not None and subset_dir.is_dir():
        # A snapshot laid out as <subset>/<split>-*.parquet without a dataset card naming it.
        return datasets.load_dataset(
            str(path), data_dir=meta.subset_name, split=meta.split, streaming=streaming
        )
    return datasets.load_dataset(
        str(path), name=meta.subset_name, split=meta.split, streaming=streaming
    )


def _from_rows(meta: DatasetMeta) -> datasets.Dataset:
    """An in-memory dataset; columns are the union of the rows' keys (missing ones None)."""
    names: dict[str, None] = {}
    for row in meta.data:
        names.update(dict.fromkeys(row))
    columns = {name: [row.get(name) for row in meta.data] for name in names}
    try:
        return datasets.Dataset.from_dict(columns)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as err:
        raise ValueError(
            f"dataset {meta.name!r}: the in-memory rows do not share one type per column "
            f"({err}); make each column hold one kind of value"
        ) from err


def _stamp(dataset: datasets.Dataset, meta: DatasetMeta) -> datasets.Dataset:
    fingerprint = dataset._fingerprint
    dataset = dataset.add_column(
        SOURCE, [meta.name] * len(dataset), new_fingerprint=f"{fingerprint}-{SOURCE}"
    )
    return dataset.add_column(
        ROW, np.arange(len(dataset), dtype=np.int64), new_fingerprint=f"{fingerprint}-{ROW}"
    )


def _stamp_stream(dataset: datasets.IterableDataset, meta: DatasetMeta) -> datasets.IterableDataset:
    def stamp(batch: dict, indices: list[int]) -> dict:
        return {SOURCE: [meta.name] * len(indices), ROW: indices}

    stamped = dataset.map(stamp, with_indices=True, batched=True)
    if meta.data_slice is None:
        return stamped
    start, stop = _stream_bounds(meta.data_slice)
    stamped = stamped.skip(start)
    return stamped if stop is None else stamped.take(stop - start)


def _stream_bounds(data_slice: range | slice) -> tuple[int, int | None]:
    start, stop, step = data_slice.start, data_slice.stop, data_slice.step
    start = 0 if start is None else start
    if step not in (None, 1) or start < 0 or (stop is not None and stop < start):
        raise ValueError(
            f"a streaming dataset reads rows in order, so data_slice must be a forward "
            f"range or slice with step 1 and non-negative bounds, got {data_slice!r}"
        )
    return start, stop


def _slice(dataset: datasets.Dataset, meta: DatasetMeta) -> datasets.Dataset:
    data_slice = meta.data_slice
    if data_slice is None:
        return dataset
    total = len(dataset)
    if isinstance(data_slice, range):
        if data_slice.start < 0 or data_slice.stop < 0 or data_slice.step < 0:
            raise ValueError(
                f"data_slice {data_slice!r} has a negative bound or step; "
                "use a slice for counting from the end"
            )
        indices = range(total)[data_slice.start : data_slice.stop : data_slice.step]
        if len(indices) < len(data_slice):
            logger.warning(
                "dataset %r has %d rows: data_slice %r keeps the %d that exist",
                meta.name,
                total,
                data_slice,
                len(indices),
            )
    else:
        indices = range(total)[data_slice]
    return dataset.select(indices)
