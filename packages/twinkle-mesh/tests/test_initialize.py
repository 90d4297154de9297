"""twinkle.initialize, the recorded state, the placement table, and the top-level package."""

import os
import random
import subprocess
import sys

import numpy as np
import pytest

import twinkle
from twinkle import DeviceGroup, DeviceMesh, get_device_placement
from twinkle.infra import (
    get_device_groups,
    get_global_device_mesh,
    get_lazy_collect,
    get_mode,
    reset,
)
from twinkle.infra.state import set_state

CPU_MESH = DeviceMesh.from_sizes(dp_size=1, device_type="cpu")


@pytest.fixture(autouse=True)
def single_process(monkeypatch):
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    reset()
    yield
    reset()


def test_nothing_is_recorded_before_initialize():
    assert get_mode() == "local"
    assert get_global_device_mesh() is None
    assert get_device_groups() == []
    assert get_lazy_collect() is True


def test_local_alone_records_the_mesh_and_starts_nothing():
    twinkle.initialize("local", global_device_mesh=CPU_MESH, lazy_collect=False)
    assert get_mode() == "local"
    assert get_global_device_mesh() is CPU_MESH
    assert get_lazy_collect() is False
    if "torch" in sys.modules:
        import torch.distributed as dist

        assert not dist.is_initialized()


def test_local_without_a_mesh_records_a_one_rank_data_parallel_mesh():
    twinkle.initialize()
    mesh = get_global_device_mesh()
    assert mesh.world_size == 1 and mesh.mesh_dim_names == ("dp",)


def test_a_mesh_larger_than_the_run_is_rejected_with_both_sizes():
    mesh = DeviceMesh.from_sizes(fsdp_size=4, dp_size=2, device_type="cpu")
    with pytest.raises(ValueError, match=r"world_size 8 \(dp=2 × fsdp=4\) but this run has 1"):
        twinkle.initialize("local", global_device_mesh=mesh)
    assert get_global_device_mesh() is None


def test_an_accelerator_mesh_without_the_accelerator_fails_before_starting(monkeypatch):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("needs a machine without CUDA")
    monkeypatch.setenv("WORLD_SIZE", "2")
    mesh = DeviceMesh.from_sizes(dp_size=2)  # device_type defaults to 'cuda'
    with pytest.raises(RuntimeError, match="no cuda device is available; build it with"):
        twinkle.initialize("local", global_device_mesh=mesh)
    assert not torch.distributed.is_initialized()


def test_seed_makes_random_numpy_and_torch_reproducible():
    torch = pytest.importorskip("torch")

    def draw(seed):
        twinkle.initialize(global_device_mesh=CPU_MESH, seed=seed)
        return random.random(), float(np.random.rand()), float(torch.rand(1))

    first, again, other = draw(1234), draw(1234), draw(4321)
    assert first == again
    assert all(a != b for a, b in zip(first, other, strict=True))


def test_http_refuses_unknown_options_before_joining_ray():
    # The Ray side of http mode is tested in twinkle-server's tests/test_http_mode.py.
    groups = [DeviceGroup(name="model", ranks=2, device_type="cpu")]
    with pytest.raises(TypeError, match=r"initialize\('http'\) got unexpected options \['port'\]"):
        twinkle.initialize("http", groups=groups, port=8000)
    assert get_mode() == "local" and get_device_groups() == []


def test_unknown_mode_lists_the_valid_ones():
    with pytest.raises(ValueError, match="'local', 'ray', 'http'"):
        twinkle.initialize("slurm")


@pytest.mark.parametrize("mode", ["local", "ray", "http"])
def test_groups_are_checked_in_every_mode(mode):
    same_name = [
        DeviceGroup(name="model", ranks=[0, 1], device_type="cuda"),
        DeviceGroup(name="model", ranks=[2, 3], device_type="cuda"),
    ]
    with pytest.raises(ValueError, match="names must be unique"):
        twinkle.initialize(mode, groups=same_name)
    overlapping = [
        DeviceGroup(name="model", ranks=[0, 1], device_type="cuda"),
        DeviceGroup(name="sampler", ranks=[1, 2], device_type="cuda"),
    ]
    with pytest.raises(ValueError, match="both claim cuda device 1"):
        twinkle.initialize(mode, groups=overlapping)
    with pytest.raises(TypeError, match="DeviceGroup objects"):
        twinkle.initialize(mode, groups=[{"name": "model"}])


