"""Per-token inputs of the token-level estimators (GAE, reverse KL): (B, T) tensors or
arrays, or one list per sequence (ragged lists are right-padded and masked)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


def _padded(values: Any, name: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``values`` as float64 (B, T), and the mask of real entries when rows were ragged."""
    if (
        isinstance(values, Sequence)
        and values
        and all(isinstance(row, Sequence | torch.Tensor) for row in values)
    ):
        rows = [torch.as_tensor(row, dtype=torch.float64).flatten() for row in values]
        width = max(row.numel() for row in rows)
        if all(row.numel() == width for row in rows):
            return torch.stack(rows), None
        out = torch.zeros(len(rows), width, dtype=torch.float64)
        mask = torch.zeros(len(rows), width, dtype=torch.bool)
        for i, row in enumerate(rows):
            out[i, : row.numel()], mask[i, : row.numel()] = row, True
        return out, mask
    try:
        tensor = torch.as_tensor(values, dtype=torch.float64).detach().cpu()
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a (B, T) tensor or one list per sequence") from None
    if tensor.ndim == 1:
        tensor = tensor[None]
    if tensor.ndim != 2:
        raise ValueError(f"{name} must be (B, T), got shape {tuple(tensor.shape)}")
    return tensor, None


def token_grid(
    named: dict[str, Any], masks: Any = None
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Every named input as float64 (B, T) of one shape, and the bool mask (given, or of the
    ragged rows' real entries, or all True); NaN or infinity where the mask reads is an
    error naming the input and the position."""
    grids, ragged = {}, None
    for name, values in named.items():
        grids[name], own_mask = _padded(values, name)
        ragged = own_mask if ragged is None else ragged
    shapes = {name: tuple(grid.shape) for name, grid in grids.items()}
    if len(set(shapes.values())) > 1:
        raise ValueError(f"the per-token inputs must have one shape; got {shapes}")
    shape = next(iter(grids.values())).shape
    if masks is None:
        mask = ragged if ragged is not None else torch.ones(shape, dtype=torch.bool)
    else:
        mask = torch.as_tensor(masks).to(torch.bool).cpu()
        if mask.ndim == 1:
            mask = mask[None]
        if tuple(mask.shape) != tuple(shape):
            raise ValueError(
                f"masks has shape {tuple(mask.shape)} but the per-token inputs {tuple(shape)}"
            )
    for name, grid in grids.items():
        bad = mask & ~torch.isfinite(grid)
        if bool(bad.any()):
            row, col = (int(i) for i in bad.nonzero()[0])
            raise ValueError(
                f"{name}[{row}][{col}] is {grid[row, col].item()}; every {name} value inside "
                "the mask must be finite"
            )
    return grids, mask
