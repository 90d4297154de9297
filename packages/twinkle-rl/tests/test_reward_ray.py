"""Rewards as remote components (Ray mode, a local CPU cluster): a reward built with
``remote_group='reward'`` scores on that group exactly as it does in the driver, takes lazy
results of another group as input, reports a user's failing reward with its rank, group and
calling line, and a reward class built on every worker slices the batch over them."""

import pytest

import twinkle
from twinkle import DeviceGroup
from twinkle.infra import RemoteError, reset
from twinkle.infra.ray import runtime as ray_runtime
from twinkle.infra.ray.lazy import LazyResult
from twinkle.reward import (
    CountdownAccuracyReward,
    FormatReward,
    GSM8KAccuracyReward,
    GSM8KFormatReward,
)


@pytest.fixture(scope="module")
def groups(ray_cluster):
    twinkle.initialize(
        "ray",
        groups=[
            DeviceGroup(name="model", ranks=2, device_type="cpu"),
            DeviceGroup(name="reward", ranks=1, device_type="cpu"),
        ],
        lazy_collect=False,  # results at once; the lazy test asks for a lazy result itself
    )
    yield
    ray_runtime.shutdown()
    reset()


@pytest.mark.parametrize("reward_cls", [GSM8KAccuracyReward, GSM8KFormatReward, FormatReward])
def test_a_remote_reward_scores_like_the_local_one(groups, reward_cls):
    from ray_rewards import TRAJECTORIES

    remote = reward_cls(remote_group="reward")
    assert type(remote) is not reward_cls and "on group 'reward'" in repr(remote)
    local = reward_cls()(TRAJECTORIES)
    assert remote(TRAJECTORIES) == local
    assert remote(TRAJECTORIES, []) == local  # the documents' two-argument call
    if reward_cls is GSM8KAccuracyReward:
        assert local == [1.0, 0.0, 0.0, 1.0, 1.0]  # exact equality above is not vacuous


def test_the_ground_truth_error_comes_back_from_the_worker(groups):
    from ray_rewards import TRAJECTORIES

    with pytest.raises(RemoteError, match=r"CountdownAccuracyReward reads the ground truth"):
        CountdownAccuracyReward(remote_group="reward")(TRAJECTORIES)


def test_lazy_trajectories_from_another_group_flow_into_the_reward(groups):
    from ray_rewards import TrajectorySource

    lazy = TrajectorySource(remote_group="model").trajectories()
    assert isinstance(lazy, LazyResult)
    scores = GSM8KAccuracyReward(remote_group="reward")(lazy)
    assert scores == GSM8KAccuracyReward()(lazy.resolve())
    assert sorted(scores) == [0.0, 0.0, 1.0, 1.0, 1.0]


def test_a_failing_user_reward_names_rank_group_and_line(groups):
    from ray_rewards import TRAJECTORIES, BrokenReward

    broken = BrokenReward(remote_group="reward")
    with pytest.raises(RemoteError) as caught:
        broken(TRAJECTORIES)  # the failing reward call
    message = str(caught.value)
    assert "BrokenReward.__call__ failed on worker rank 0 of group 'reward'" in message
    assert "test_reward_ray.py:" in message and "ValueError: cannot score 5" in message
    assert (caught.value.rank, caught.value.group) == (0, "reward")
    assert GSM8KFormatReward(remote_group="reward")(TRAJECTORIES[:1]) == [1.0]  # group lives on


def test_a_reward_on_every_worker_slices_the_batch(groups):
    from ray_rewards import TRAJECTORIES, RankReward

    spread = RankReward(remote_group="model")
    assert spread(TRAJECTORIES) == [0.0, 0.0, 0.0, 1.0, 1.0]
    assert spread(TRAJECTORIES[:1]) == [0.0]  # fewer trajectories than workers
