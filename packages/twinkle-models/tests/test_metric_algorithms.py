"""DPOMetric, PPOMetric, DistillationMetric, Accuracy and TrainMetric, fed by the real
losses' statistics and checked against figures computed by hand."""

import pytest
import torch

from twinkle.loss import DPOLoss, GKDLoss, PPOValueLoss
from twinkle.metric import (
    METRICS,
    Accuracy,
    DistillationMetric,
    DPOMetric,
    GRPOMetric,
    LossMetric,
    PPOMetric,
    TrainMetric,
    build_train_metrics,
)


def test_dpo_metric_over_two_batches():
    labels = torch.tensor([[-100, 1, 2], [-100, 3, -100], [-100, 1, 1], [-100, 2, 2]])
    metric = DPOMetric()
    rewards = []
    for shift in (0.0, 0.5):
        logps = torch.tensor(
            [[0, -1.0, -1.0], [0, -0.5, 0], [0, -2.0, -0.1], [0, -0.2, -0.3]], dtype=torch.float64
        )
        ref = torch.zeros(4, dtype=torch.float64) + shift
        out = DPOLoss(beta=0.1)({"labels": labels}, {"logps": logps}, ref_logps=ref)
        metric.accumulate({"labels": labels}, out)
        sums = [-2.0, -0.5, -2.1, -0.5]
        rewards += [(0.1 * (sums[i] - shift), 0.1 * (sums[i + 1] - shift)) for i in (0, 2)]
    report = metric.calculate()
    chosen = sum(c for c, _ in rewards) / 4
    rejected = sum(r for _, r in rewards) / 4
    assert report["rewards/chosen"] == pytest.approx(chosen)
    assert report["rewards/rejected"] == pytest.approx(rejected)
    assert report["rewards/margins"] == pytest.approx(chosen - rejected)
    assert report["rewards/accuracies"] == 0.0  # every chosen response scored lower here
    metric.reset()
    assert metric.calculate() == {}


def test_ppo_metric_explained_variance():
    labels = torch.tensor([[-100, 1, 1, 1, 1]])
    values = torch.tensor([[0.0, 1.0, 2.0, 2.5, 4.0]])
    returns = torch.tensor([[0.0, 1.0, 2.0, 3.0, 4.0]])
    out = PPOValueLoss(epsilon=None)({"labels": labels}, {"values": values}, returns=returns)
    metric = PPOMetric()
    metric.accumulate({"labels": labels}, out)
    report = metric.calculate()
    mse = 0.25 / 4
    variance = sum((r - 2.5) ** 2 for r in (1, 2, 3, 4)) / 4
    assert report["value/mse"] == pytest.approx(mse)
    assert report["value/explained_variance"] == pytest.approx(1 - mse / variance)
    assert report["value/returns_mean"] == pytest.approx(2.5)
    assert report["value/clip_fraction"] == 0.0


def test_distillation_metric_is_zero_at_the_teacher():
    labels = torch.tensor([[-100, 1, 2]])
    logits = torch.randn(1, 3, 4)
    metric = DistillationMetric()
    metric.accumulate(
        None, GKDLoss()({"labels": labels}, {"logits": logits}, teacher_logits=logits)
    )
    assert metric.calculate()["distill/reverse_kl"] == pytest.approx(0.0, abs=1e-6)
    metric.accumulate(
        None, GKDLoss()({"labels": labels}, {"logits": logits}, teacher_logits=logits * 3)
    )
    assert metric.calculate()["distill/reverse_kl"] > 0.01


def test_stat_metrics_refuse_malformed_stats():
    with pytest.raises(KeyError, match=r"outputs\['preference_stats'\] lacks \['correct'\]"):
        DPOMetric().accumulate(
            None,
            {
                "preference_stats": {
                    k: torch.tensor(1.0)
                    for k in ("pairs", "chosen_reward_sum", "rejected_reward_sum", "margin_sum")
                }
            },
        )


def test_reduce_across_sums_the_ranks():
    metric = PPOMetric()
    labels = torch.tensor([[-100, 1, 1]])
    out = PPOValueLoss(epsilon=None)(
        {"labels": labels},
        {"values": torch.tensor([[0.0, 1.0, 3.0]])},
        returns=torch.tensor([[0.0, 1.0, 2.0]]),
    )
    metric.accumulate(None, out)
    metric.reduce_across(lambda t: t * 2)  # two identical ranks
    assert metric.calculate()["value/mse"] == pytest.approx(0.5)


def test_names_users_import_and_defaults():
    for name in ("Accuracy", "LossMetric", "TrainMetric", "DPOMetric", "GRPOMetric", "PPOMetric"):
        assert name in METRICS
    labels = torch.tensor([[-100, 1, 2]])
    accuracy = Accuracy()
    accuracy.accumulate({"labels": labels}, {"pred_ids": torch.tensor([[-100, 1, 0]])})
    assert accuracy.calculate() == {"token_accuracy": 0.5}
    train = TrainMetric()
    train.accumulate(None, None, input_tokens=100)
    train.accumulate(None, None, grad_norm=2.0, lr=1e-3, step_time=0.5)
    train.accumulate(None, None, grad_norm=4.0, lr=5e-4, step_time=1.5)
    assert train.calculate() == {
        "lr": 5e-4,
        "grad_norm": 3.0,
        "tokens": 100.0,
        "step_time": 1.0,
        "tokens_per_second": 50.0,
    }
    assert isinstance(build_train_metrics()["loss"], LossMetric)
    assert {"value", "preference", "distillation"} <= set(build_train_metrics())
    assert issubclass(GRPOMetric, METRICS.get("PolicyMetric"))
