"""IterablePackingDataset: packing on the fly for a streamed dataset."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from twinkle.dataset.dataset import check_stage
from twinkle.dataset.iterable import IterableDataset
from twinkle.dataset.meta import DatasetMeta
from twinkle.dataset.packed_rows import pack_table
from twinkle.dataset.packing import pack_lengths
from twinkle.dataset.packing_dataset import resolve_max_length
from twinkle.dataset.rows import ENCODED, PACKED
from twinkle.dataset.transforms import decode, rows_of
from twinkle.infra import remote_class, remote_function


@remote_class(execute="first")
class IterablePackingDataset(IterableDataset):
    """An :class:`IterableDataset` that, once ``pack_dataset()`` is called (at once when
    built over an encoded stream with ``dataset=``), yields packed rows like
    :class:`PackingDataset` does.

    It reads ``buffer_size`` encoded rows, packs them best-fit decreasing, and yields the
    packed rows in an order shuffled by ``seed``; the rows of the emptiest packed row are
    carried into the next buffer rather than yielded half full, until the stream ends.
    So every row is yielded exactly once, and each pass over the stream yields the same
    packed rows in the same order.
    """

    def __init__(
        self,
        dataset_meta: DatasetMeta | None = None,
        *,
        dataset: IterableDataset | None = None,
        max_length: int | None = None,
        buffer_size: int = 1000,
        seed: int = 42,
    ) -> None:
        if (dataset_meta is None) == (dataset is None):
            raise TypeError(
                "IterablePackingDataset takes either a DatasetMeta or dataset=<an "
                "IterableDataset>, not both and not neither"
            )
        if isinstance(buffer_size, bool) or not isinstance(buffer_size, int) or buffer_size < 1:
            raise ValueError(f"buffer_size must be a positive int, got {buffer_size!r}")
        if dataset is None:
            super().__init__(dataset_meta)
        elif type(dataset) is not IterableDataset:
            raise TypeError(
                "IterablePackingDataset(dataset=...) wraps an IterableDataset, got "
                f"{type(dataset).__name__} (pack a Dataset with PackingDataset instead)"
            )
        else:
            self._adopt(dataset._rows, dataset.name, dataset.stage, dataset.template)
        self.max_length = max_length
        self.buffer_size = buffer_size
        self.seed = seed
        if self.stage == ENCODED and dataset is not None:
            self.pack_dataset()

    @remote_function(dispatch="all", execute="first", collect="first")
    def pack_dataset(self) -> None:
        """Yield packed rows from now on (a packed dataset stays as it is)."""
        if self.stage == PACKED:
            return
        check_stage(self, "pack", (ENCODED,))
        self.max_length = resolve_max_length(self.max_length, self.template, self.name)
        self.stage = PACKED

    def __iter__(self) -> Iterator[Any]:
        if self.stage != PACKED:
            yield from super().__iter__()
            return
        rng = np.random.default_rng(self.seed)
        buffer: list[dict[str, Any]] = []
        for batch in self._rows.iter(batch_size=self.buffer_size):
            buffer.extend(rows_of(batch))
            if len(buffer) >= self.buffer_size:
                packed, buffer = self._pack(buffer, rng, final=False)
                yield from packed
        if buffer:
            packed, _ = self._pack(buffer, rng, final=True)
            yield from packed

    def _pack(
        self, buffer: list[dict[str, Any]], rng: np.random.Generator, final: bool
    ) -> tuple[list[Any], list[dict[str, Any]]]:
        """The packed rows of ``buffer`` in a seeded order, and the rows carried over."""
        if any(row["labels"] is None for row in buffer):
            raise ValueError(
                f"dataset {self.name!r} was encoded without labels (add_generation_prompt="
                "True): packing is for training rows; encode with add_generation_prompt=False"
            )
        lengths = np.fromiter((row["length"] for row in buffer), dtype=np.int64)
        bins = pack_lengths(lengths, self.max_length, seed=None)
        carried: list[dict[str, Any]] = []
        if not final and len(bins) > 1:
            emptiest = int(np.argmin([lengths[members].sum() for members in bins]))
            carried = [buffer[i] for i in bins.pop(emptiest)]
        bins = [bins[i] for i in rng.permutation(len(bins)).tolist()]
        table = pa.Table.from_pylist(
            [{name: row[name] for name in ("input_ids", "labels", "length")} for row in buffer]
        )
        packed = pack_table(table, bins).to_pylist()
        return [decode(row, PACKED) for row in packed], carried
