"""The execution layer: run modes, ``@remote_class``/``@remote_function``, dispatch and collect."""

from twinkle.infra.collect import COLLECT_MODES, collect
from twinkle.infra.dispatch import DISPATCH_MODES, dispatch
from twinkle.infra.initialize import initialize
from twinkle.infra.placement import get_device_placement
from twinkle.infra.ray.errors import EarlierCallError, RemoteError
from twinkle.infra.remote import (
    EXECUTE_MODES,
    RemoteClassSpec,
    RemoteSpec,
    WirePolicy,
    remote_class,
    remote_function,
)
from twinkle.infra.state import (
    MODES,
    get_device_groups,
    get_global_device_mesh,
    get_lazy_collect,
    get_mode,
    get_worker_group,
    reset,
)

__all__ = [
    "COLLECT_MODES",
    "DISPATCH_MODES",
    "EXECUTE_MODES",
    "EarlierCallError",
    "MODES",
    "RemoteClassSpec",
    "RemoteError",
    "RemoteSpec",
    "WirePolicy",
    "collect",
    "dispatch",
    "get_device_groups",
    "get_device_placement",
    "get_global_device_mesh",
    "get_lazy_collect",
    "get_mode",
    "get_worker_group",
    "initialize",
    "remote_class",
    "remote_function",
    "reset",
]
