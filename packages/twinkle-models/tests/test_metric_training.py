"""The metrics a model feeds during training: loss, token accuracy, throughput, scalars."""

import math

import pytest
import torch

from twinkle.metric import LossMetric, ScalarMetric, ThroughputMetric, TokenAccuracyMetric

# --- LossMetric


def test_loss_is_weighted_by_tokens_not_averaged_per_batch():
    metric = LossMetric()
    metric.accumulate({}, {}, loss=torch.tensor(6.0), num_tokens=torch.tensor(3))
    metric.accumulate({}, {}, loss=4.0, num_tokens=1)
    assert metric.calculate() == {"loss": pytest.approx(10.0 / 4)}  # mean of means would be 3


def test_loss_ignores_calls_without_it_and_resets():
    metric = LossMetric()
    metric.accumulate(None, None, grad_norm=1.0, lr=1e-4)
    assert metric.calculate() == {}
    metric.accumulate({}, {}, loss=2.0, num_tokens=4)
    assert metric.calculate() == {"loss": 0.5}
    assert metric.calculate() == {"loss": 0.5}  # calculate does not reset
    metric.reset()
    assert metric.calculate() == {}
    metric.accumulate({}, {}, loss=9.0, num_tokens=3)
    assert metric.calculate() == {"loss": 3.0}


def test_loss_bad_inputs():
    metric = LossMetric()
    with pytest.raises(ValueError, match="num_tokens is missing"):
        metric.accumulate({}, {}, loss=1.0)
    with pytest.raises(TypeError, match="loss must be a number"):
        metric.accumulate({}, {}, loss="1.0", num_tokens=1)
    with pytest.raises(ValueError, match="loss must be one number"):
        metric.accumulate({}, {}, loss=torch.ones(3), num_tokens=3)
    metric.accumulate({}, {}, loss=0.0, num_tokens=0)
    with pytest.raises(ValueError, match="count 0.0 tokens"):
        metric.calculate()


# --- TokenAccuracyMetric


def logits_predicting(ids, vocab=5):
    """Logits whose argmax at every position is ``ids``."""
    return torch.nn.functional.one_hot(torch.tensor(ids), vocab).float() * 3.0


def test_accuracy_from_logits_uses_the_shift_convention():
    # Position t-1 predicts labels[t]; predictions at the last position are never scored.
    labels = torch.tensor([[-100, 2, 3, 4], [-100, -100, 1, 1]])
    logits = logits_predicting([[2, 3, 0, 4], [0, 1, 2, 3]])
    # scored: row0 t=1..3 -> preds 2,3,0 vs 2,3,4 (2 right); row1 t=2,3 -> 1,2 vs 1,1 (1 right)
    metric = TokenAccuracyMetric()
    metric.accumulate({"labels": labels}, {"logits": logits})
    assert metric.calculate() == {"token_accuracy": pytest.approx(3 / 5)}


def test_accuracy_from_aligned_pred_ids_matches_logits():
    labels = torch.tensor([[-100, 2, 3, 4], [-100, -100, 1, 1]])
    logits = logits_predicting([[2, 3, 0, 4], [0, 1, 2, 3]])
    pred_ids = torch.cat([torch.zeros(2, 1, dtype=torch.long), logits[:, :-1].argmax(-1)], dim=1)
    from_logits, from_ids = TokenAccuracyMetric(), TokenAccuracyMetric()
    from_logits.accumulate({"labels": labels}, {"logits": logits})
    from_ids.accumulate({"labels": labels}, {"pred_ids": pred_ids})
    assert from_ids.calculate() == from_logits.calculate()


def test_accuracy_accumulates_over_batches_by_token():
    metric = TokenAccuracyMetric()
    metric.accumulate({"labels": torch.tensor([[-100, 1]])}, {"pred_ids": torch.tensor([[0, 1]])})
    metric.accumulate(
        {"labels": torch.tensor([[-100, 1, 2, 3]])}, {"pred_ids": torch.tensor([[0, 0, 0, 0]])}
    )
    metric.accumulate(None, None, grad_norm=1.0)  # a step-level call is not for this metric
    assert metric.calculate() == {"token_accuracy": pytest.approx(1 / 4)}
    metric.reset()
    assert metric.calculate() == {}


