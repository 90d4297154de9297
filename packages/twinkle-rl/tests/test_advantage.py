"""GRPO and RLOO advantages against hand-computed values, and the bad inputs."""

import pytest
import torch

from twinkle.advantage import GRPOAdvantage, RLOOAdvantage

REWARDS = [1.0, 0.0, 2.0, 1.0, 5.0, 5.0]  # three prompts, two generations each


def test_grpo_group_scale_is_mean_centred_over_the_group_std():
    got = GRPOAdvantage()(REWARDS, num_generations=2)
    s = torch.tensor([1.0, 0.0]).std()
    expected = torch.tensor([0.5 / s, -0.5 / s, 0.5 / s, -0.5 / s, 0.0, 0.0])
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)


def test_grpo_batch_and_none_scales():
    centred = torch.tensor([0.5, -0.5, 0.5, -0.5, 0.0, 0.0])
    torch.testing.assert_close(GRPOAdvantage()(REWARDS, num_generations=2, scale="none"), centred)
    batch = GRPOAdvantage()(REWARDS, num_generations=2, scale="batch")
    torch.testing.assert_close(batch, centred / torch.tensor(REWARDS).std(), atol=1e-5, rtol=0)


def test_zero_variance_groups_give_zero_not_nan():
    for scale in ("group", "batch"):
        got = GRPOAdvantage()([3.0] * 8, num_generations=4, scale=scale)
        assert torch.equal(got, torch.zeros(8))
    assert RLOOAdvantage()([3.0] * 8, num_generations=4, scale="batch").abs().max() == 0


def test_the_documents_tolist_gives_floats_in_reward_order():
    advantages = GRPOAdvantage()(REWARDS, num_generations=2, scale="group").tolist()
    assert len(advantages) == 6 and advantages[0] > 0 > advantages[1]


def test_rloo_is_reward_minus_the_mean_of_the_others():
    got = RLOOAdvantage()([1.0, 2.0, 6.0], num_generations=3)
    torch.testing.assert_close(got, torch.tensor([1 - 4.0, 2 - 3.5, 6 - 1.5]))


@pytest.mark.parametrize("estimator", [GRPOAdvantage(), RLOOAdvantage()])
def test_num_generations_that_does_not_divide_the_batch_is_refused(estimator):
    with pytest.raises(ValueError, match="do not split into groups of num_generations=4"):
        estimator([1.0] * 6, num_generations=4)


@pytest.mark.parametrize(
    ("rewards", "kwargs", "message"),
    [
        ([1.0, float("nan")], {"num_generations": 2}, "finite"),
        ([], {"num_generations": 2}, "empty"),
        ([[1.0, 2.0]], {"num_generations": 2}, "1 rewards do not split"),  # components summed
        ([[1.0, 2.0], [1.0]], {"num_generations": 2}, "one list of reward components"),
        ([[1.0, float("nan")], [0.0, 1.0]], {"num_generations": 2}, "completion 0's component 1"),
        ([1.0, 2.0], {"num_generations": 0}, ">= 1"),
        ([1.0, 2.0], {"num_generations": 2, "scale": "prompt"}, "unknown scale"),
        ([1.0, 2.0], {"num_generations": 1}, "num_generations >= 2"),
    ],
)
def test_bad_inputs_say_what_is_wrong(rewards, kwargs, message):
    with pytest.raises((ValueError, TypeError), match=message):
        GRPOAdvantage()(rewards, **kwargs)


def test_rloo_refuses_single_generations():
    with pytest.raises(ValueError, match="num_generations >= 2"):
        RLOOAdvantage()([1.0, 2.0], num_generations=1)
