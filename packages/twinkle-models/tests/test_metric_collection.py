"""MetricCollection and the metric registry."""

import pytest
import torch

from twinkle.metric import (
    METRICS,
    EmbeddingMetric,
    LossMetric,
    Metric,
    MetricCollection,
    ScalarMetric,
    build_metric,
    build_train_metrics,
)


def training_collection(prefix=""):
    return MetricCollection(build_train_metrics().values(), prefix=prefix)


def feed_one_step(metrics):
    labels = torch.tensor([[-100, 1, 2]])
    logits = torch.nn.functional.one_hot(torch.tensor([[1, 0, 0]]), 4).float()
    metrics.accumulate(
        {"labels": labels}, {"logits": logits}, loss=3.0, num_tokens=2, input_tokens=3
    )
    metrics.accumulate(None, None, grad_norm=0.5, lr=1e-4, step_time=0.25)


def test_one_call_feeds_every_metric_and_reports_plain_floats():
    metrics = training_collection(prefix="train/")
    feed_one_step(metrics)
    report = metrics.calculate()
    assert report == {
        "train/loss": 1.5,
        "train/token_accuracy": 0.5,
        "train/tokens": 3.0,
        "train/step_time": 0.25,
        "train/tokens_per_second": 12.0,
        "train/grad_norm": 0.5,
        "train/lr": 1e-4,
    }
    assert all(type(value) is float for value in report.values())


def test_train_metrics_are_fresh_and_skip_an_embedding_batch():
    first, second = build_train_metrics(), build_train_metrics()
    assert set(first) == {
        "loss",
        "token_accuracy",
        "throughput",
        "grad_norm",
        "lr",
        "policy",
        "value",
        "preference",
        "distillation",
    }
    assert all(first[key] is not second[key] for key in first)
    metrics = MetricCollection([*first.values(), EmbeddingMetric()])
    embeddings = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
    metrics.accumulate(
        {"labels": torch.tensor([1, 0])}, {"embeddings": embeddings}, loss=0.5, num_tokens=1
    )
    assert metrics.calculate() == {"loss": 0.5, "pos_sim": pytest.approx(1.0)}


def test_calculate_and_reset_clears_every_metric():
    metrics = training_collection()
    feed_one_step(metrics)
    assert metrics.calculate_and_reset()["loss"] == 1.5
    assert metrics.calculate() == {}


def test_two_metrics_reporting_the_same_key_is_an_error():
    metrics = MetricCollection([ScalarMetric("loss"), LossMetric()])
    metrics.accumulate({}, {}, loss=1.0, num_tokens=1)
    with pytest.raises(ValueError, match="LossMetric and ScalarMetric both report 'loss'"):
        metrics.calculate()


def test_add_checks_what_it_is_given():
    metrics = MetricCollection()
    loss = LossMetric()
    metrics.add(loss)
    with pytest.raises(ValueError, match="already in the collection"):
        metrics.add(loss)
    with pytest.raises(TypeError, match="holds Metric instances"):
        metrics.add(LossMetric)
    assert list(metrics) == [loss] and len(metrics) == 1


def test_build_metric_from_name_class_or_instance():
    assert isinstance(build_metric("LossMetric"), LossMetric)
    assert build_metric(EmbeddingMetric, use_batch=False).use_batch is False
    built = ScalarMetric("lr")
    assert build_metric(built) is built
    with pytest.raises(ValueError, match="already built"):
        build_metric(built, reduction="last")
    with pytest.raises(ValueError, match=r"unknown metric 'Loss'.*LossMetric"):
        build_metric("Loss")


def test_user_metric_registers_and_builds():
    class CountCalls(Metric):
        def __init__(self):
            self.calls = 0

        def accumulate(self, inputs=None, outputs=None, **kwargs):
            self.calls += 1

        def calculate(self):
            return {"calls": float(self.calls)}

        def reset(self):
            self.calls = 0

    assert METRICS.get(CountCalls) is CountCalls
    assert build_metric(CountCalls).calculate() == {"calls": 0.0}
