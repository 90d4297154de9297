"""WorkerGroup: a DeviceGroup's placement group and its rank workers.

The placement group is reserved at ``twinkle.initialize`` (so a group the
cluster cannot hold fails there); the workers start when the first component
is built on the group, each in its own bundle, and join one torch.distributed
process group (gloo on CPU). A worker that dies takes the group down: its
process group cannot continue, so the others are stopped too and every later
call says so.
"""

from __future__ import annotations

import os

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from twinkle.infra.ray.env import WorkerInfo, worker_envs
from twinkle.infra.ray.errors import Failure, RemoteError
from twinkle.infra.ray.rank_worker import RankWorker
from twinkle.infra.ray.resources import bundle_of
from twinkle.mesh import DeviceGroup, DeviceMesh

PLACEMENT_TIMEOUT_S = 60.0
_RemoteRankWorker = ray.remote(max_restarts=0)(RankWorker)


class WorkerGroup:
    """The Ray side of one DeviceGroup."""

    def __init__(
        self,
        group: DeviceGroup,
        all_groups: list[DeviceGroup],
        mesh: DeviceMesh,
        lazy_collect: bool,
    ) -> None:
        self.group, self.all_groups, self.mesh, self.lazy_collect = (
            group,
            all_groups,
            mesh,
            lazy_collect,
        )
        self.bundle = bundle_of(group)
        self.placement_group = placement_group([self.bundle] * group.num_workers, strategy="PACK")
        try:
            ray.get(self.placement_group.ready(), timeout=PLACEMENT_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            remove_placement_group(self.placement_group)
            raise RuntimeError(
                f"Ray could not reserve group {group.name!r} ({group.num_workers} × "
                f"{self.bundle}) within {PLACEMENT_TIMEOUT_S:.0f} s; another job may hold the "
                "resources (ray status shows them)"
            ) from None
        self.workers: list = []
        self.actor_ids: list[str] = []
        self.infos: list[WorkerInfo] = []
        self.components: list[tuple[str, list[int]]] = []
        self.broken: str | None = None

    @property
    def name(self) -> str:
        return self.group.name

    def ensure_started(self) -> None:
        self.check_alive()
        if self.workers:
            return
        resource = {k: v for k, v in self.bundle.items() if k != "CPU"}
        workers = []
        for rank in range(self.group.num_workers):
            options = {
                "num_cpus": self.bundle["CPU"],
                "num_gpus": resource.get("GPU", 0),
                "resources": {k: v for k, v in resource.items() if k != "GPU"},
                "scheduling_strategy": PlacementGroupSchedulingStrategy(
                    self.placement_group, placement_group_bundle_index=rank
                ),
            }
            workers.append(
                _RemoteRankWorker.options(**options).remote(self.name, rank, self.group.device_type)
            )
        self.workers = workers
        self.actor_ids = [w._actor_id.hex() for w in workers]
        try:
            described = ray.get([w.describe.remote(rank == 0) for rank, w in enumerate(workers)])
            self.infos = [info for info, _ in described]
            envs = worker_envs(self.infos, self.group.device_type, described[0][1])
            setups = [
                w.setup.remote(env, self.all_groups, self.mesh, self.lazy_collect, os.getcwd())
                for w, env in zip(workers, envs, strict=True)
            ]
            failures = [f for f in ray.get(setups) if isinstance(f, Failure)]
        except ray.exceptions.RayError as exc:
            self.stop("its workers could not start")
            raise RemoteError(
                f"the workers of group {self.name!r} could not start: {exc}", group=self.name
            ) from exc
        if failures:
            self.stop(f"rank {failures[0].rank} could not start")
            raise failures[0].error(f"starting the workers of group {self.name!r}", self.name, None)

    def check_alive(self) -> None:
        if self.broken is not None:
            raise RemoteError(
                f"group {self.name!r} is stopped: {self.broken}; call twinkle.initialize(...) "
                "again to start new workers",
                group=self.name,
            )

    def stop(self, reason: str) -> None:
        """Kill the workers (also those stuck in a collective with a dead peer)."""
        self.broken = reason
        for worker in self.workers:
            ray.kill(worker, no_restart=True)

    def shutdown(self) -> None:
        if self.broken is None:
            self.stop("twinkle.initialize was called again")
        remove_placement_group(self.placement_group)
