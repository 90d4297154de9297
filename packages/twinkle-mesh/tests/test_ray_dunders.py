"""Dunder methods of remote components: Python looks them up on the type, so RemoteComponent
proxies each one (``__call__``, ``__getitem__``, ``__len__``, ``__bool__``), and a method that
overrides a remote function without its own decorator keeps the overridden one's spec."""

import pytest

import twinkle
from twinkle import DeviceGroup
from twinkle.infra import reset
from twinkle.infra.ray import runtime as ray_runtime
from twinkle.infra.remote import find_remote_spec


@pytest.fixture(scope="module")
def groups(ray_cluster):
    twinkle.initialize("ray", groups=[DeviceGroup(name="model", ranks=2, device_type="cpu")])
    yield
    ray_runtime.shutdown()
    reset()


def test_a_remote_getitem_len_and_call(groups):
    from ray_dunders import Table

    table = Table(["a", "b", "c"], remote_group="model")
    assert table[1] == "b" and len(table) == 3 and bool(table) is True
    assert table(["x", "y"]) == [("x", "base"), ("y", "base")]
    assert bool(Table([], remote_group="model")) is False  # len() == 0, as in Python


def test_a_component_without_len_is_true(groups):
    from ray_components import Shard

    assert bool(Shard(remote_group="model")) is True  # not a call of a missing __len__


def test_an_override_without_a_decorator_inherits_the_spec(groups):
    from ray_dunders import SpreadTable, Table, UpperTable

    assert find_remote_spec(UpperTable, "__call__") is Table.__call__.__twinkle_remote__
    upper = UpperTable(["a", "b"], remote_group="model")
    assert upper[0] == "A"  # the subclass's code, run on the worker
    assert upper([1, 2]) == [(1, "sub", 0), (2, "sub", 0)]  # execute='first': rank 0 only
    spread = SpreadTable(["a"], remote_group="model")
    assert spread([1, 2, 3]) == [(1, "sub", 0), (2, "sub", 0), (3, "sub", 1)]  # sliced


def test_a_dunder_that_is_not_remote_is_a_clear_type_error(groups):
    from ray_components import Shard

    shard = Shard(remote_group="model")
    with pytest.raises(TypeError, match=r"Shard.__getitem__ is not a @remote_function"):
        shard[0]  # noqa: B018
    assert find_remote_spec(Shard, "__getitem__") is None
