"""Platform: the current process's rank, world size and device facts."""

from __future__ import annotations

import subprocess
import sys

import pytest

from twinkle.mesh import Platform
from twinkle.mesh.platform import DEVICE_TYPES, normalize_device_type


@pytest.fixture
def clean_env(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


# ---- rank, world size, local rank ----------------------------------------------------------


def test_defaults_without_env(clean_env):
    assert Platform.get_rank() == 0
    assert Platform.get_world_size() == 1
    assert Platform.get_local_rank() == 0
    assert Platform.is_distributed_launch() is False


def test_values_from_env(clean_env):
    clean_env.setenv("RANK", "5")
    clean_env.setenv("WORLD_SIZE", "8")
    clean_env.setenv("LOCAL_RANK", "1")
    assert Platform.get_rank() == 5
    assert Platform.get_world_size() == 8
    assert Platform.get_local_rank() == 1
    assert Platform.is_distributed_launch() is True


def test_empty_env_values_mean_default(clean_env):
    clean_env.setenv("RANK", "")
    clean_env.setenv("WORLD_SIZE", "")
    clean_env.setenv("LOCAL_RANK", "")
    assert (Platform.get_rank(), Platform.get_world_size(), Platform.get_local_rank()) == (0, 1, 0)


def test_world_size_one_is_not_a_distributed_launch(clean_env):
    clean_env.setenv("WORLD_SIZE", "1")
    assert Platform.is_distributed_launch() is False
    clean_env.setenv("WORLD_SIZE", "2")
    assert Platform.is_distributed_launch() is True


@pytest.mark.parametrize(
    ("name", "getter"),
    [
        ("RANK", Platform.get_rank),
        ("WORLD_SIZE", Platform.get_world_size),
        ("LOCAL_RANK", Platform.get_local_rank),
        ("WORLD_SIZE", Platform.is_distributed_launch),
    ],
)
def test_non_integer_env_names_the_variable(clean_env, name, getter):
    clean_env.setenv(name, "three")
    with pytest.raises(ValueError, match=rf"{name}='three'.*not an integer"):
        getter()


# ---- device types --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("cuda", "cuda"),
        ("CUDA", "cuda"),
        ("GPU", "cuda"),
        ("gpu", "cuda"),
        ("Gpu", "cuda"),
        ("npu", "npu"),
        ("NPU", "npu"),
        ("mps", "mps"),
        ("CPU", "cpu"),
        ("cpu", "cpu"),
    ],
)
def test_normalize_device_type(given, expected):
    assert normalize_device_type(given) == expected


@pytest.mark.parametrize("bad", ["tpu", "", "cuda:0", "xpu", "gpus"])
def test_normalize_unknown_device_type(bad):
    with pytest.raises(ValueError, match="unknown device_type") as info:
        normalize_device_type(bad)
    # The message lists the accepted names so the user can fix the call.
    for name in DEVICE_TYPES:
        assert name in str(info.value)


@pytest.mark.parametrize("bad", [None, 0, b"cuda", ["cuda"]])
def test_normalize_non_string_device_type(bad):
    with pytest.raises(TypeError, match="device_type must be a string"):
        normalize_device_type(bad)


@pytest.mark.parametrize(
    ("device_type", "backend"),
    [("cuda", "nccl"), ("GPU", "nccl"), ("npu", "hccl"), ("mps", "gloo"), ("cpu", "gloo")],
)
def test_dist_backend(device_type, backend):
    assert Platform.dist_backend(device_type) == backend


def test_dist_backend_unknown_device():
    with pytest.raises(ValueError, match="unknown device_type"):
        Platform.dist_backend("tpu")


@pytest.mark.parametrize(
    ("device_type", "env"),
    [
        ("cuda", "CUDA_VISIBLE_DEVICES"),
        ("gpu", "CUDA_VISIBLE_DEVICES"),
        ("npu", "ASCEND_RT_VISIBLE_DEVICES"),
        ("mps", None),
        ("cpu", None),
    ],
)
def test_visible_devices_env(device_type, env):
    assert Platform.visible_devices_env(device_type) == env


def test_visible_devices_env_unknown_device():
    with pytest.raises(ValueError, match="unknown device_type"):
        Platform.visible_devices_env("tpu")


def test_detect_device_type_is_cpu_here():
    # This machine has no accelerator (and torch is installed in the venv).
    detected = Platform.detect_device_type()
    assert detected in DEVICE_TYPES
    assert detected == "cpu"


def test_detect_device_type_without_torch(monkeypatch):
    import importlib.util

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a, **k: None if name == "torch" else real_find_spec(name, *a, **k),
    )
    assert Platform.detect_device_type() == "cpu"


# ---- import hygiene ------------------------------------------------------------------------


def test_import_twinkle_mesh_does_not_import_torch():
    code = (
        "import sys\n"
        "import twinkle.mesh\n"
        "from twinkle.mesh import DeviceMesh, DeviceGroup, Platform\n"
        "m = DeviceMesh.from_sizes(dp_size=2, tp_size=2)\n"
        "assert m.coords(3) == {'dp': 1, 'tp': 1}\n"
        "DeviceGroup(name='g', ranks=[0, 1], device_type='GPU')\n"
        "Platform.get_rank()\n"
        "print('torch' in sys.modules)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"
