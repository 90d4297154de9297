"""DistillationMetric: how far the student is from the teacher."""

from __future__ import annotations

from twinkle.metric.base import METRICS
from twinkle.metric.stat_sums import StatSumsMetric


@METRICS.register
class DistillationMetric(StatSumsMetric):
    """Reads ``outputs['distill_stats']`` from GKDLoss and reports
    ``distill/reverse_kl``: the mean over label tokens of KL(student || teacher) at the
    loss's temperature, whatever its beta, so runs with different betas compare."""

    stats_key = "distill_stats"
    fields = ("tokens", "reverse_kl_sum")
    count_field = "tokens"

    def figures(self, totals: dict[str, float]) -> dict[str, float]:
        return {"distill/reverse_kl": totals["reverse_kl_sum"] / totals["tokens"]}
