"""The metrics every trainable unit of a model starts with."""

from __future__ import annotations

from twinkle.metric.accuracy import TokenAccuracyMetric
from twinkle.metric.base import Metric
from twinkle.metric.distillation import DistillationMetric
from twinkle.metric.loss import LossMetric
from twinkle.metric.policy import PolicyMetric
from twinkle.metric.ppo import PPOMetric
from twinkle.metric.preference import DPOMetric
from twinkle.metric.scalar import ScalarMetric
from twinkle.metric.throughput import ThroughputMetric


def build_train_metrics() -> dict[str, Metric]:
    """Fresh training metrics keyed by what they report. The model feeds them per forward
    ``accumulate(inputs, outputs, loss=<sum>, num_tokens=<normaliser>, input_tokens=<n>)`` and
    per optimizer step ``accumulate(None, None, grad_norm=..., lr=..., step_time=<seconds>)``;
    together they report loss, token_accuracy, tokens, tokens_per_second, step_time,
    grad_norm and lr, and, on the batches whose loss returns their statistics, the
    ``policy/*`` figures of PolicyMetric (RL), ``value/*`` of PPOMetric (a critic),
    ``rewards/*`` of DPOMetric (preference losses) and ``distill/*`` of DistillationMetric
    (GKD)."""
    return {
        "loss": LossMetric(),
        "token_accuracy": TokenAccuracyMetric(),
        "throughput": ThroughputMetric(),
        "grad_norm": ScalarMetric("grad_norm"),
        "lr": ScalarMetric("lr", reduction="last"),
        "policy": PolicyMetric(),
        "value": PPOMetric(),
        "preference": DPOMetric(),
        "distillation": DistillationMetric(),
    }
