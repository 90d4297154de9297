"""RemoteComponent: what ``Cls(..., remote_group='model')`` returns in the ray-mode driver.

The component itself lives on the group's workers (every rank for
``@remote_class(execute='all')``, rank 0 for ``'first'``). Calling one of its
``@remote_function`` methods dispatches the inputs over those workers with the
pure rules of ``dispatch.py``, runs the method, and collects the results with
``collect.py``: at once, or, with ``lazy_collect``, as a LazyResult left in the
object store. Inputs that hold lazy results (or other components) are sent as
references and dispatched on the workers, so their data never visits the driver.
``for batch in loader``, ``len(loader)``, ``dataset[i]`` and ``reward(trajectories)`` work
through the remote ``__iter__``/``__next__``/``__len__``/``__getitem__``/``__call__``: Python
looks dunders up on the type, never through ``__getattr__``, so each has its own proxy here.
A method that overrides a remote function without its own decorator inherits the spec.
"""

from __future__ import annotations

import functools
from typing import Any

import ray

from twinkle.infra.collect import collect
from twinkle.infra.dispatch import dispatch
from twinkle.infra.ray.calls import CallInfo, fetch
from twinkle.infra.ray.errors import CallSite
from twinkle.infra.ray.handles import SELF, ComponentRef, RemoteHandle, holds_remote_values
from twinkle.infra.ray.lazy import LazyResult
from twinkle.infra.ray.runtime import get_runtime
from twinkle.infra.ray.traffic import record_received, record_sent
from twinkle.infra.remote import RemoteSpec, find_remote_spec
from twinkle.infra.state import get_lazy_collect
from twinkle.mesh import DeviceMesh

_EAGER = ("__len__", "__iter__")  # Python needs their values now
_STATUS_EAGER = ("__next__",)  # the driver must know about StopIteration; the batch may wait


