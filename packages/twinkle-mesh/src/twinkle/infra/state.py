"""What ``twinkle.initialize`` recorded for this process: the mode, groups and global mesh.

Kept apart from ``initialize`` so that readers (placement, logging, later the
Ray backend) depend on plain accessors, not on the start-up logic.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from twinkle.mesh import DeviceGroup, DeviceMesh

MODES = ("local", "ray", "http")


@dataclass
class _State:
    mode: str = "local"
    device_groups: list[DeviceGroup] = field(default_factory=list)
    global_device_mesh: DeviceMesh | None = None
    lazy_collect: bool = True
    worker_group: str | None = None


_state = _State()


def set_state(
    *,
    mode: str,
    device_groups: list[DeviceGroup],
    global_device_mesh: DeviceMesh | None,
    lazy_collect: bool,
    worker_group: str | None = None,
) -> None:
    """Replace the recorded state (called by ``initialize`` once its checks have passed, and
    by a Ray worker, which records the group it serves as ``worker_group``)."""
    global _state
    _state = _State(mode, list(device_groups), global_device_mesh, lazy_collect, worker_group)


def reset() -> None:
    """Forget everything ``initialize`` recorded (for tests; torch.distributed is left alone)."""
    global _state
    _state = _State()


def get_mode() -> str:
    """'local' until ``initialize`` says otherwise."""
    return _state.mode


def get_device_groups() -> list[DeviceGroup]:
    return list(_state.device_groups)


def get_global_device_mesh() -> DeviceMesh | None:
    """The mesh of this process's ranks; None before ``initialize``."""
    return _state.global_device_mesh


def get_worker_group() -> str | None:
    """The DeviceGroup this process is a Ray worker of; None in the driver and in local mode."""
    return _state.worker_group


def get_lazy_collect() -> bool:
    """The default for ``@remote_function(lazy_collect=None)``."""
    return _state.lazy_collect
