"""The load-balanced (zigzag) split of a sequence over context-parallel ranks.

A sequence of length T is cut into 2 × cp equal chunks and rank r holds chunks r and
2 × cp - 1 - r (Megatron's ``get_batch_on_this_cp_rank``): under a causal mask an early
chunk attends to few keys and a late one to many, so pairing them gives every rank the same
work. MegatronModel's context parallel and TransformersModel's ring attention both split
this way.
"""

from __future__ import annotations

import torch


def sequence_chunks(length: int, size: int, rank: int, device=None) -> torch.Tensor:
    """The sequence positions cp rank ``rank`` of ``size`` holds, in its local order."""
    if length % (2 * size):
        raise ValueError(
            f"context parallel over {size} ranks cuts the sequence into {2 * size} equal "
            f"chunks; length {length} is not a multiple of {2 * size}"
        )
    chunk = length // (2 * size)
    firsts = (rank, 2 * size - 1 - rank)
    return torch.cat([torch.arange(c * chunk, (c + 1) * chunk, device=device) for c in firsts])


def rank_order(length: int, size: int, device=None) -> torch.Tensor:
    """The positions of every rank's chunks concatenated in rank order: what an all-gather of
    per-rank pieces along the sequence holds at each index."""
    return torch.cat([sequence_chunks(length, size, r, device) for r in range(size)])


def sequence_order(length: int, size: int, device=None) -> torch.Tensor:
    """The index into an all-gather of per-rank pieces (``rank_order``) that puts them back
    in sequence order: ``gathered.index_select(1, sequence_order(...))``."""
    return torch.argsort(rank_order(length, size, device))
