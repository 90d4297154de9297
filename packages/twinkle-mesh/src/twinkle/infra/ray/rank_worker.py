"""RankWorker: the Ray actor behind one rank of a DeviceGroup.

One worker process per rank of a group hosts every component built on that
group (a model on all ranks, its DataLoader on rank 0, ...), so components of
one group share the rank's devices and its torch.distributed group, as
processes launched by torchrun would. Construction and calls never raise out
of the actor: an exception comes back as a :class:`Failure` value carrying the
rank and the traceback, and the caller reports it with its own call site.
"""

from __future__ import annotations

import importlib.util
import os
import socket
from datetime import timedelta
from typing import Any

import ray

from twinkle.infra.dispatch import dispatch
from twinkle.infra.ray.env import WorkerInfo, accelerator_ids
from twinkle.infra.ray.errors import Failure
from twinkle.infra.ray.handles import SELF
from twinkle.infra.ray.lazy import resolve_inputs
from twinkle.infra.state import set_state
from twinkle.mesh import DeviceGroup, DeviceMesh, Platform

DIST_TIMEOUT = timedelta(minutes=30)


class RankWorker:
    """Rank ``rank`` of group ``group_name``: builds components and runs their methods."""

    def __init__(self, group_name: str, rank: int, device_type: str) -> None:
        self.group_name, self.rank, self.device_type = group_name, rank, device_type
        self.instances: dict[int, Any] = {}

    def describe(self, want_port: bool) -> tuple[WorkerInfo, int | None]:
        """Where Ray put this worker; with ``want_port``, a free port for the master."""
        context = ray.get_runtime_context()
        info = WorkerInfo(
            node_id=context.get_node_id(),
            node_ip=ray.util.get_node_ip_address(),
            pid=os.getpid(),
            devices=accelerator_ids(context.get_accelerator_ids(), self.device_type),
        )
        port = None
        if want_port:
            with socket.socket() as s:
                s.bind(("", 0))
                port = s.getsockname()[1]
        return info, port

    def setup(
        self,
        env: dict[str, str],
        groups: list[DeviceGroup],
        mesh: DeviceMesh,
        lazy_collect: bool,
        driver_cwd: str,
    ) -> Failure | None:
        """Take the rank's environment, record ray mode, and join the group's process group.

        The worker moves to the driver's working directory when its node has it, so that a
        relative path (``model.save('last-checkpoint')``) means what it means in the script.
        """
        try:
            if os.path.isdir(driver_cwd):
                os.chdir(driver_cwd)
            os.environ.update(env)
            set_state(
                mode="ray",
                device_groups=groups,
                global_device_mesh=mesh,
                lazy_collect=lazy_collect,
                worker_group=self.group_name,
            )
            if importlib.util.find_spec("torch") is not None:
                self._init_process_group()
        except Exception as exc:
            return Failure.capture(self.rank, exc)
        return None

    def _init_process_group(self) -> None:
        import torch
        import torch.distributed as dist

        if self.device_type in ("cuda", "npu"):
            # NOTE: pick the device before the process group exists, so NCCL/HCCL bind here.
            getattr(torch, self.device_type).set_device(Platform.get_local_rank())
        backend = Platform.dist_backend(self.device_type)
        dist.init_process_group(backend=backend, timeout=DIST_TIMEOUT)

    def _lookup(self, ref: Any) -> Any:
        instance = self.instances.get(ref.instance_id)
        if instance is None or ref.group != self.group_name:
            raise ValueError(
                f"a remote component ({ref.describe}) was passed to a component that does not "
                f"live in the same worker (group {self.group_name!r}, rank {self.rank}); pass a "
                "factory that builds it instead (e.g. DataLoader(dataset=make_dataset))"
            )
        return instance

    def construct(self, instance_id: int, cls: type, args: tuple, kwargs: dict) -> Any:
        """Build ``cls`` here; returns its device_mesh (for dispatch), or a Failure."""
        try:
            args, kwargs = resolve_inputs((args, kwargs), self._lookup)
            instance = cls(*args, remote_group=self.group_name, **kwargs)
        except Exception as exc:
            return Failure.capture(self.rank, exc)
        self.instances[instance_id] = instance
        mesh = getattr(instance, "device_mesh", None)
        return mesh if isinstance(mesh, DeviceMesh) else None

    def call(self, request: tuple) -> Any:
        """Run one method call: ``request`` is (instance id, method, args, kwargs, plan), one
        argument so that Ray serializes it once; with a ``plan`` (mode, workers, index, mesh)
        the inputs are dispatched here first."""
        instance_id, method, args, kwargs, plan = request
        try:
            instance = self.instances[instance_id]
            args, kwargs = resolve_inputs((args, kwargs), self._lookup)
            if plan is not None:
                mode, num_workers, index, mesh = plan
                args, kwargs = dispatch(mode, num_workers, index, args, kwargs, mesh)
            result = getattr(instance, method)(*args, **kwargs)
        except BaseException as exc:  # StopIteration and KeyboardInterrupt included
            return Failure.capture(self.rank, exc)
        return SELF if result is instance else result

    def call_lazy(self, request: tuple) -> tuple[Failure | None, Any]:
        """``call`` with two returns: a small status the driver may fetch, and the value."""
        value = self.call(request)
        return (value if isinstance(value, Failure) else None), value

    def drop(self, instance_id: int) -> None:
        self.instances.pop(instance_id, None)
