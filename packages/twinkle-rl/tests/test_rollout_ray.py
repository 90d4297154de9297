"""Envs on a Ray group of their own: an EnvPool built with ``remote_group='envs'`` steps the
episodes on that group, and the rollout gives the same trajectories as with the pool in the
driver (same sampler, same seed); an env failing on the worker is still reported by
trajectory and turn."""

import pytest

import twinkle
from twinkle import DeviceGroup
from twinkle.data_format import Message, SamplingParams, ToolCall
from twinkle.env import ArithmeticToolEnv, EnvFailure, EnvPool, task_row
from twinkle.infra import reset
from twinkle.infra.ray import runtime as ray_runtime
from twinkle.rollout import MultiTurnRollout


@pytest.fixture(scope="module")
def groups(ray_cluster):
    twinkle.initialize(
        "ray", groups=[DeviceGroup(name="envs", ranks=1, device_type="cpu")], lazy_collect=False
    )
    yield
    ray_runtime.shutdown()
    reset()


def calls_calculator(text):
    call = ToolCall(name="calculator", arguments={"expression": "2 * 3"})
    return {"role": "assistant", "content": text, "tool_calls": [call.to_openai()]}


def test_envs_on_their_own_group_give_the_local_trajectories(groups, sampler):
    stop = list(range(0, len(sampler.template.tokenizer), 2))
    params = SamplingParams(max_tokens=6, temperature=1.0, seed=5, stop=stop)
    tasks = [task_row(3, 4), task_row(5, 6)]

    def run(pool):
        rollout = MultiTurnRollout(
            sampler, sampler.template, pool, 3, sampling_params=params,
            response_parser=calls_calculator,
        )  # fmt: skip
        return rollout(tasks, num_samples=2)

    remote_pool = EnvPool(ArithmeticToolEnv, remote_group="envs")
    assert type(remote_pool) is not EnvPool
    remote, local = run(remote_pool), run(EnvPool(ArithmeticToolEnv))
    assert [t.tokens for t in remote] == [t.tokens for t in local]
    assert all(t.messages[2].content == "6" for t in remote)  # the worker's calculator ran

    answered = remote_pool.step({0: Message(role="assistant", content="", tool_calls=None)})
    assert not isinstance(answered[0], EnvFailure) and answered[0].done  # an answer ends it
    broken = remote_pool.reset([{"messages": "not a list"}])
    assert isinstance(broken[0], EnvFailure) and "trajectory 0" in str(broken[0])
