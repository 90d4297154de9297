"""initialize('ray'): groups checked against the cluster's resources, placement groups
reserved and released, and the environment each worker starts torch.distributed with."""

import pytest

import twinkle
from twinkle import DeviceGroup, get_device_placement
from twinkle.infra import get_mode, reset
from twinkle.infra.ray import runtime as ray_runtime
from twinkle.infra.ray.env import WorkerInfo, worker_envs
from twinkle.infra.ray.resources import check_groups_fit


@pytest.fixture
def fresh(ray_cluster):
    ray_runtime.shutdown()
    reset()
    yield ray_cluster
    ray_runtime.shutdown()
    reset()


def cpu(name, ranks):
    return DeviceGroup(name=name, ranks=ranks, device_type="cpu")


def test_a_group_beyond_the_cluster_fails_at_initialize(fresh):
    with pytest.raises(ValueError, match=r"group 'big' needs 64 CPU .* the cluster has 8 free"):
        twinkle.initialize("ray", groups=[cpu("big", 64)])
    assert get_mode() == "local"


def test_device_ranks_beyond_the_cluster_fail_at_initialize(fresh):
    gpu = DeviceGroup(name="model", ranks=[0, 1], device_type="GPU")
    with pytest.raises(ValueError, match=r"lists device rank 1, but the cluster has 0 GPU"):
        twinkle.initialize("ray", groups=[gpu], nproc_per_node=2)


def test_a_second_group_sees_what_the_first_left(fresh):
    groups = [cpu("model", 6), cpu("sampler", 4)]
    with pytest.raises(
        ValueError, match=r"'sampler' needs 4 CPU.*has 2 free after groups \['model'"
    ):
        twinkle.initialize("ray", groups=groups)


def test_a_duplicate_group_name_fails_at_initialize(fresh):
    with pytest.raises(ValueError, match=r"names must be unique; repeated: \['model'\]"):
        twinkle.initialize("ray", groups=[cpu("model", 1), cpu("model", 1)])


def test_ray_mode_needs_a_group_and_known_options(fresh):
    with pytest.raises(ValueError, match="at least one DeviceGroup"):
        twinkle.initialize("ray")
    with pytest.raises(TypeError, match=r"unexpected options \['num_cpus'\]"):
        twinkle.initialize("ray", groups=[cpu("model", 1)], num_cpus=2)


def test_visible_devices_is_refused_with_the_ray_way_to_do_it(fresh):
    group = DeviceGroup(name="model", ranks=[0], device_type="cuda", visible_devices="1")
    with pytest.raises(ValueError, match="CUDA_VISIBLE_DEVICES=8,9 ray start"):
        twinkle.initialize("ray", groups=[group])


def test_placement_groups_are_reserved_and_released_on_reinitialize(fresh):
    ray = fresh
    for _ in range(2):  # the second run fits only if the first released all 8 CPUs
        twinkle.initialize("ray", groups=[cpu("model", 8)])
        assert get_mode() == "ray"
        assert ray.available_resources().get("CPU", 0) == 0
    text = get_device_placement()
    assert "Group 'model'" in text and "not started" in text
    ray_runtime.shutdown()
    assert ray.available_resources()["CPU"] == 8


def test_unknown_remote_group_lists_the_groups(fresh):
    from ray_components import Numbers

    twinkle.initialize("ray", groups=[cpu("model", 1)])
    with pytest.raises(ValueError, match=r"remote_group='samplr' is not a DeviceGroup.*'model'"):
        Numbers(3, 1, remote_group="samplr")


def test_a_worker_of_gpus_per_worker_needs_one_node_with_them():
    group = DeviceGroup(name="sampler", ranks=[0, 1], device_type="cuda", gpus_per_worker=2)
    nodes = [{"GPU": 1.0, "CPU": 4.0}, {"GPU": 1.0, "CPU": 4.0}]
    total = {"GPU": 2.0, "CPU": 8.0}
    with pytest.raises(ValueError, match=r"needs 2 GPU, 1 CPU on one node.*largest offers 1 GPU"):
        check_groups_fit([group], total, total, nodes, None)


def test_worker_envs_make_local_ranks_and_device_indices_agree():
    infos = [
        WorkerInfo("node-a", "10.0.0.1", 11, ("3",)),
        WorkerInfo("node-b", "10.0.0.2", 12, ("0",)),
        WorkerInfo("node-a", "10.0.0.1", 13, ("1",)),
    ]
    envs = worker_envs(infos, "cuda", 29500)
    assert [e["RANK"] for e in envs] == ["0", "1", "2"]
    assert {e["WORLD_SIZE"] for e in envs} == {"3"}
    assert [e["LOCAL_RANK"] for e in envs] == ["0", "0", "1"]
    assert [e["LOCAL_WORLD_SIZE"] for e in envs] == ["2", "1", "2"]
    assert {(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in envs} == {("10.0.0.1", "29500")}
    # ranks 0 and 2 share node a: both see "3,1", and device LOCAL_RANK is each one's own
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["3,1", "0", "3,1"]
    assert "CUDA_VISIBLE_DEVICES" not in worker_envs(infos[:1], "cpu", 1)[0]
