"""Training and evaluation metrics: numbers accumulated over calls and reported as floats.

See ``twinkle.metric.base`` for the protocol every metric follows.
"""

from twinkle.metric.accuracy import TokenAccuracyMetric
from twinkle.metric.base import METRICS, Metric, build_metric
from twinkle.metric.collection import MetricCollection
from twinkle.metric.completion import CompletionRewardMetric
from twinkle.metric.defaults import build_train_metrics
from twinkle.metric.embedding import EmbeddingMetric
from twinkle.metric.loss import LossMetric
from twinkle.metric.policy import PolicyMetric
from twinkle.metric.scalar import ScalarMetric
from twinkle.metric.throughput import ThroughputMetric

__all__ = [
    "METRICS",
    "CompletionRewardMetric",
    "EmbeddingMetric",
    "LossMetric",
    "Metric",
    "MetricCollection",
    "PolicyMetric",
    "ScalarMetric",
    "ThroughputMetric",
    "TokenAccuracyMetric",
    "build_metric",
    "build_train_metrics",
]
