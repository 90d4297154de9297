"""@remote_class / @remote_function over Ray actors: every dispatch and collect mode over two
workers, lazy results that flow worker to worker, iterators, and the device placement."""

import pytest

import twinkle
from twinkle import DeviceGroup, DeviceMesh, get_device_placement
from twinkle.infra import reset
from twinkle.infra.ray import runtime as ray_runtime
from twinkle.infra.ray.lazy import LazyResult
from twinkle.infra.ray.traffic import count_driver_traffic


@pytest.fixture(scope="module")
def groups(ray_cluster):
    """A 'model' group of two CPU workers and an 'other' group of one, for the whole module."""
    twinkle.initialize(
        "ray",
        groups=[
            DeviceGroup(name="model", ranks=2, device_type="cpu"),
            DeviceGroup(name="other", ranks=1, device_type="cpu"),
        ],
    )
    yield
    ray_runtime.shutdown()
    reset()


@pytest.fixture(scope="module")
def shard(groups):
    from ray_components import Shard

    return Shard(3, remote_group="model")


def test_each_worker_has_its_rank_env_and_a_gloo_group(shard):
    seen = shard.whoami()
    assert [s["rank"] for s in seen] == [0, 1]
    assert [s["env_rank"] for s in seen] == ["0", "1"]
    assert all(s["world_size"] == 2 and s["backend"] == "gloo" for s in seen)
    assert [s["sum_of_ranks"] for s in seen] == [1.0, 1.0]  # a real all_reduce over the two
    assert all(s["mode"] == "ray" and s["worker_group"] == "model" for s in seen)
    assert seen[0]["master"] == seen[1]["master"]
    assert seen[0]["pid"] != seen[1]["pid"]


def test_construction_outside_a_group_stays_in_the_driver(groups):
    from ray_components import Shard

    local = Shard(2)
    assert type(local) is Shard and local.times_scale([1, 2]) == [2, 4]


def test_slice_cuts_lists_and_passes_the_rest_whole(shard):
    assert shard.take_slice([1, 2, 3], tag="x") == [(0, [1, 2], "x"), (1, [3], "x")]


def test_a_batch_smaller_than_the_workers_leaves_some_empty(shard):
    assert shard.take_slice([7]) == [(0, [7], "t"), (1, [], "t")]
    assert shard.times_scale([5]) == [15]


def test_all_sends_everything_to_every_worker(shard):
    assert shard.take_all([1, 2]) == [(0, [1, 2]), (1, [1, 2])]


def test_slice_dp_follows_the_component_mesh(groups):
    from ray_components import Shard

    data_parallel = Shard(1, remote_group="model")  # the group's default mesh: dp=2
    assert data_parallel.times_scale([1, 2, 3]) == [1, 2, 3]
    tensor_parallel = Shard(
        1, device_mesh=DeviceMesh.from_sizes(tp_size=2, device_type="cpu"), remote_group="model"
    )
    # tp peers read the same data, so 'flatten' sees the batch once per peer
    assert tensor_parallel.times_scale([1, 2, 3]) == [1, 2, 3, 1, 2, 3]


def test_function_dispatch_and_collect(shard):
    assert shard.take_halves([1, 2, 3, 4, 5]) == {0: [1, 3, 5], 1: [2, 4]}


def test_mean_sum_first_and_execute_first(shard):
    mean = shard.rank_mean()
    assert mean["rank"] == 0.5 and mean["arr"].tolist() == [0.5, 0.5]
    assert shard.rank_sum() == 3.0
    assert shard.first_rank() == 0
    assert shard.only_first() == [0]


def test_last_pp_returns_the_last_stage(groups):
    from ray_components import Shard

    piped = Shard(
        1, device_mesh=DeviceMesh.from_sizes(pp_size=2, device_type="cpu"), remote_group="model"
    )
    assert piped.stage() == ["stage of rank 1"]


def test_lazy_result_stays_in_the_store_and_flows_to_another_group(shard):
    from ray_components import Summer

    summer = Summer(remote_group="other")
    with count_driver_traffic() as traffic:
        doubled = shard.lazy_double(list(range(20_000)))
        assert isinstance(doubled, LazyResult)
        assert summer.total(doubled) == [(0, 2 * sum(range(20_000)))]
    # 20k ints went out once; the 20k doubled ones never came back through the driver
    assert traffic.received < 200 and traffic.sent < 100_000
    assert doubled[:3] == [0, 2, 4] and len(doubled) == 20_000  # used here, it resolves


def test_lazy_result_sliced_over_workers_of_a_second_component(shard, groups):
    from ray_components import Shard

    second = Shard(1, remote_group="model")
    lazy = shard.lazy_double([1, 2, 3])
    assert second.take_slice(lazy) == [(0, [2, 4], "t"), (1, [6], "t")]


def test_an_iterator_across_the_boundary(shard, groups):
    from ray_components import Numbers

    numbers = Numbers(5, 2, remote_group="model")
    assert len(numbers) == 3
    batches = list(numbers)
    assert all(isinstance(b, LazyResult) for b in batches)
    assert [list(b) for b in batches] == [[0, 1], [2, 3], [4]]
    with count_driver_traffic() as traffic:
        scaled = [shard.times_scale(batch) for batch in numbers]  # batches go worker to worker
    assert scaled == [[0, 3], [6, 9], [12]]
    assert numbers.where()[0:2] == ("model", 0)
    assert traffic.sent < 1000


def test_a_component_passed_to_another_on_the_same_worker(groups):
    from ray_components import Head, Numbers

    numbers = Numbers(4, 3, remote_group="model")
    head = Head(numbers, remote_group="model")
    assert head.first_batch() == [0, 1, 2]


def test_only_remote_functions_can_be_called(shard):
    with pytest.raises(AttributeError, match=r"Shard.scale is not a @remote_function"):
        shard.scale  # noqa: B018


def test_device_placement_shows_groups_actors_nodes_and_devices(shard):
    shard.whoami()
    text = get_device_placement()
    assert "mode: ray" in text
    assert "Group 'model'" in text and "Group 'other'" in text
    assert "actor Shard#" in text and "on all ranks" in text
    pids = {str(s["pid"]) for s in shard.whoami()}
    assert all(pid in text for pid in pids)
    assert "devices" in text and "cpu" in text
