"""Training and evaluation metrics: numbers accumulated over calls and reported as floats.

See ``twinkle.metric.base`` for the protocol every metric follows.
"""

from twinkle.metric.accuracy import TokenAccuracyMetric
from twinkle.metric.base import METRICS, Metric, build_metric
from twinkle.metric.collection import MetricCollection
from twinkle.metric.completion import CompletionRewardMetric
from twinkle.metric.defaults import build_train_metrics
from twinkle.metric.distillation import DistillationMetric
from twinkle.metric.embedding import EmbeddingMetric
from twinkle.metric.loss import LossMetric
from twinkle.metric.policy import PolicyMetric
from twinkle.metric.ppo import GRPOMetric, PPOMetric
from twinkle.metric.preference import DPOMetric
from twinkle.metric.scalar import ScalarMetric
from twinkle.metric.throughput import ThroughputMetric
from twinkle.metric.train import Accuracy, TrainMetric

__all__ = [
    "METRICS",
    "Accuracy",
    "CompletionRewardMetric",
    "DPOMetric",
    "DistillationMetric",
    "EmbeddingMetric",
    "GRPOMetric",
    "LossMetric",
    "Metric",
    "MetricCollection",
    "PPOMetric",
    "PolicyMetric",
    "ScalarMetric",
    "ThroughputMetric",
    "TokenAccuracyMetric",
    "TrainMetric",
    "build_metric",
    "build_train_metrics",
]
