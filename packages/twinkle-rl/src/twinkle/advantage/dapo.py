"""DAPO's rollout-side pieces as plain functions: the soft overlong penalty, overlong
filtering and dynamic sampling. Its loss-side pieces are GRPOLoss's (token-level
normalisation, ``epsilon_high`` for the asymmetric clip)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from twinkle.advantage.groups import rewards_P_G


def soft_overlong_penalty(
    lengths: Sequence[int], max_length: int, cache_length: int
) -> torch.Tensor:
    """DAPO's length-aware penalty, one per completion, to add to its reward: 0 up to
    ``max_length - cache_length`` tokens, then falling linearly to -1 at ``max_length``,
    and -1 beyond."""
    if not 0 < cache_length <= max_length:
        raise ValueError(
            f"cache_length must lie in (0, max_length={max_length}], got {cache_length}"
        )
    n = torch.as_tensor(lengths, dtype=torch.float32)
    if n.ndim != 1 or bool((n < 0).any()):
        raise ValueError("lengths must be one non-negative token count per completion")
    start = max_length - cache_length
    penalty = (start - n) / cache_length
    return torch.where(n <= start, 0.0, torch.where(n <= max_length, penalty, -1.0))


def overlong_filter(stop_reasons: Sequence[str]) -> torch.Tensor:
    """Overlong filtering: True for each completion that ended by itself, False for those
    cut at ``max_tokens`` (``stop_reason == 'length'``), whose reward says nothing about
    the answer. Drop the False rows from the batch (or multiply their advantages by the
    mask) so a truncation is not learnt as a failure."""
    known = {"stop", "length", "abort"}
    unknown = sorted(set(stop_reasons) - known)
    if unknown:
        raise ValueError(f"stop_reasons must be among {sorted(known)}, got {unknown}")
    return torch.tensor([reason != "length" for reason in stop_reasons], dtype=torch.bool)


def dynamic_sampling(
    rewards: Sequence[float] | torch.Tensor, num_generations: int, tolerance: float = 0.0
) -> torch.Tensor:
    """Dynamic sampling: True for every completion of a group whose rewards differ (by more
    than ``tolerance``), False for groups that all succeeded or all failed, which have zero
    group-relative advantage and only dilute the batch. Keep sampling prompts until enough
    groups pass, then train on those."""
    if not tolerance >= 0:
        raise ValueError(f"tolerance must be >= 0, got {tolerance}")
    rewards_PG = rewards_P_G(rewards, num_generations)
    spread = rewards_PG.max(dim=1).values - rewards_PG.min(dim=1).values
    return (spread > tolerance).repeat_interleave(num_generations)
