"""What stands for data that stays on the workers, and how to spot it in a call's inputs (pure).

A lazy result (its object refs) and a component (on a worker, the reference it
pickles to) are :class:`RemoteHandle` values: a remote call sends them as ids
and the receiving worker looks up the data itself. The driver's code and the
workers' both ask :func:`holds_remote_values` before doing that work, so it
lives here, below the modules that define the handles.
"""

from __future__ import annotations

from typing import Any

SELF = "__twinkle_self__"
"""What a worker returns when a method returned its own component (``__iter__``)."""

_PLAIN = frozenset({int, float, str, bytes, bool, type(None)})


class RemoteHandle:
    """Base of LazyResult, RemoteComponent and ComponentRef: a value that travels as ids."""

    __slots__ = ()

    def _object_ids(self) -> int:
        """How many object ids it travels as (private: a component proxies public names)."""
        return 1


class ComponentRef(RemoteHandle):
    """How a RemoteComponent travels to a worker: the group and the instance id there."""

    __slots__ = ("group", "instance_id", "describe")

    def __init__(self, group: str, instance_id: int, describe: str) -> None:
        self.group, self.instance_id, self.describe = group, instance_id, describe

    def __reduce__(self):
        return ComponentRef, (self.group, self.instance_id, self.describe)


def holds_remote_values(value: Any) -> bool:
    """Whether ``value`` is or holds (in lists, tuples, dicts) a lazy result or a component.

    Runs on every remote call, over whole batches: a loop over a stack, not recursion.
    """
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
        elif isinstance(item, RemoteHandle):
            return True
        elif isinstance(item, list | tuple):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.values())
    return False
