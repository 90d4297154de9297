"""Reward and Advantage are protocols: subclasses must implement __call__, and then work."""

import pytest
import torch

from twinkle.advantage.base import Advantage
from twinkle.reward.base import Reward


def test_a_reward_without_call_cannot_be_built():
    class Incomplete(Reward):
        pass

    with pytest.raises(TypeError, match="abstract"):
        Incomplete()


def test_a_reward_reads_ground_truth_from_user_data():
    class ExactAnswer(Reward):
        def __call__(self, trajectories, ground_truths):
            return [
                float(t["messages"][-1]["content"] == t["user_data"][0]["answer"])
                for t in trajectories
            ]

    rows = [
        {"messages": [{"role": "assistant", "content": "42"}], "user_data": [{"answer": "42"}]},
        {"messages": [{"role": "assistant", "content": "41"}], "user_data": [{"answer": "42"}]},
    ]
    assert ExactAnswer()(rows, []) == [1.0, 0.0]


def test_an_advantage_subclass_keeps_the_reward_order():
    class MeanBaseline(Advantage):
        def __call__(self, rewards, *, num_generations, scale="group"):
            grouped = torch.as_tensor(rewards, dtype=torch.float32).view(-1, num_generations)
            return (grouped - grouped.mean(dim=1, keepdim=True)).flatten()

    assert MeanBaseline()([1.0, 0.0, 3.0, 3.0], num_generations=2).tolist() == [0.5, -0.5, 0, 0]
