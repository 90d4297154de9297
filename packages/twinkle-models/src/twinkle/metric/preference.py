"""DPOMetric: implicit rewards, margins and accuracy of preference training."""

from __future__ import annotations

from twinkle.metric.base import METRICS
from twinkle.metric.stat_sums import StatSumsMetric


@METRICS.register
class DPOMetric(StatSumsMetric):
    """Reads ``outputs['preference_stats']``, which DPOLoss, SimPOLoss, CPOLoss and ORPOLoss
    return (each with its own implicit reward: DPO's ``beta * (pi - ref)``, SimPO's
    length-normalised ``beta * pi / |y|``, ...), and reports over the pairs since the reset
    ``rewards/chosen`` and ``rewards/rejected`` (mean reward of each side),
    ``rewards/margins`` (their mean difference) and ``rewards/accuracies`` (the share of
    pairs whose chosen reward is the higher)."""

    stats_key = "preference_stats"
    fields = ("pairs", "chosen_reward_sum", "rejected_reward_sum", "margin_sum", "correct")
    count_field = "pairs"

    def figures(self, totals: dict[str, float]) -> dict[str, float]:
        pairs = totals["pairs"]
        return {
            "rewards/chosen": totals["chosen_reward_sum"] / pairs,
            "rewards/rejected": totals["rejected_reward_sum"] / pairs,
            "rewards/margins": totals["margin_sum"] / pairs,
            "rewards/accuracies": totals["correct"] / pairs,
        }
