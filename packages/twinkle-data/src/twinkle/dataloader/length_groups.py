"""Length-grouped batches: sequences of similar length in one batch, so a padded batch holds
little padding, while which sequences meet and the order of the batches stay random.

An epoch's order (a permutation, or ``range(N)`` without shuffling) is cut into windows of
``GROUP_BATCHES`` batches; each window is sorted by length and cut into batches, and the
batches of a window are put in a random order. The final partial batch of an epoch stays
last (EpochPlan keeps or drops it). The result is a pure function of the order, the lengths
and the generator, so the order of any epoch is rebuilt exactly on resume.
"""

from __future__ import annotations

from typing import Any

import numpy as np

GROUP_BATCHES = 64
"""Batches per window: larger windows group lengths more tightly, smaller ones mix more."""


def group_by_length(
    order: np.ndarray,
    lengths: np.ndarray,
    batch_size: int,
    rng: np.random.Generator | None,
    group_batches: int = GROUP_BATCHES,
) -> np.ndarray:
    """``order`` rearranged so that each run of ``batch_size`` holds similar lengths.

    ``rng`` shuffles the batches of each window (None: longest batch first, as sorted).
    """
    full = len(order) // batch_size * batch_size
    window = batch_size * group_batches
    pieces = []
    for start in range(0, full, window):
        members = order[start : min(start + window, full)]
        # Longest first; the stable sort keeps the shuffled order among equal lengths.
        ordered = members[np.argsort(-lengths[members], kind="stable")]
        batches = ordered.reshape(-1, batch_size)
        if rng is not None:
            batches = batches[rng.permutation(len(batches))]
        pieces.append(batches.reshape(-1))
    pieces.append(order[full:])
    return np.concatenate(pieces) if pieces else order


def sample_lengths(dataset: Any) -> np.ndarray:
    """Each sample's token count: an encoded Dataset's ``length`` column when it has one
    (read at once, without decoding rows), else ``len(row['input_ids'])`` row by row."""
    rows = getattr(dataset, "_rows", None)
    if rows is not None and "length" in getattr(rows, "column_names", ()):
        return np.asarray(rows.with_format("numpy")["length"], dtype=np.int64)
    lengths = np.empty(len(dataset), dtype=np.int64)
    for index in range(len(dataset)):
        lengths[index] = _length_of(index, dataset[index])
    return lengths


def _length_of(index: int, row: Any) -> int:
    ids = row.get("input_ids") if hasattr(row, "get") else getattr(row, "input_ids", None)
    if ids is None:
        raise ValueError(
            f"group_by_length=True needs each sample's length, and sample {index} has no "
            f"input_ids ({type(row).__name__}); encode the dataset first (dataset.encode()), "
            "or use group_by_length=False"
        )
    return len(ids)
