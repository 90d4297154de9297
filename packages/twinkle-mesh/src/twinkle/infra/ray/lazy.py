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

from twinkle.infra.collect import Collector, collect
from twinkle.infra.ray.calls import CallInfo, PendingCalls, fetch
from twinkle.infra.ray.handles import ComponentRef, RemoteHandle, holds_remote_values
from twinkle.infra.ray.traffic import record_received
from twinkle.infra.state import get_worker_group
from twinkle.mesh import DeviceMesh

_UNSET = object()
_OWN = frozenset({"refs", "ranks", "mode", "mesh", "info", "_pending", "_value"})


class LazyResult(RemoteHandle):
    """The result of a remote call with ``lazy_collect``: object refs plus the collect rule.

    ``pending`` is the driver's ledger of unchecked lazy calls, told when reading this result
    raised its failure (None on a worker, which keeps no ledger)."""

    def __init__(
        self,
        refs: list,
        ranks: Sequence[int],
        mode: str | Collector,
        mesh: DeviceMesh | None,
        info: CallInfo,
        pending: PendingCalls | None = None,
    ) -> None:
        self.refs, self.ranks, self.mode, self.mesh, self.info = refs, list(ranks), mode, mesh, info
        self._pending = pending
        self._value: Any = _UNSET

    def _object_ids(self) -> int:
        return len(self.refs)

    def resolve(self) -> Any:
        """Fetch the workers' results (once) and collect them into the call's return value."""
        if self._value is _UNSET:
            try:
                values = fetch(self.refs, self.ranks, self.info)
            except BaseException:
                if self._pending is not None:  # the driver: this failure is now reported
                    self._pending.forget(self.info)
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
        self._pending, self._value = None, _UNSET

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in _OWN:
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