class RemoteComponent(RemoteHandle):
    """A driver-side handle on a component built on a DeviceGroup's workers."""

    def __init__(self, cls: type, group: Any, instance_id: int, ranks: list[int], mesh: Any):
        object.__setattr__(self, "_twinkle", (cls, group, instance_id, ranks, mesh))

    # ---- construction ----------------------------------------------------------------------

    @staticmethod
    def build(cls: type, args: tuple, kwargs: dict, group_name: str) -> RemoteComponent:
        site = CallSite.here()
        runtime = get_runtime()
        runtime.pending.raise_earlier_failures(before=(f"{cls.__name__}(...)", site))
        group = runtime.group(group_name)
        group.ensure_started()
        execute = cls.__twinkle_remote_class__.execute
        ranks = list(range(len(group.workers))) if execute == "all" else [0]
        instance_id = runtime.next_instance_id
        runtime.next_instance_id += 1
        record_sent((args, kwargs))
        refs = [group.workers[r].construct.remote(instance_id, cls, args, kwargs) for r in ranks]
        info = CallInfo(f"{cls.__name__}(...)", group.name, site, _ids(group, ranks))
        meshes = fetch(refs, ranks, info)
        mesh = meshes[0]
        if mesh is None or mesh.world_size != len(ranks):
            mesh = group.mesh if len(ranks) == group.mesh.world_size else _dp(len(ranks), mesh)
        group.components.append((f"{cls.__name__}#{instance_id}", ranks))
        return RemoteComponent(cls, group, instance_id, ranks, mesh)

    # ---- calls -----------------------------------------------------------------------------

    def __getattr__(self, name: str) -> Any:
        cls = self._twinkle[0]
        spec = find_remote_spec(cls, name)
        if spec is None:
            raise AttributeError(
                f"{cls.__name__}.{name} is not a @remote_function, so it cannot be used on a "
                f"component that lives on group {self._twinkle[1].name!r}; only remote "
                "functions run on its workers"
            )
        caller = functools.partial(self._call, name, spec)
        object.__setattr__(self, name, caller)  # later calls skip this lookup
        return caller

    def _call(self, name: str, spec: RemoteSpec, *args: Any, **kwargs: Any) -> Any:
        site = CallSite.here()
        cls, group, instance_id, ranks, mesh = self._twinkle
        runtime = get_runtime()
        runtime.pending.raise_earlier_failures(before=(f"{cls.__name__}.{name}", site))
        group.check_alive()
        if spec.execute == "first":
            ranks = ranks[:1]
        workers = [group.workers[r] for r in ranks]
        count = len(workers)
        call_mesh = mesh if mesh.world_size == count else None
        record_sent((args, kwargs))
        if holds_remote_values((args, kwargs)):
            # The data is in the object store: each worker fetches it and takes its share.
            payload = [(args, kwargs, (spec.dispatch, count, i, call_mesh)) for i in range(count)]
        else:
            payload = [
                (*dispatch(spec.dispatch, count, i, args, kwargs, call_mesh), None)
                for i in range(count)
            ]
        info = CallInfo(f"{cls.__name__}.{name}", group.name, site, _ids(group, ranks))
        lazy = spec.lazy_collect if spec.lazy_collect is not None else get_lazy_collect()
        if name in _EAGER or not lazy:
            refs = [
                w.call.remote((instance_id, name, a, k, plan))
                for w, (a, k, plan) in zip(workers, payload, strict=True)
            ]
            values = fetch(refs, ranks, info)
            record_received(values)
            return self._collected(spec, values, call_mesh)
        pairs = [
            w.call_lazy.options(num_returns=2).remote((instance_id, name, a, k, plan))
            for w, (a, k, plan) in zip(workers, payload, strict=True)
        ]
        statuses, refs = [p[0] for p in pairs], [p[1] for p in pairs]
        if spec.sync or name in _STATUS_EAGER:
            fetch(statuses, ranks, info)
        else:
            runtime.pending.add(statuses, ranks, info)
        if spec.collect == "first":
            refs, ranks = refs[:1], ranks[:1]
        return LazyResult(refs, ranks, spec.collect, call_mesh, info, runtime.pending)

    def _collected(self, spec: RemoteSpec, values: list, mesh: DeviceMesh | None) -> Any:
        result = collect(spec.collect, values, mesh)
        return self if isinstance(result, str) and result == SELF else result

    # ---- the iterator protocol and identity --------------------------------------------------

    def __iter__(self) -> Any:
        return self._dunder("__iter__")

    def __next__(self) -> Any:
        return self._dunder("__next__")

    def __len__(self) -> int:
        return self._dunder("__len__")

    def __getitem__(self, key: Any) -> Any:
        return self._dunder("__getitem__", key)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._dunder("__call__", *args, **kwargs)

    def __bool__(self) -> bool:
        """True, as for any object, unless the component has a remote ``__len__``: then
        ``len(...) > 0``. (Without this, ``if component:`` would call the ``__len__`` proxy.)"""
        if find_remote_spec(self._twinkle[0], "__len__") is None:
            return True
        return len(self) > 0

    def _dunder(self, name: str, *args: Any, **kwargs: Any) -> Any:
        cls = self._twinkle[0]
        spec = find_remote_spec(cls, name)
        if spec is None:
            raise TypeError(
                f"{cls.__name__}.{name} is not a @remote_function, so it cannot run on the "
                f"workers of group {self._twinkle[1].name!r}"
            )
        return self._call(name, spec, *args, **kwargs)

    @property
    def remote_group(self) -> str:
        """The DeviceGroup the component lives on (as ``self.remote_group`` on the workers)."""
        return self._twinkle[1].name

    def __del__(self) -> None:
        """Let the workers drop the component when the driver no longer holds it."""
        try:
            cls, group, instance_id, ranks, _ = self._twinkle
            name = f"{cls.__name__}#{instance_id}"
            group.components = [entry for entry in group.components if entry[0] != name]
            if group.broken is None and ray.is_initialized():
                for rank in ranks:
                    group.workers[rank].drop.remote(instance_id)
        except Exception:  # interpreter shutdown: nothing left to free
            pass

    def __repr__(self) -> str:
        cls, group, instance_id, ranks, _ = self._twinkle
        return f"<{cls.__name__}#{instance_id} on group {group.name!r}, ranks {ranks}>"

    def __reduce__(self):
        cls, group, instance_id, _, _ = self._twinkle
        return ComponentRef, (group.name, instance_id, f"{cls.__name__}#{instance_id}")


def _ids(group: Any, ranks: list[int]) -> list[str]:
    return [group.actor_ids[r] for r in ranks]


def _dp(workers: int, mesh: DeviceMesh | None) -> DeviceMesh:
    device_type = mesh.device_type if mesh is not None else "cpu"
    return DeviceMesh.from_sizes(dp_size=workers, device_type=device_type)


def wait_for(*results: LazyResult) -> list[Any]:
    """Wait for lazy calls and return their values, raising a failure here, once, rather than
    again at the next call: how to finish calls that must run at the same time on different
    groups (both ends of a transfer), started lazily and then awaited together."""
    refs = [ref for result in results for ref in result.refs]
    ray.wait(refs, num_returns=len(refs), fetch_local=False)
    get_runtime().pending.raise_earlier_failures()
    return [result.resolve() for result in results]


def build_remote(cls: type, args: tuple, kwargs: dict, group_name: str) -> RemoteComponent:
    """Build ``cls(*args, **kwargs)`` on group ``group_name``; the hook ``remote_class`` calls."""
    return RemoteComponent.build(cls, args, kwargs, group_name)
