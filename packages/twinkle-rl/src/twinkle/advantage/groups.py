"""Rewards as a (prompts, generations) tensor: the shared first step of group-relative
advantages, with the checks every estimator needs."""

from __future__ import annotations

from collections.abc import Sequence

import torch

SCALES = ("group", "batch", "none")


def rewards_P_G(rewards: Sequence[float] | torch.Tensor, num_generations: int) -> torch.Tensor:
    """``rewards`` (P * G,) laid out prompt by prompt as float32 (P, G)."""
    if isinstance(num_generations, bool) or not isinstance(num_generations, int):
        raise TypeError(f"num_generations must be an int, got {num_generations!r}")
    if num_generations < 1:
        raise ValueError(f"num_generations must be >= 1, got {num_generations}")
    flat = torch.as_tensor(rewards, dtype=torch.float32).detach().cpu()
    if flat.ndim != 1:
        raise ValueError(f"rewards must be a flat list (one per completion), got {flat.shape}")
    if flat.numel() == 0:
        raise ValueError("rewards is empty: there is nothing to compute advantages for")
    if flat.numel() % num_generations:
        raise ValueError(
            f"{flat.numel()} rewards do not split into groups of num_generations="
            f"{num_generations}; give each prompt exactly {num_generations} completions, "
            f"consecutive (sample with num_samples={num_generations})"
        )
    if not torch.isfinite(flat).all():
        bad = torch.nonzero(~torch.isfinite(flat)).flatten()[:5].tolist()
        raise ValueError(f"rewards must be finite numbers; positions {bad} are not")
    return flat.view(-1, num_generations)


def check_scale(scale: str) -> str:
    if scale not in SCALES:
        raise ValueError(f"unknown scale {scale!r}; use one of {', '.join(map(repr, SCALES))}")
    return scale