def test_local_records_valid_groups():
    groups = [
        DeviceGroup(name="model", ranks=[0, 1], device_type="cuda"),
        DeviceGroup(name="sampler", ranks=[2, 3], device_type="cuda"),
    ]
    twinkle.initialize("local", groups=groups, global_device_mesh=CPU_MESH)
    assert [g.name for g in get_device_groups()] == ["model", "sampler"]


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"global_device_mesh": "dp=2"}, TypeError, "must be a DeviceMesh"),
        ({"lazy_collect": "yes"}, TypeError, "lazy_collect must be True or False"),
        ({"seed": -1}, ValueError, "seed must be an integer"),
        ({"nproc_per_node": 0}, ValueError, "nproc_per_node must be a positive integer"),
        ({"address": "auto"}, TypeError, r"unexpected options \['address'\]"),
    ],
)
def test_bad_arguments_are_rejected(kwargs, error, message):
    with pytest.raises(error, match=message):
        twinkle.initialize("local", **kwargs)


def test_nproc_per_node_must_match_the_launcher(monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    with pytest.raises(ValueError, match="nproc_per_node=8 but the launcher started 1"):
        twinkle.initialize("local", nproc_per_node=8, global_device_mesh=CPU_MESH)


def test_placement_works_before_initialize():
    text = get_device_placement()
    assert "This process: rank 0 of 1" in text
    assert "Global mesh: not set" in text
    assert "Device groups: none" in text


def test_placement_lists_groups_and_every_rank_of_the_mesh(monkeypatch):
    monkeypatch.setenv("RANK", "5")
    monkeypatch.setenv("WORLD_SIZE", "8")
    mesh = DeviceMesh.from_sizes(pp_size=2, dp_size=2, tp_size=2, device_type="cpu")
    groups = [
        DeviceGroup(name="model", ranks=[0, 1, 2, 3], device_type="cuda", gpus_per_worker=2),
        DeviceGroup(name="rollout", ranks=4, device_type="cpu"),
    ]
    set_state(mode="local", device_groups=groups, global_device_mesh=mesh, lazy_collect=True)
    lines = get_device_placement().splitlines()
    assert "This process: rank 5 of 8, device cpu" in lines
    rows = {line.split()[0]: line.split() for line in lines if line[:1].isdigit()}
    group_rows = {line.split()[0]: line for line in lines if line.startswith(("model", "rollout"))}
    assert group_rows["model"].split()[1:] == ["cuda", "[0,", "1,", "2,", "3]", "2", "2", "-"]
    assert group_rows["rollout"].split()[1:] == ["cpu", "any", "4", "4", "1", "-"]
    header = next(line for line in lines if line.startswith("rank"))
    assert header.split() == ["rank", "pp", "dp", "tp", "data_rank"]
    # rank 5 is pp stage 1, dp replica 0, tp shard 1, so it reads data slice 0
    assert rows["5*"] == ["5*", "1", "0", "1", "0"]
    assert rows["6"] == ["6", "1", "1", "0", "1"]
    assert len([r for r in rows if r.rstrip("*").isdigit()]) == 8


def test_import_twinkle_is_torch_free_and_exports_the_documented_names():
    code = (
        "import sys, twinkle\n"
        "from twinkle import DeviceGroup, DeviceMesh, Platform, initialize, remote_class, "
        "remote_function, get_logger, get_device_placement\n"
        "from twinkle.utils import DeviceMesh as D2, DeviceGroup, Platform, get_logger, Registry\n"
        "assert D2 is DeviceMesh\n"
        "assert 'torch' not in sys.modules and 'ray' not in sys.modules, 'heavy import'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_init_tinker_client_needs_no_twinkle_client(monkeypatch):
    monkeypatch.setitem(sys.modules, "twinkle_client", None)
    for name in ("TINKER_BASE_URL", "TINKER_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TWINKLE_SERVER_URL", "http://h:1/")
    monkeypatch.setenv("TWINKLE_SERVER_TOKEN", "tml-abc")
    from twinkle import init_tinker_client

    init_tinker_client()
    assert os.environ["TINKER_BASE_URL"] == "http://h:1"
    assert os.environ["TINKER_API_KEY"] == "tml-abc"


def test_unknown_attributes_are_attribute_errors():
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        twinkle.nothing_here  # noqa: B018
