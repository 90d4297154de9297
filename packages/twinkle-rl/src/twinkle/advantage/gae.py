"""Generalised advantage estimation for PPO with a critic, token by token."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from twinkle.advantage.base import Advantage
from twinkle.advantage.token_inputs import token_grid


def _unit_interval(name: str, value: float) -> float:
    if not 0 <= value <= 1:
        raise ValueError(f"GAEAdvantage: {name} must lie in [0, 1], got {value}")
    return float(value)


class GAEAdvantage(Advantage):
    """Per-token advantages and returns of a completion from token rewards and a critic's
    values (Schulman et al., 2016)::

        delta_t = r_t + gamma * V_{t+1} - V_t      (V after the last token is 0)
        A_t     = sum_l (gamma * lambda) ** l * delta_{t+l}
        R_t     = A_t + V_t                        (the value model's targets)

    ``rewards`` and ``values`` are (B, T) with a ``masks`` of the completion's tokens (the
    label tokens; positions off the mask are skipped, so "t + 1" is the next masked
    position), or one list per completion. ``normalize`` (default on) whitens the
    advantages over the masked tokens of the batch (mean 0, population std 1); the returns
    are never whitened. Returns ``(advantages, returns)``, both (B, T) float32 with 0 off
    the mask: pass them as ``advantages=`` of PPOLoss and ``returns=`` of PPOValueLoss.
    """

    def __init__(self, gamma: float = 1.0, gae_lambda: float = 0.95, normalize: bool = True):
        self.gamma = _unit_interval("gamma", gamma)
        self.gae_lambda = _unit_interval("gae_lambda", gae_lambda)
        self.normalize = normalize

    @staticmethod
    def build_token_rewards(
        rewards: Sequence[float] | torch.Tensor,
        lengths: Sequence[int],
        *,
        old_logps: Sequence[Sequence[float]] | None = None,
        ref_logps: Sequence[Sequence[float]] | None = None,
        kl_coef: float = 0.0,
    ) -> list[list[float]]:
        """Per-token rewards of completions of ``lengths`` tokens: each sequence's reward on
        its last token, and with ``kl_coef`` > 0 the per-token KL penalty
        ``-kl_coef * (old_logp - ref_logp)`` on every token (InstructGPT's shaped reward)."""
        totals = torch.as_tensor(rewards, dtype=torch.float64).flatten().tolist()
        if len(totals) != len(lengths):
            raise ValueError(f"{len(totals)} rewards but {len(lengths)} completion lengths")
        if (old_logps is None) != (ref_logps is None) or (kl_coef and old_logps is None):
            raise ValueError(
                "the KL penalty needs old_logps and ref_logps together (and kl_coef > 0)"
            )
        out = []
        for i, (reward, length) in enumerate(zip(totals, lengths, strict=True)):
            if length < 1:
                raise ValueError(f"completion {i} has {length} tokens; each needs at least one")
            row = [0.0] * length
            if old_logps is not None:
                if len(old_logps[i]) != length or len(ref_logps[i]) != length:
                    raise ValueError(f"completion {i}: old_logps/ref_logps need {length} values")
                row = [-kl_coef * (o - r) for o, r in zip(old_logps[i], ref_logps[i], strict=True)]
            row[-1] += reward
            out.append(row)
        return out

    def __call__(
        self,
        rewards: Any,
        values: Any,
        *,
        masks: Any = None,
        normalize: bool | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        grids, mask = token_grid({"rewards": rewards, "values": values}, masks)
        rewards_BT = torch.where(mask, grids["rewards"], 0)
        values_BT = torch.where(mask, grids["values"], 0)
        advantages = torch.zeros_like(rewards_BT)
        carried = rewards_BT.new_zeros(rewards_BT.shape[0])  # A at the next masked position
        next_value = rewards_BT.new_zeros(rewards_BT.shape[0])
        decay = self.gamma * self.gae_lambda
        for t in range(rewards_BT.shape[1] - 1, -1, -1):
            live = mask[:, t]
            delta = rewards_BT[:, t] + self.gamma * next_value - values_BT[:, t]
            here = delta + decay * carried
            advantages[:, t] = torch.where(live, here, 0)
            carried = torch.where(live, here, carried)
            next_value = torch.where(live, values_BT[:, t], next_value)
        returns = torch.where(mask, advantages + values_BT, 0)
        if self.normalize if normalize is None else normalize:
            picked = advantages[mask]
            if picked.numel() > 1:
                whitened = (advantages - picked.mean()) / (picked.std(unbiased=False) + 1e-8)
                advantages = torch.where(mask, whitened, 0)
        return advantages.float(), returns.float()
