"""The driver's side of ray mode: the cluster connection, the groups, and lazy calls in flight.

``start`` attaches to the Ray instance this process already joined, or calls
``ray.init(address)``, which attaches to a running cluster (``ray start
--head``; the address comes from the argument, ``RAY_ADDRESS`` or the last
cluster started on this machine) and otherwise starts a local one. It checks
the groups against the cluster's free resources before reserving anything.
"""

from __future__ import annotations

import atexit
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

import ray

from twinkle.infra.ray import calls
from twinkle.infra.ray.calls import PendingCalls
from twinkle.infra.ray.errors import RemoteError
from twinkle.infra.ray.resources import check_groups_fit
from twinkle.infra.ray.worker_group import WorkerGroup
from twinkle.mesh import DeviceGroup, DeviceMesh
from twinkle.utils import get_logger

logger = get_logger(__name__)
_REMOVAL_WAIT_S = 10.0
_EXIT_WAIT_S = 30.0


class RayRuntime:
    """Groups by name, and the lazy calls whose errors are not yet seen."""

    def __init__(self, groups: dict[str, WorkerGroup]) -> None:
        self.groups = groups
        self.pending = PendingCalls()
        self.next_instance_id = 0

    def group(self, name: str) -> WorkerGroup:
        if name not in self.groups:
            known = ", ".join(map(repr, self.groups)) or "none"
            raise ValueError(
                f"remote_group={name!r} is not a DeviceGroup of twinkle.initialize (groups: "
                f"{known}); add DeviceGroup(name={name!r}, ...) to groups="
            )
        return self.groups[name]

    def on_dead_worker(self, group: str, rank: int, cause: str) -> None:
        if group in self.groups and self.groups[group].broken is None:
            self.groups[group].stop(f"worker rank {rank} died ({cause})")

    def shutdown(self) -> None:
        """Stop the workers and release the placement groups; return once Ray counts the
        released resources as free again, so a new ``initialize`` can check against them."""
        before = ray.available_resources()
        expected: dict[str, float] = {}
        for group in self.groups.values():
            for key, amount in group.bundle.items():
                expected.setdefault(key, before.get(key, 0.0))
                expected[key] += amount * group.group.num_workers
            group.shutdown()
        deadline = time.monotonic() + _REMOVAL_WAIT_S
        while time.monotonic() < deadline:
            free = ray.available_resources()
            if all(free.get(key, 0.0) >= amount for key, amount in expected.items()):
                return
            time.sleep(0.02)


_runtime: RayRuntime | None = None


def get_runtime() -> RayRuntime:
    if _runtime is None:
        raise RuntimeError("ray mode is not started: call twinkle.initialize('ray', groups=...)")
    return _runtime


def start(
    groups: Sequence[DeviceGroup],
    *,
    nproc_per_node: int | None,
    global_device_mesh: DeviceMesh | None,
    lazy_collect: bool,
    address: str | None = None,
    ray_init_kwargs: dict[str, Any] | None = None,
) -> None:
    """Connect (or start a local cluster), check the groups fit, reserve their placement groups."""
    global _runtime
    shutdown()
    if not ray.is_initialized():
        _join_ray(address, ray_init_kwargs or {})
    elif address is not None or ray_init_kwargs:
        logger.warning(
            "this process already joined a Ray cluster, so address and ray_init_kwargs are "
            "not used; call ray.shutdown() first to join another"
        )
    groups = list(groups)
    if not groups:
        raise ValueError(
            "ray mode needs at least one DeviceGroup for components to run on, e.g. "
            "groups=[DeviceGroup(name='model', ranks=2, device_type='cpu')]"
        )
    nodes = [node["Resources"] for node in ray.nodes() if node.get("Alive")]
    check_groups_fit(
        groups, ray.cluster_resources(), ray.available_resources(), nodes, nproc_per_node
    )
    built: dict[str, WorkerGroup] = {}
    try:
        for group in groups:
            built[group.name] = WorkerGroup(
                group, groups, _mesh_for(group, global_device_mesh), lazy_collect
            )
    except BaseException:
        for done in built.values():
            done.shutdown()
        raise
    _runtime = RayRuntime(built)
    calls.on_dead_worker = _runtime.on_dead_worker


def _join_ray(address: str | None, kwargs: dict[str, Any]) -> None:
    """``ray.init`` from a thread that lives as long as the cluster it may start.

    A local cluster's processes (GCS, raylet) are started with ``PR_SET_PDEATHSIG``, which
    Linux ties to the thread that forked them, not the process: started from a thread that
    then ends (the server's loader thread), they are killed at once; calls to existing
    actors still work, slowly, while Ray's driver threads spin on the dead GCS, and the
    process exits 60 s later. Off the main thread, ``ray.init`` therefore runs on a daemon
    thread that stays until Ray is shut down.
    """
    if threading.current_thread() is threading.main_thread():
        ray.init(address=address, **kwargs)
        return
    joined: Future = Future()

    def own_the_cluster() -> None:
        try:
            ray.init(address=address, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - raised in the caller's thread
            joined.set_exception(exc)
            return
        joined.set_result(None)
        while ray.is_initialized():
            time.sleep(1.0)

    threading.Thread(target=own_the_cluster, name="twinkle-ray-owner", daemon=True).start()
    joined.result()


def _mesh_for(group: DeviceGroup, global_mesh: DeviceMesh | None) -> DeviceMesh:
    """The global mesh when it spans exactly this group's workers, else dp over them."""
    if global_mesh is not None and global_mesh.world_size == group.num_workers:
        return global_mesh
    device_type = "cpu" if group.device_type == "mps" else group.device_type
    return DeviceMesh.from_sizes(dp_size=group.num_workers, device_type=device_type)


def shutdown() -> None:
    """Stop every group's workers and release its placement group (Ray itself keeps running)."""
    global _runtime
    if _runtime is None:
        return
    runtime, _runtime = _runtime, None
    calls.on_dead_worker = None
    try:
        runtime.pending.raise_earlier_failures()
    except RemoteError as exc:
        logger.error(f"a remote call failed and its result was never used: {exc}")
    finally:
        if ray.is_initialized():
            runtime.shutdown()


def describe(table) -> list[str]:
    """Lines for get_device_placement: each group's placement group, workers and components."""
    if _runtime is None:
        return []
    lines = [""]
    for group in _runtime.groups.values():
        pg = group.placement_group.id.hex()[:12]
        state = f"stopped: {group.broken}" if group.broken else "running"
        lines.append(f"Group {group.name!r}: placement group {pg}, bundle {group.bundle} ({state})")
        if not group.workers:
            lines.append("  workers: not started (the first component built on it starts them)")
            continue
        rows = [
            [str(rank), info.node_ip, info.node_id[:12], str(info.pid), _devices(info)]
            for rank, info in enumerate(group.infos)
        ]
        headers = ["rank", "node", "node id", "pid", "devices"]
        lines += ["  " + line for line in table(headers, rows)]
        for name, ranks in group.components:
            where = "all ranks" if len(ranks) == len(group.workers) > 1 else f"rank {ranks[0]}"
            lines.append(f"  actor {name} on {where}")
    return lines


def _devices(info) -> str:
    return ",".join(info.devices) or "cpu"


def _report_at_exit() -> None:
    """Errors of lazy calls whose results nobody read must not vanish with the driver."""
    if _runtime is None or not ray.is_initialized():
        return
    try:
        _runtime.pending.raise_earlier_failures(timeout=_EXIT_WAIT_S)
    except RemoteError as exc:
        logger.error(f"a remote call failed and its result was never used: {exc}")


atexit.register(_report_at_exit)
