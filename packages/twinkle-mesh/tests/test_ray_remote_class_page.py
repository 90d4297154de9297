"""The RemoteClass page's samples in Ray mode: MyComponent on a group named 'default', and
custom dispatch/collect functions that read the DeviceMesh they are given."""

import numpy as np
import pytest

import twinkle
from twinkle import DeviceGroup, DeviceMesh
from twinkle.infra import reset
from twinkle.infra.ray import runtime as ray_runtime


@pytest.fixture(scope="module")
def default_group(ray_cluster):
    device_groups = [DeviceGroup(name="default", ranks=2, device_type="cpu")]
    twinkle.initialize("ray", groups=device_groups)
    yield
    ray_runtime.shutdown()
    reset()


def test_my_component_is_built_and_called_in_a_worker(default_group):
    from ray_components import MyComponent

    _my_component = MyComponent(remote_group="default")
    result = _my_component.func([1, 2, 3], scale=2)
    assert result == {"args": ([1, 2, 3],), "kwargs": {"scale": 2}, "worker_group": "default"}


def test_custom_dispatch_and_collect_read_the_mesh_of_the_component(default_group):
    from ray_components import PageShard

    # An explicit rank array: worker 1 holds data rank 0, worker 0 data rank 1.
    mesh = DeviceMesh(mesh=np.array([[1], [0]]), mesh_dim_names=("dp", "tp"), device_type="cpu")
    shard = PageShard(mesh, remote_group="default")
    rows = shard.tag(["a", "b", "c"])
    assert [(item, rank) for item, _, rank in rows] == [("a", 1), ("b", 1), ("c", 0)]
    assert [seen for _, seen, _ in rows] == [
        {"data_rank": 0, "of": 2, "i": 1},
        {"data_rank": 0, "of": 2, "i": 1},
        {"data_rank": 1, "of": 2, "i": 0},
    ]
