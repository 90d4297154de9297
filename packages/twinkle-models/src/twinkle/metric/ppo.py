"""PPOMetric: how well the critic fits the returns; GRPOMetric: the policy figures."""

from __future__ import annotations

from twinkle.metric.base import METRICS
from twinkle.metric.policy import PolicyMetric
from twinkle.metric.stat_sums import StatSumsMetric


@METRICS.register
class PPOMetric(StatSumsMetric):
    """Reads ``outputs['value_stats']`` from PPOValueLoss and reports over the label tokens
    since the reset: ``value/clip_fraction`` (tokens whose clipped error was the larger),
    ``value/mse``, ``value/mean``, ``value/returns_mean`` and ``value/explained_variance``
    (``1 - mse / variance of the returns``: 1 is a perfect critic, 0 one that predicts the
    mean; absent while the returns are constant). The policy side of PPO reports through
    PolicyMetric (``policy/*``), which every model already holds."""

    stats_key = "value_stats"
    fields = (
        "tokens",
        "clipped",
        "squared_error_sum",
        "returns_sum",
        "returns_sq_sum",
        "values_sum",
    )
    count_field = "tokens"

    def figures(self, totals: dict[str, float]) -> dict[str, float]:
        n = totals["tokens"]
        mse = totals["squared_error_sum"] / n
        mean_return = totals["returns_sum"] / n
        variance = totals["returns_sq_sum"] / n - mean_return**2
        result = {
            "value/clip_fraction": totals["clipped"] / n,
            "value/mse": mse,
            "value/mean": totals["values_sum"] / n,
            "value/returns_mean": mean_return,
        }
        if variance > 1e-12:
            result["value/explained_variance"] = 1 - mse / variance
        return result


@METRICS.register
class GRPOMetric(PolicyMetric):
    """PolicyMetric under the name GRPO users know: clip fraction, ratio, KL to the sampler
    and to the reference, entropy (``policy/*``), for every loss of the GRPO family. A
    model already reports these; add it to a collection of your own, not to a model's."""
