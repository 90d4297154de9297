"""Concatenate encoded rows into packed rows, column by column in Arrow.

A packed row holds several sequences back to back:

- ``input_ids`` and ``labels``: the sequences' own, concatenated;
- ``position_ids``: restart at 0 at the start of every sequence, which is how varlen
  attention (and the InputProcessor) finds the boundaries;
- ``seq_lens``: the sequences' lengths, in order (their cumulative sum gives the
  ``cu_seqlens`` of varlen kernels);
- ``length``: the total.

The first label of every sequence is set to -100. Labels are not shifted (the loss
predicts ``labels[i]`` from position ``i - 1``), so without this the last token of one
sequence would be trained to predict the first token of the next, a target it cannot
see. A sequence's first token is never a target of its own either (nothing precedes it),
so nothing a sequence would learn alone is lost. ``messages``, ``tools`` and ``user_data``
are not carried over: a packed row is for supervised training.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

IGNORE_INDEX = -100
"""The label of a token outside the loss (InputFeature's convention). Defined here rather
than imported from twinkle.template, which would load transformers with the datasets."""
_MAX_OFFSET = np.iinfo(np.int32).max


def pack_table(table: pa.Table, bins: Sequence[Sequence[int]]) -> pa.Table:
    """One packed row per bin of row indices into ``table`` (which has ``input_ids``,
    ``labels`` and ``length``); see the module docstring for the columns."""
    order = np.fromiter((i for members in bins for i in members), dtype=np.int64)
    counts = np.fromiter((len(members) for members in bins), dtype=np.int64, count=len(bins))
    seq_lens = table.column("length").to_numpy()[order]
    total = int(seq_lens.sum())
    if total > _MAX_OFFSET:
        raise ValueError(
            f"packing {total} tokens at once exceeds Arrow's 32-bit list offsets; pack a "
            "smaller dataset, or stream it through IterablePackingDataset"
        )
    ends = np.cumsum(seq_lens, dtype=np.int64)
    starts = ends - seq_lens
    input_ids = _gather(table.column("input_ids"), order)
    labels = _gather(table.column("labels"), order).copy()
    labels[starts] = IGNORE_INDEX
    position_ids = np.arange(total, dtype=np.int32) - np.repeat(starts.astype(np.int32), seq_lens)
    row_offsets = np.concatenate([[0], ends[np.cumsum(counts) - 1]]).astype(np.int32)
    seq_offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    return pa.table(
        {
            "input_ids": _lists(row_offsets, input_ids),
            "labels": _lists(row_offsets, labels),
            "position_ids": _lists(row_offsets, position_ids),
            "length": pa.array(np.diff(row_offsets).astype(np.int64)),
            "seq_lens": _lists(seq_offsets, seq_lens.astype(np.int64)),
        }
    )


def _gather(column: pa.ChunkedArray, order: np.ndarray) -> np.ndarray:
    """The list values of rows ``order``, concatenated, as one flat int32 array."""
    taken = pc.take(column, pa.array(order)).combine_chunks()
    return taken.flatten().to_numpy(zero_copy_only=False).astype(np.int32, copy=False)


def _lists(offsets: np.ndarray, values: np.ndarray) -> pa.ListArray:
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(values))
