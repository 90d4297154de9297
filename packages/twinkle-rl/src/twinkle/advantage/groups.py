"""Rewards as a (prompts, generations) tensor: the shared first step of group-relative
advantages, with the checks every estimator needs."""

from __future__ import annotations

from collections.abc import Sequence

import torch

SCALES = ("group", "batch", "none")


def total_rewards(
    rewards: Sequence[float] | Sequence[Sequence[float]] | torch.Tensor,
) -> torch.Tensor:
    """One float32 reward per completion: a flat list as it is, or several components per
    completion (a list per completion, or a 2-D array (completions, components)) summed."""
    try:
        values = torch.as_tensor(rewards, dtype=torch.float32).detach().cpu()
    except (ValueError, TypeError) as exc:
        raise ValueError(
            "rewards must be one number per completion, or one list of reward components per "
            f"completion, all of the same length ({exc})"
        ) from None
    if values.ndim == 2:
        if not torch.isfinite(values).all():
            row, column = (int(i) for i in torch.nonzero(~torch.isfinite(values))[0])
            raise ValueError(
                f"rewards must be finite numbers; completion {row}'s component {column} is "
                f"{values[row, column].item()}"
            )
        values = values.sum(dim=1)
    if values.ndim != 1:
        raise ValueError(
            f"rewards must be a flat list (one per completion) or a 2-D array (completions, "
            f"components), got shape {tuple(values.shape)}"
        )
    if values.numel() == 0:
        raise ValueError("rewards is empty: there is nothing to compute advantages for")
    if not torch.isfinite(values).all():
        bad = torch.nonzero(~torch.isfinite(values)).flatten()[:5].tolist()
        raise ValueError(f"rewards must be finite numbers; positions {bad} are not")
    return values


def rewards_P_G(rewards: Sequence[float] | torch.Tensor, num_generations: int) -> torch.Tensor:
    """``rewards`` (P * G,) laid out prompt by prompt as float32 (P, G); several components
    per completion are summed first (``total_rewards``)."""
    if isinstance(num_generations, bool) or not isinstance(num_generations, int):
        raise TypeError(f"num_generations must be an int, got {num_generations!r}")
    if num_generations < 1:
        raise ValueError(f"num_generations must be >= 1, got {num_generations}")
    flat = total_rewards(rewards)
    if flat.numel() % num_generations:
        raise ValueError(
            f"{flat.numel()} rewards do not split into groups of num_generations="
            f"{num_generations}; give each prompt exactly {num_generations} completions, "
            f"consecutive (sample with num_samples={num_generations})"
        )
    return flat.view(-1, num_generations)


def check_scale(scale: str) -> str:
    if scale not in SCALES:
        raise ValueError(f"unknown scale {scale!r}; use one of {', '.join(map(repr, SCALES))}")
    return scale


def batch_spread(rewards_PG: torch.Tensor) -> torch.Tensor:
    """The whole batch's standard deviation (0 for a single reward: no spread)."""
    return rewards_PG.std() if rewards_PG.numel() > 1 else rewards_PG.new_zeros(())
