"""Bytes that pass through the driver in ray mode: call arguments out, results in.

Counting pickles every value, so it is off unless a ``count_driver_traffic()``
block is open (the Ray benchmark measures lazy against eager collection with
it). A lazy result counts as its object ids: the data behind them never
reaches the driver.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from twinkle.infra.ray.handles import RemoteHandle, holds_remote_values

OBJECT_ID_BYTES = 28


@dataclass
class DriverTraffic:
    sent: int = 0
    received: int = 0


_counter: DriverTraffic | None = None


@contextmanager
def count_driver_traffic() -> Iterator[DriverTraffic]:
    """Count the bytes of arguments sent to workers and of results fetched by the driver."""
    global _counter
    previous, _counter = _counter, DriverTraffic()
    try:
        yield _counter
    finally:
        _counter = previous


def size_of(value: object) -> int:
    """Pickled size, with lazy results and component references counted as their ids."""
    if isinstance(value, RemoteHandle):
        return OBJECT_ID_BYTES * value._object_ids()
    if isinstance(value, list | tuple) and holds_remote_values(value):
        return sum(size_of(item) for item in value)
    if isinstance(value, dict) and holds_remote_values(value):
        return sum(size_of(k) + size_of(v) for k, v in value.items())
    try:
        return len(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))
    except Exception:  # a value only Ray's pickler handles (an object ref): its id
        return OBJECT_ID_BYTES


def record_sent(value: object) -> None:
    if _counter is not None:
        _counter.sent += size_of(value)


def record_received(value: object) -> None:
    if _counter is not None:
        _counter.received += size_of(value)