def test_accuracy_ignores_calls_without_predictions():
    metric = TokenAccuracyMetric()
    metric.accumulate({"labels": torch.tensor([1, 0])}, {"embeddings": torch.zeros(2, 3)})
    metric.accumulate({"labels": torch.tensor([[-100, 1]])}, {"logps": torch.zeros(1, 2)})
    assert metric.calculate() == {}


def test_accuracy_bad_inputs():
    metric = TokenAccuracyMetric()
    labels = torch.tensor([[-100, 1, 2]])
    with pytest.raises(ValueError, match="aligned with labels"):
        metric.accumulate({"labels": labels}, {"pred_ids": torch.zeros(1, 2, dtype=torch.long)})
    with pytest.raises(ValueError, match="matching labels"):
        metric.accumulate({"labels": labels}, {"logits": torch.zeros(1, 4, 7)})
    with pytest.raises(ValueError, match="labels must be \\(batch, seq\\)"):
        metric.accumulate({"labels": torch.tensor([1, 2])}, {"logits": torch.zeros(2, 7)})
    with pytest.raises(KeyError, match="needs inputs\\['labels'\\]; it has: input_ids"):
        metric.accumulate({"input_ids": labels}, {"logits": torch.zeros(1, 3, 7)})
    with pytest.raises(KeyError, match="needs inputs\\['labels'\\]"):
        metric.accumulate(None, {"logits": torch.zeros(1, 3, 7)})
    metric.accumulate({"labels": torch.tensor([[5, -100]])}, {"logits": torch.zeros(1, 2, 7)})
    with pytest.raises(ValueError, match="no scored label tokens"):
        metric.calculate()


# --- ThroughputMetric


def test_throughput():
    metric = ThroughputMetric()
    metric.accumulate({}, {}, input_tokens=torch.tensor(100))
    metric.accumulate({}, {}, input_tokens=50)
    assert metric.calculate() == {"tokens": 150.0}
    metric.accumulate(None, None, step_time=0.5)
    metric.accumulate({}, {}, input_tokens=75)
    metric.accumulate(None, None, step_time=1.0)
    assert metric.calculate() == {
        "tokens": 225.0,
        "step_time": pytest.approx(0.75),
        "tokens_per_second": pytest.approx(225 / 1.5),
    }
    metric.reset()
    assert metric.calculate() == {}


@pytest.mark.parametrize(
    "kwargs", [{"step_time": -1.0}, {"step_time": math.inf}, {"input_tokens": -5}]
)
def test_throughput_bad_inputs(kwargs):
    with pytest.raises(ValueError, match=">= 0"):
        ThroughputMetric().accumulate(None, None, **kwargs)


# --- ScalarMetric


@pytest.mark.parametrize(
    ("reduction", "expected"), [("mean", 2.0), ("last", 3.0), ("min", 1.0), ("max", 3.0)]
)
def test_scalar_reductions(reduction, expected):
    metric = ScalarMetric("grad_norm", reduction=reduction)
    for value in [torch.tensor(1.0), 2.0, torch.tensor([3.0])]:
        metric.accumulate(None, None, grad_norm=value)
    metric.accumulate({}, {}, loss=1.0, num_tokens=1)  # no grad_norm: ignored
    assert metric.calculate() == {"grad_norm": pytest.approx(expected)}


def test_scalar_name_reset_and_non_finite():
    metric = ScalarMetric("lr", reduction="last", name="learning_rate")
    assert metric.calculate() == {}
    metric.accumulate(None, None, lr=1e-4)
    assert metric.calculate() == {"learning_rate": 1e-4}
    metric.reset()
    assert metric.calculate() == {}
    norm = ScalarMetric("grad_norm")
    norm.accumulate(None, None, grad_norm=torch.tensor(float("inf")))
    assert norm.calculate() == {"grad_norm": math.inf}


def test_scalar_bad_inputs():
    with pytest.raises(ValueError, match="reduction must be one of mean, last, min, max"):
        ScalarMetric("lr", reduction="median")
    with pytest.raises(ValueError, match="kwarg name"):
        ScalarMetric("")
    with pytest.raises(TypeError, match="grad_norm must be a number"):
        ScalarMetric("grad_norm").accumulate(None, None, grad_norm=[1.0])
