"""Rewards, advantages and samplers by name, a plugin's included: ``REWARDS``, ``ADVANTAGES``
and ``SAMPLERS`` resolve ``source:ClassName`` through the same resolver as every registry."""

from __future__ import annotations

import json

import pytest

import twinkle.advantage
import twinkle.reward
import twinkle.sampler
from twinkle.advantage import Advantage, GRPOAdvantage
from twinkle.advantage.registry import ADVANTAGES
from twinkle.reward import GSM8KAccuracyReward, Reward
from twinkle.reward.registry import REWARDS
from twinkle.sampler import Sampler, TorchSampler
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


def test_every_exported_reward_advantage_and_sampler_is_registered():
    assert REWARDS.get("GSM8KAccuracyReward") is GSM8KAccuracyReward
    assert ADVANTAGES.get("GRPOAdvantage") is GRPOAdvantage
    assert SAMPLERS.get("TorchSampler") is TorchSampler
    for registry, package, base in (
        (REWARDS, twinkle.reward, Reward),
        (ADVANTAGES, twinkle.advantage, Advantage),
        (SAMPLERS, twinkle.sampler, Sampler),
    ):
        exported = {
            name
            for name in package.__all__
            if isinstance(getattr(package, name), type)
            and issubclass(getattr(package, name), base)
            and getattr(package, name) is not base
        }
        assert set(registry.names()) == exported and len(exported) >= 2


def test_a_plugin_reward_resolves_by_name_and_scores(plugin):
    reward = REWARDS.get(f"{plugin}:LengthReward")()
    completions = [{"messages": [{"role": "assistant", "content": "three short words"}]}]
    assert reward(completions) == [3.0]


def test_a_plugin_reward_is_no_advantage_nor_sampler(plugin):
    with pytest.raises(TypeError, match="is not an advantage: LengthReward subclasses Reward"):
        ADVANTAGES.get(f"{plugin}:LengthReward")
    with pytest.raises(TypeError, match="must subclass Sampler"):
        SAMPLERS.get(f"{plugin}:LengthReward")
