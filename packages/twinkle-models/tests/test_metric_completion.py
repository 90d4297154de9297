"""CompletionRewardMetric, called the way the RL examples call it."""

import statistics

import numpy as np
import pytest
import torch

from twinkle.metric import CompletionRewardMetric

TOTAL = [1.0, 2.0, 0.0, 1.0]
FORMAT = [1.0, 1.0, 0.0, 0.0]
ACCURACY = [0.0, 1.0, 0.0, 1.0]
LENGTHS = [10, 20, 30, 44]


def test_statistics_match_a_hand_computation():
    metrics = CompletionRewardMetric()
    metrics.accumulate(
        completion_lengths=LENGTHS,
        rewards={"total": TOTAL, "format": FORMAT, "accuracy": ACCURACY},
    )
    result = metrics.calculate()
    assert result["reward/total/mean"] == 1.0
    assert result["reward/total/std"] == pytest.approx(np.std(TOTAL))
    assert (result["reward/total/min"], result["reward/total/max"]) == (0.0, 2.0)
    assert result["reward/format/mean"] == 0.5
    assert result["reward/accuracy/mean"] == 0.5
    assert result["completion_length/mean"] == 26.0
    assert (result["completion_length/min"], result["completion_length/max"]) == (10.0, 44.0)
    assert len(result) == 3 * 4 + 3
    assert all(type(value) is float for value in result.values())


def test_positional_none_forms_and_accumulation_over_calls():
    metrics = CompletionRewardMetric()
    metrics.accumulate(None, completion_lengths=LENGTHS[:2], rewards={"total": TOTAL[:2]})
    metrics.accumulate(None, None, completion_lengths=LENGTHS[2:], rewards={"total": TOTAL[2:]})
    result = metrics.calculate()
    assert result["reward/total/mean"] == statistics.fmean(TOTAL)
    assert result["reward/total/std"] == pytest.approx(statistics.pstdev(TOTAL))
    assert result["completion_length/mean"] == statistics.fmean(LENGTHS)


def test_reset_forgets_everything():
    metrics = CompletionRewardMetric()
    metrics.accumulate(completion_lengths=[3], rewards={"total": [5.0]})
    metrics.reset()
    assert metrics.calculate() == {}
    metrics.accumulate(completion_lengths=[7], rewards={"total": [1.0]})
    assert metrics.calculate()["reward/total/mean"] == 1.0


def test_arrays_and_tensors_are_accepted():
    metrics = CompletionRewardMetric()
    metrics.accumulate(
        completion_lengths=np.array([2, 4]), rewards={"total": torch.tensor([0.5, 1.5])}
    )
    result = metrics.calculate()
    assert (result["reward/total/mean"], result["completion_length/mean"]) == (1.0, 3.0)


def test_calls_without_its_fields_are_ignored():
    metrics = CompletionRewardMetric()
    metrics.accumulate({"labels": torch.zeros(1, 2)}, {"logits": torch.zeros(1, 2, 3)}, loss=1.0)
    assert metrics.calculate() == {}


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (
            {"completion_lengths": [1, 2, 3], "rewards": {"total": [1.0, 2.0]}},
            ValueError,
            "lengths differ \\(completion_lengths: 3, rewards\\['total'\\]: 2\\)",
        ),
        (
            {"rewards": {"total": [1.0, 2.0], "format": [1.0]}},
            ValueError,
            "lengths differ",
        ),
        ({"rewards": {"total": [1.0, "high"]}}, TypeError, "rewards\\['total'\\]\\[1\\] must be"),
        ({"rewards": {"total": [None]}}, TypeError, "must be a number, got None"),
        ({"rewards": {"total": [True]}}, TypeError, "must be a number, got True"),
        ({"rewards": {"total": [float("nan")]}}, ValueError, "nan; every value must be finite"),
        ({"rewards": [1.0, 2.0]}, TypeError, "rewards must be a dict"),
        ({"rewards": {"total": "1.0"}}, TypeError, "must be a list of numbers"),
        ({"completion_lengths": [1.5]}, TypeError, "completion_lengths\\[0\\] must be an int"),
        ({"completion_lengths": [-1]}, ValueError, "counts must be >= 0"),
    ],
)
def test_bad_inputs(kwargs, error, match):
    metrics = CompletionRewardMetric()
    with pytest.raises(error, match=match):
        metrics.accumulate(**kwargs)
    assert metrics.calculate() == {}  # a rejected call adds nothing
