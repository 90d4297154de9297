"""Cumulative sequence lengths (``cu_seqlens``): how varlen kernels see a packed row.

A packed row holds several sequences back to back; ``cu_seqlens`` (int, shape ``[N + 1]``)
gives their boundaries, from 0 to the row's length, as flash-attention and
flash-linear-attention take them. Without ``cu_seqlens`` every batch row is one sequence.
"""

from __future__ import annotations

import torch


def check_cu_seqlens(cu_seqlens: torch.Tensor, total: int) -> torch.Tensor:
    """``cu_seqlens`` as int64 on its device, after checking it describes ``total`` tokens."""
    if not torch.is_tensor(cu_seqlens) or cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
        raise ValueError(
            "cu_seqlens must be a 1-D tensor of cumulative sequence lengths [0, ..., total] "
            f"with at least two entries, got {cu_seqlens!r}"
        )
    if cu_seqlens.dtype.is_floating_point or cu_seqlens.dtype == torch.bool:
        raise ValueError(f"cu_seqlens must hold integers, got dtype {cu_seqlens.dtype}")
    bounds = cu_seqlens.long()
    first, last = int(bounds[0]), int(bounds[-1])
    if first != 0 or last != total or bool((bounds[1:] <= bounds[:-1]).any()):
        raise ValueError(
            f"cu_seqlens must rise strictly from 0 to the packed length {total}, got "
            f"{bounds.tolist()}; every sequence needs at least one token"
        )
    return bounds


def cu_seqlens_from_position_ids(position_ids: torch.Tensor) -> torch.Tensor:
    """Boundaries of the sequences of a packed row whose positions restart at 0 at each one.

    ``position_ids`` is ``[T]`` or ``[1, T]``; the result is int32, as transformers'
    ``cu_seq_lens_q`` is.
    """
    positions = position_ids.reshape(-1) if position_ids.dim() == 1 else position_ids
    if positions.dim() != 1:
        if positions.shape[0] != 1:
            raise ValueError(
                f"a packed batch is one row; position_ids of shape {tuple(position_ids.shape)} "
                "hold several rows"
            )
        positions = positions[0]
    starts = (positions == 0).nonzero().flatten()
    if starts.numel() == 0 or int(starts[0]) != 0:
        raise ValueError("position_ids of a packed row must start at 0")
    end = torch.tensor([positions.numel()], device=positions.device)
    return torch.cat([starts, end]).to(torch.int32)


def is_packed(position_ids: torch.Tensor | None) -> bool:
    """Whether some row of ``position_ids`` restarts at 0 after its first token."""
    if position_ids is None or position_ids.dim() == 0 or position_ids.shape[-1] < 2:
        return False
    return bool((position_ids[..., 1:] == 0).any())


def token_offsets(bounds: torch.Tensor, total: int) -> torch.Tensor:
    """For each of ``total`` tokens, its position inside its own sequence (0 at each start)."""
    lengths = bounds.diff()
    starts = torch.repeat_interleave(bounds[:-1], lengths, output_size=total)
    return torch.arange(total, device=bounds.device) - starts
