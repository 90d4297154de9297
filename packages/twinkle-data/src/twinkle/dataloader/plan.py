"""EpochPlan: which dataset indices make up each global batch, by arithmetic alone.

A map-style dataset of ``N`` samples is cut, every epoch, into batches of
``batch_size`` consecutive entries of the epoch's order (``range(N)``, or a
permutation drawn from ``(seed, epoch)``). The final partial batch is kept
when it holds at least ``min_batch_size`` samples and dropped otherwise, so
an epoch consumes ``samples_per_epoch`` samples: ``N``, or ``N`` rounded
down to a multiple of ``batch_size``.

A consumed-sample count ``c`` therefore names a position directly:
``epoch = c // samples_per_epoch`` and ``offset = c % samples_per_epoch``.
Counts run across epochs. Resuming costs one permutation, never a replay.

With ``lengths`` (``group_by_length``), the epoch's order is then rearranged so that each
batch holds similar lengths (``length_groups.group_by_length``), from a generator of
``(seed, epoch)`` as well: still a pure function of the epoch.
"""

from __future__ import annotations

import numpy as np

from twinkle.dataloader.length_groups import group_by_length


class EpochPlan:
    """The batch layout of a map-style dataset, epoch by epoch.

    ``locate(consumed)`` turns a consumed-sample count into ``(epoch, offset)``
    and rejects counts that do not fall on a batch boundary;
    ``batch_indices(epoch, offset)`` returns the dataset indices of the global
    batch that starts there.
    """

    def __init__(
        self,
        num_samples: int,
        batch_size: int,
        min_batch_size: int,
        shuffle: bool,
        seed: int,
        lengths: np.ndarray | None = None,
    ) -> None:
        self.num_samples = num_samples
        self.lengths = lengths
        self.batch_size = batch_size
        self.min_batch_size = min_batch_size
        self.shuffle = shuffle
        self.seed = seed
        full, rest = divmod(num_samples, batch_size)
        self.keeps_partial = rest > 0 and rest >= min_batch_size
        self.batches_per_epoch = full + int(self.keeps_partial)
        self.samples_per_epoch = num_samples if self.keeps_partial else full * batch_size
        if self.batches_per_epoch == 0:
            raise ValueError(
                f"the dataset has {num_samples} samples, fewer than min_batch_size="
                f"{min_batch_size}: every batch would be dropped; use a larger dataset or a "
                "smaller min_batch_size"
            )
        self._order_epoch: int | None = None
        self._order: np.ndarray | None = None

    def order(self, epoch: int) -> np.ndarray:
        """The sample order of ``epoch``: ``range(N)``, or a permutation seeded by (seed, epoch).

        Seeding numpy with the pair rather than ``seed + epoch`` keeps (42, 1) and
        (43, 0) apart. The last order is cached: every batch of an epoch reads it.
        """
        if self._order_epoch != epoch:
            rng = np.random.default_rng([self.seed, epoch]) if self.shuffle else None
            order = (
                np.arange(self.num_samples) if rng is None else rng.permutation(self.num_samples)
            )
            if self.lengths is not None:
                order = group_by_length(order, self.lengths, self.batch_size, rng)
            self._order = order
            self._order_epoch = epoch
        return self._order

    def locate(self, consumed: int) -> tuple[int, int]:
        """``(epoch, offset)`` of the batch that follows ``consumed`` samples."""
        epoch, offset = divmod(consumed, self.samples_per_epoch)
        if offset % self.batch_size:
            ending = (
                f"keeping a final partial batch of {self.num_samples % self.batch_size}"
                if self.keeps_partial
                else f"dropping the final partial batch (min_batch_size={self.min_batch_size})"
            )
            raise ValueError(
                f"consumed_train_samples={consumed} does not fall on a batch boundary: with "
                f"{self.num_samples} samples, batch_size={self.batch_size} and {ending}, an "
                f"epoch consumes {self.samples_per_epoch} samples in batches starting at "
                f"multiples of {self.batch_size}, and {consumed} is sample {offset} of epoch "
                f"{epoch}. The count comes from a run with another batch_size, min_batch_size "
                "or dataset: resume with the settings that produced it"
            )
        return epoch, offset

    def batch_indices(self, epoch: int, offset: int) -> np.ndarray:
        """Dataset indices of the global batch starting ``offset`` samples into ``epoch``."""
        stop = min(offset + self.batch_size, self.samples_per_epoch)
        return self.order(epoch)[offset:stop]
