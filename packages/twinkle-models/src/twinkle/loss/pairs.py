"""The (chosen, rejected) pair layout every preference loss reads, and the statistics
DPOMetric turns into rewards, margins and accuracy.

Layout: the batch holds pairs on consecutive rows, chosen first: rows 0, 2, 4, ... are the
chosen responses and rows 1, 3, 5, ... the rejected responses to the same prompts, so B is
even. Each row must have label tokens (the response).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import torch

from twinkle.loss.fields import label_mask, outputs_device, token_labels
from twinkle.loss.logps import token_logps


class PairBatch(NamedTuple):
    labels: torch.Tensor  # (B, T)
    mask: torch.Tensor  # (B, T) bool, label tokens
    sums: torch.Tensor  # (B,) summed label-token logps, differentiable
    lengths: torch.Tensor  # (B,) label tokens per row

    @property
    def num_pairs(self) -> torch.Tensor:
        return torch.tensor(self.labels.shape[0] // 2, device=self.sums.device)

    def chosen_rejected(self, per_row: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return per_row[0::2], per_row[1::2]


def read_pairs(owner: str, inputs: Mapping[str, Any], outputs: Mapping[str, Any]) -> PairBatch:
    labels = token_labels(inputs, owner, outputs_device(outputs))
    if labels.shape[0] % 2:
        raise ValueError(
            f"{owner} takes (chosen, rejected) pairs on consecutive rows, so an even "
            f"number of rows; got {labels.shape[0]}"
        )
    mask = label_mask(labels)
    empty = (~mask.any(dim=1)).nonzero().flatten().tolist()
    if empty:
        raise ValueError(f"{owner}: rows {empty} have no label tokens (no response to score)")
    logps = token_logps(outputs, labels, owner=owner).logps
    sums = torch.where(mask, logps, 0).sum(dim=1)
    return PairBatch(labels, mask, sums, mask.sum(dim=1).to(sums.dtype))


@torch.no_grad()
def preference_stats(chosen: torch.Tensor, rejected: torch.Tensor) -> dict[str, torch.Tensor]:
    """Detached sums over the pairs of each side's implicit reward (the loss's own reward:
    DPO's ``beta * (pi - ref)``, SimPO's ``beta * pi / |y|``, ...) for DPOMetric."""
    margin = chosen - rejected
    return {
        "pairs": torch.tensor(chosen.numel(), device=chosen.device),
        "chosen_reward_sum": chosen.sum(),
        "rejected_reward_sum": rejected.sum(),
        "margin_sum": margin.sum(),
        "correct": (margin > 0).sum(),
    }
