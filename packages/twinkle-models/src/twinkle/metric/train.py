"""TrainMetric and Accuracy: the reference product's names for the step-level figures and
for token accuracy."""

from __future__ import annotations

from twinkle.metric.accuracy import TokenAccuracyMetric
from twinkle.metric.base import METRICS
from twinkle.metric.collection import MetricCollection
from twinkle.metric.scalar import ScalarMetric
from twinkle.metric.throughput import ThroughputMetric


@METRICS.register
class Accuracy(TokenAccuracyMetric):
    """Token accuracy (``token_accuracy``), exactly TokenAccuracyMetric."""


@METRICS.register
class TrainMetric(MetricCollection):
    """The learning rate (``lr``, the last), the gradient norm (``grad_norm``, the mean
    over steps), and tokens, step time and tokens/s, fed by the model's per-step
    ``accumulate(None, None, grad_norm=..., lr=..., step_time=...)`` and per-forward
    ``input_tokens``. A model already holds these figures by default
    (``build_train_metrics``); TrainMetric is for a collection of your own."""

    def __init__(self, prefix: str = "") -> None:
        super().__init__(
            [ScalarMetric("lr", reduction="last"), ScalarMetric("grad_norm"), ThroughputMetric()],
            prefix=prefix,
        )
