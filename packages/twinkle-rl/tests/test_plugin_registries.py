"""Rewards, advantages and samplers by name, a plugin's included: ``REWARDS``, ``ADVANTAGES``
and ``SAMPLERS`` resolve ``source:ClassName`` through the same resolver as every registry."""

from __future__ import annotations

import json

import pytest

from twinkle.advantage import GRPOAdvantage
from twinkle.advantage.registry import ADVANTAGES
from twinkle.reward import GSM8KAccuracyReward
from twinkle.reward.registry import REWARDS
from twinkle.sampler import TorchSampler
from twinkle.sampler.registry import SAMPLERS

PLUGIN = '''
from twinkle.reward import Reward


class LengthReward(Reward):
    """One point per word of the completion."""

    def __call__(self, trajectories, ground_truths=None):
        return [float(len(t["messages"][-1]["content"].split())) for t in trajectories]
'''


@pytest.fixture
def plugin(tmp_path):
    (tmp_path / "rewards.py").write_text(PLUGIN)
    manifest = {"module": "rewards.py", "components": ["LengthReward"]}
    (tmp_path / "twinkle_plugin.json").write_text(json.dumps(manifest))
    return tmp_path


def test_the_builtin_rewards_advantages_and_samplers_are_registered():
    assert REWARDS.get("GSM8KAccuracyReward") is GSM8KAccuracyReward
    assert ADVANTAGES.get("GRPOAdvantage") is GRPOAdvantage
    assert SAMPLERS.get("TorchSampler") is TorchSampler


def test_a_plugin_reward_resolves_by_name_and_scores(plugin):
    reward = REWARDS.get(f"{plugin}:LengthReward")()
    completions = [{"messages": [{"role": "assistant", "content": "three short words"}]}]
    assert reward(completions) == [3.0]


def test_a_plugin_reward_is_no_advantage_nor_sampler(plugin):
    with pytest.raises(TypeError, match="is not an advantage: LengthReward subclasses Reward"):
        ADVANTAGES.get(f"{plugin}:LengthReward")
    with pytest.raises(TypeError, match="must subclass Sampler"):
        SAMPLERS.get(f"{plugin}:LengthReward")
