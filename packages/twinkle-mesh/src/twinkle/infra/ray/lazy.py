"""Results of remote calls: fetched at once, or left in Ray's object store as a LazyResult.

A LazyResult holds the object refs of the workers' results and the collect
rule. Passed to another remote call it travels as those refs, and the worker
that receives it fetches the data from the object store itself: the data never
passes through the driver. Used in the driver (printed, indexed, iterated,
compared, its attributes read), it fetches and collects once, then behaves like
its value.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import ray
from ray.exceptions import RayActorError, RayError

from twinkle.infra.collect import Collector, collect
from twinkle.infra.ray_errors import Before, CallSite, Failure, RemoteError, dead_worker_error
from twinkle.infra.ray_traffic import record_received
from twinkle.infra.state import get_worker_group
from twinkle.mesh import DeviceMesh

SELF = "__twinkle_self__"
"""What a worker returns when a method returned its own component (``__iter__``)."""

_UNSET = object()
_PLAIN = frozenset({int, float, str, bytes, bool, type(None)})
# Set by the driver's runtime: called with (group, rank, cause) when a worker has died.
on_dead_worker: Callable[[str, int, str], None] | None = None


class CallInfo:
    """Which call produced a result: for error messages (component.method, group, driver line)."""

    __slots__ = ("what", "group", "site", "actor_ids")

    def __init__(self, what: str, group: str, site: CallSite | None, actor_ids: Sequence[str]):
        self.what, self.group, self.site, self.actor_ids = what, group, site, list(actor_ids)

    def __reduce__(self):
        return CallInfo, (self.what, self.group, self.site, self.actor_ids)


def fetch(refs: list, ranks: Sequence[int], info: CallInfo, before: Before | None = None) -> list:
    """``ray.get`` the workers' results; a Failure or a dead worker becomes the caller's error
    (``before``: the later call it is reported at, for a lazy call's failure).

    ``ray.get`` returns as soon as one result is an error, so a worker that dies while
    its peers wait in a collective fails the call at once instead of hanging it.
    """
    try:
        values = ray.get(refs)
    except RayActorError as exc:
        raise _dead(exc, ranks, info) from None
    except RayError as exc:
        raise RemoteError(
            f"{info.what} on group {info.group!r} (called at {info.site}) failed in Ray: {exc}",
            group=info.group,
        ) from exc
    for value in values:
        if isinstance(value, Failure):
            raise value.error(info.what, info.group, info.site, before)
    return values


def _dead(exc: RayActorError, ranks: Sequence[int], info: CallInfo) -> RemoteError:
    actor_id = getattr(exc, "actor_id", None)
    rank = ranks[0]
    for index, candidate in enumerate(info.actor_ids):
        if candidate == actor_id:
            rank = ranks[index]
    cause = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if on_dead_worker is not None and get_worker_group() is None:
        on_dead_worker(info.group, rank, cause)
    return dead_worker_error(info.what, info.group, rank, info.site, cause)


class LazyResult:
    """The result of a remote call with ``lazy_collect``: object refs plus the collect rule."""

    def __init__(
        self,
        refs: list,
        ranks: Sequence[int],
        mode: str | Collector,
        mesh: DeviceMesh | None,
        info: CallInfo,
    ) -> None:
        self.refs, self.ranks, self.mode, self.mesh, self.info = refs, list(ranks), mode, mesh, info
        self._value: Any = _UNSET

    def resolve(self) -> Any:
        """Fetch the workers' results (once) and collect them into the call's return value."""
        if self._value is _UNSET:
            try:
                values = fetch(self.refs, self.ranks, self.info)
            except BaseException:
                if get_worker_group() is None:  # the driver: this failure is now reported
                    from twinkle.infra import ray_runtime

                    if ray_runtime._runtime is not None:
                        ray_runtime._runtime.forget(self.info)
                raise
            if get_worker_group() is None:
                record_received(values)
            self._value = collect(self.mode, values, self.mesh)
        return self._value

    def __getstate__(self) -> dict:
        return {
            "refs": self.refs,
            "ranks": self.ranks,
            "mode": self.mode,
            "mesh": self.mesh,
            "info": self.info,
        }

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._value = _UNSET

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("refs", "ranks", "mode", "mesh", "info", "_value"):
            raise AttributeError(name)
        return getattr(self.resolve(), name)

    def __repr__(self) -> str:
        return repr(self.resolve())

    def __str__(self) -> str:
        return str(self.resolve())

    def __format__(self, spec: str) -> str:
        return format(self.resolve(), spec)

    def __iter__(self):
        return iter(self.resolve())

    def __len__(self) -> int:
        return len(self.resolve())

    def __getitem__(self, key: Any) -> Any:
        return self.resolve()[key]

    def __contains__(self, item: Any) -> bool:
        return item in self.resolve()

    def __bool__(self) -> bool:
        return bool(self.resolve())

    def __float__(self) -> float:
        return float(self.resolve())

    def __int__(self) -> int:
        return int(self.resolve())

    def __eq__(self, other: object) -> bool:
        return self.resolve() == other

    __hash__ = None

    def __lt__(self, other: Any) -> bool:
        return self.resolve() < other

    def __le__(self, other: Any) -> bool:
        return self.resolve() <= other

    def __gt__(self, other: Any) -> bool:
        return self.resolve() > other

    def __ge__(self, other: Any) -> bool:
        return self.resolve() >= other

    def __add__(self, other: Any) -> Any:
        return self.resolve() + other

    def __radd__(self, other: Any) -> Any:
        return other + self.resolve()

    def __sub__(self, other: Any) -> Any:
        return self.resolve() - other

    def __mul__(self, other: Any) -> Any:
        return self.resolve() * other

    def __truediv__(self, other: Any) -> Any:
        return self.resolve() / other


def resolve_inputs(value: Any, lookup: Callable[[Any], Any] | None = None) -> Any:
    """``value`` with every LazyResult inside lists, tuples and dicts replaced by its value,
    and, given ``lookup``, every component reference by what ``lookup`` returns for it.
    A value that holds neither comes back as it is, without a copy."""
    from twinkle.infra.ray_component import ComponentRef

    if not holds_remote_values(value):
        return value
    if isinstance(value, LazyResult):
        return value.resolve()
    if lookup is not None and isinstance(value, ComponentRef):
        return lookup(value)
    if isinstance(value, list):
        return [resolve_inputs(v, lookup) for v in value]
    if isinstance(value, tuple):
        return tuple(resolve_inputs(v, lookup) for v in value)
    if isinstance(value, dict):
        return {k: resolve_inputs(v, lookup) for k, v in value.items()}
    return value


def holds_remote_values(value: Any) -> bool:
    """Whether ``value`` is or holds (in lists, tuples, dicts) a LazyResult or a component.

    Runs on every remote call, over whole batches: a loop over a stack, not recursion.
    """
    from twinkle.infra.ray_component import ComponentRef, RemoteComponent

    remote = (LazyResult, RemoteComponent, ComponentRef)
    stack = [value]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind in _PLAIN:
            continue
        if kind is list or kind is tuple:
            stack.extend(item)
        elif kind is dict:
            stack.extend(item.values())
        elif isinstance(item, remote):
            return True
        elif isinstance(item, list | tuple):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.values())
    return False
