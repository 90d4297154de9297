"""StreamReader: global batches from a streaming dataset, pass after pass.

A stream has no length and no random access, so it is read in order: each
batch is the next ``batch_size`` samples. When a pass runs out, the samples
left over form a final partial batch that is kept when it holds at least
``min_batch_size`` samples and dropped otherwise; the next read starts a new
pass (a new epoch) from a fresh ``iter(stream)``. A stream cannot seek, so
resuming replays the stream up to the consumed count: it costs as much as
reading those samples, unlike a map-style dataset.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from typing import Any


class StreamReader:
    """Reads global batches from a re-iterable ``stream`` and counts what it consumed."""

    def __init__(self, stream: Iterable[Any], batch_size: int, min_batch_size: int) -> None:
        self.stream = stream
        self.batch_size = batch_size
        self.min_batch_size = min_batch_size
        self.epoch = 0
        self.consumed = 0
        self._rows: Iterator[Any] | None = None
        self._batches_in_pass = 0

    def next_batch(self) -> tuple[list[Any], bool] | None:
        """The next global batch and whether it ends its pass.

        None when the pass ended with nothing left to yield (too few samples for
        a final partial batch); the epoch has then advanced.
        """
        if self._rows is None:
            self._rows = iter(self.stream)
            self._batches_in_pass = 0
        batch = list(itertools.islice(self._rows, self.batch_size))
        if len(batch) == self.batch_size:
            return self._count(batch), False
        self._rows = None
        self.epoch += 1
        if len(batch) >= self.min_batch_size:
            return self._count(batch), True
        if self._batches_in_pass == 0:
            raise ValueError(
                f"a full pass over the stream yielded {len(batch)} samples, fewer than "
                f"min_batch_size={self.min_batch_size}, so it has no batch to give; use a "
                "longer stream or a smaller min_batch_size"
            )
        return None

    def _count(self, batch: list[Any]) -> list[Any]:
        self.consumed += len(batch)
        self._batches_in_pass += 1
        return batch

    def resume(self, consumed: int) -> None:
        """Start over and read (discarding) batches until ``consumed`` samples are behind."""
        self.epoch, self.consumed, self._rows = 0, 0, None
        while self.consumed < consumed:
            self.next_batch()
        if self.consumed != consumed:
            raise ValueError(
                f"consumed_train_samples={consumed} does not fall on a batch boundary of this "
                f"stream: with batch_size={self.batch_size} and min_batch_size="
                f"{self.min_batch_size}, the batches around it end at {self.consumed}. The count "
                "comes from a run with another batch_size, min_batch_size or stream: resume "
                "with the settings that produced it"
            )
