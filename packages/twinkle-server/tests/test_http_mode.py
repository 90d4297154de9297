"""HTTP mode, server side: ``twinkle.initialize('http')`` and what ``launch`` checks before it
deploys. The deployed service, driven by the Twinkle client, is tested in twinkle-kit
(tests/test_http_mode_e2e.py), whose environment has the client."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading

import pytest

import twinkle
from twinkle import DeviceGroup, DeviceMesh
from twinkle.infra import get_device_groups, get_mode, reset
from twinkle.server import launch
from twinkle.server.config import ServerConfig
from twinkle.server.serve import replica_config, with_recorded_groups

GROUPS = [
    {"name": "model", "ranks": 1, "device_type": "cpu"},
    {"name": "sampler", "ranks": 1, "device_type": "cpu"},
]


def test_http_mode_needs_the_groups_it_places_components_on():
    with pytest.raises(ValueError, match=r"mode: http places components.*\['model', 'sampler'\]"):
        ServerConfig.model_validate({"mode": "http"})
    assert ServerConfig.model_validate({"mode": "http", "device_groups": GROUPS}).mode == "http"


def test_the_groups_initialize_recorded_fill_the_config_and_others_are_refused():
    recorded = [DeviceGroup(**group) for group in GROUPS]
    data = with_recorded_groups({"port": 9000}, recorded)
    assert data["mode"] == "http" and [g["name"] for g in data["device_groups"]] == [
        "model",
        "sampler",
    ]
    assert with_recorded_groups({"device_groups": GROUPS}, recorded)["device_groups"] == GROUPS
    other = [{**GROUPS[0], "ranks": 2}, GROUPS[1]]
    with pytest.raises(ValueError, match="drop device_groups from the config or make them"):
        with_recorded_groups({"device_groups": other}, recorded)


def test_the_replica_gets_absolute_storage_and_builds_components_on_ray(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = ServerConfig.model_validate(
        {"mode": "http", "device_groups": GROUPS, "storage": {"home": "rel"}}
    )
    built = ServerConfig.model_validate(replica_config(config))
    assert built.mode == "ray" and built.ray_init_kwargs == {}
    assert built.storage.home == str(tmp_path / "rel")
    assert built.storage.database == str(tmp_path / "rel" / "state.db")


def test_launch_checks_the_config_before_joining_ray(tmp_path):
    bad = {"mode": "http", "device_groups": GROUPS, "allow": {"losses": ["NoSuchLoss"]}}
    with pytest.raises(ValueError, match="NoSuchLoss"):
        launch(ServerConfig.model_validate(bad))
    errors: list[BaseException] = []

    def in_a_thread() -> None:
        try:
            launch(ServerConfig.model_validate({"mode": "http", "device_groups": GROUPS}))
        except BaseException as exc:  # noqa: BLE001 - checked below
            errors.append(exc)

    thread = threading.Thread(target=in_a_thread)
    thread.start()
    thread.join(timeout=60)
    assert len(errors) == 1 and "call it from the main thread" in str(errors[0])
    assert get_mode() == "local"


def test_initialize_http_refuses_a_global_mesh_before_joining_ray():
    mesh = DeviceMesh.from_sizes(dp_size=2, device_type="cpu")
    groups = [DeviceGroup(**group) for group in GROUPS]
    with pytest.raises(ValueError, match="takes no global_device_mesh"):
        twinkle.initialize("http", groups=groups, global_device_mesh=mesh)
    assert get_mode() == "local"


@pytest.fixture
def ray_temp_dir():
    """Short: Ray's socket paths under it must fit in 107 bytes."""
    with tempfile.TemporaryDirectory(prefix="twr") as path:
        yield path


@pytest.fixture
def small_ray(ray_temp_dir):
    """A 2-CPU local Ray instance of this test's own."""
    import ray

    os.environ["RAY_AUTH_MODE"] = "disabled"
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _temp_dir=ray_temp_dir)
    yield ray
    reset()
    ray.shutdown()


def test_initialize_http_checks_the_groups_and_reserves_nothing(small_ray):
    too_big = [DeviceGroup(name="model", ranks=2, device_type="cpu"), DeviceGroup(**GROUPS[1])]
    with pytest.raises(
        ValueError, match=r"group 'sampler' needs 1 CPU .* after groups \['model'\]"
    ):
        twinkle.initialize("http", groups=too_big)
    assert get_mode() == "local"

    twinkle.initialize("http", groups=[DeviceGroup(**group) for group in GROUPS])
    assert get_mode() == "http" and [g.name for g in get_device_groups()] == ["model", "sampler"]
    # The ingress replica reserves the groups when it starts; until then they stay free.
    assert small_ray.available_resources()["CPU"] == 2
    assert small_ray.util.placement_group_table() == {}


def test_the_cli_refuses_a_group_larger_than_the_cluster(tmp_path, ray_temp_dir):
    config = tmp_path / "http.yaml"
    config.write_text(
        "mode: http\n"
        f"storage: {{home: '{tmp_path}'}}\n"
        "ray_init_kwargs: {num_cpus: 2, include_dashboard: false}\n"
        "device_groups: [{name: model, ranks: 8, device_type: cpu}, "
        "{name: sampler, ranks: 1, device_type: cpu}]\n"
    )
    env = {
        **os.environ,
        "RAY_AUTH_MODE": "disabled",
        "RAY_TMPDIR": ray_temp_dir,
        "PYTHONDONTWRITEBYTECODE": "",
        "OMP_NUM_THREADS": "1",
    }
    done = subprocess.run(
        [sys.executable, "-m", "twinkle.server", "launch", "-c", str(config)],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 2, done.stderr[-3000:]
    assert "group 'model' needs 8 CPU (8 worker(s) × 1), the cluster has 2 free" in done.stderr
