"""Envs on a Ray group of their own: an EnvPool built with ``remote_group='envs'`` steps the
episodes on that group, and the rollout gives the same trajectories as with the pool in the
driver (same sampler, same seed); an env failing on the worker is still reported by
trajectory and turn. A sampler on a group of its own, driven by AsyncRollouts' producer
thread while the driver trains, gives the local sampler's trajectories, scored by the
trainer as sampled."""

import pytest

import twinkle
from twinkle import DeviceGroup
from twinkle.data_format import Message, SamplingParams, ToolCall
from twinkle.env import ArithmeticToolEnv, EnvFailure, EnvPool, task_row
from twinkle.infra import reset
from twinkle.infra.ray import runtime as ray_runtime
from twinkle.model import TransformersModel
from twinkle.rollout import AsyncRollouts, MultiTurnRollout
from twinkle.sampler import TorchSampler


@pytest.fixture(scope="module")
def groups(ray_cluster):
    groups = [DeviceGroup(name=name, ranks=1, device_type="cpu") for name in ("envs", "sampler")]
    twinkle.initialize("ray", groups=groups, lazy_collect=False)
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


def test_async_rollouts_drive_a_sampler_on_its_own_group(groups, sampler):
    stop = list(range(0, len(sampler.template.tokenizer), 2))
    params = SamplingParams(max_tokens=6, temperature=1.0, seed=5, stop=stop)
    tasks = [task_row(3, 4), task_row(5, 6)]

    def rollout_with(on):
        return MultiTurnRollout(
            on, sampler.template, EnvPool(ArithmeticToolEnv), 3, sampling_params=params,
            response_parser=calls_calculator,
        )  # fmt: skip

    remote = TorchSampler("bundled://tiny-qwen3", remote_group="sampler")
    remote.set_template("Qwen3_5Template")
    assert type(remote) is not TorchSampler
    expected = [t.tokens for t in rollout_with(sampler)(tasks, num_samples=2)]
    remote_rollout = rollout_with(remote)
    model = TransformersModel("bundled://tiny-qwen3")  # the samplers' weights (same seed)
    model.set_template("Qwen3_5Template")
    model.set_loss("GRPOLoss")
    model.set_optimizer("SGD", lr=0.0)
    produce = lambda index: remote_rollout(tasks, num_samples=2)  # noqa: E731
    with AsyncRollouts(produce, lambda: None, 1, num_batches=3) as rollouts:
        for _ in range(3):
            batch = rollouts.next_batch(timeout_s=300)
            assert [t.tokens for t in batch.data] == expected
            assert max(t.turns for t in batch.data) >= 2
            model.forward_backward(
                inputs=[t.input_feature() for t in batch.data],
                old_logps=[t.sampled_logprobs() for t in batch.data],
                advantages=[0.0] * len(batch.data),
            )
            model.clip_grad_and_step()
            rollouts.publish()
            assert model.calculate_metric(is_training=True)["policy/logp_mismatch"] < 1e-4
    assert rollouts.dropped == 0 and rollouts.version == 3
