"""Copies of the base model (``model.remote_group`` naming several Ray groups) as one model
and one worker, so the routes never ask which copy holds a run.

Each copy has its own LoRA slots and its own ``FairWorker`` thread: a run is placed on one
copy when its adapter is created (the copy serving the fewest runs) and every later
request of it runs there, in its lane, while the other copies' threads serve their runs at
the same time. Batching groups runs of one copy (a pass runs on one model). With one copy
both classes pass everything straight through.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

from twinkle.server.scheduler import Batchable, FairWorker

# Methods whose first positional argument is the adapter they act on.
ADAPTER_FIRST = frozenset({"add_adapter_to_model", "add_seeded_adapter", "remove_adapter"})
# Methods whose first argument is a list of requests, each naming its adapter.
REQUESTS_FIRST = frozenset({"forward_backward_many", "forward_only_many"})


class ReplicaModels:
    """The copies as one model: a call naming an adapter (``adapter_name=``, the adapter
    argument of ``ADAPTER_FIRST``, the requests of ``REQUESTS_FIRST``) runs on the copy that
    holds it; a call naming none (``vocab_size``, ``pad_token_id``) asks the first copy, as
    every copy holds the same base model."""

    def __init__(self, models: Sequence[Any]) -> None:
        self.models = list(models)
        self._holder: dict[str, int] = {}

    def place(self, adapter: str, replica: int) -> None:
        """Record that ``adapter`` is (about to be) created on copy ``replica``."""
        self._holder[adapter] = replica

    def holder(self, adapter: str) -> int:
        return self._holder.get(adapter, 0)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        attribute = getattr(self.models[0], name)
        if len(self.models) == 1 or not callable(attribute):
            return attribute

        def routed(*args: Any, **kwargs: Any) -> Any:
            adapter = _adapter_of(name, args, kwargs)
            model = self.models[0 if adapter is None else self.holder(adapter)]
            result = getattr(model, name)(*args, **kwargs)
            if name == "remove_adapter":
                self._holder.pop(adapter, None)
            return result

        return routed


def _adapter_of(name: str, args: tuple, kwargs: dict) -> str | None:
    if "adapter_name" in kwargs:
        return kwargs["adapter_name"]
    if name in ADAPTER_FIRST and args:
        return args[0]
    if name in REQUESTS_FIRST and args and args[0]:
        return args[0][0].adapter_name
    return None


class ReplicaWorkers:
    """The copies' FairWorkers as one worker: a lane (a run, by its id) is served by one
    copy's thread; a lane not seen before goes to the copy serving the fewest lanes."""

    def __init__(self, workers: Sequence[FairWorker]) -> None:
        self.workers = list(workers)
        self._lanes: dict[str, int] = {}
        self._lock = threading.Lock()

    def replica_of(self, lane: str) -> int:
        """The copy serving ``lane``, chosen now if it has none."""
        with self._lock:
            if lane not in self._lanes:
                served = [0] * len(self.workers)
                for replica in self._lanes.values():
                    served[replica] += 1
                self._lanes[lane] = served.index(min(served))
            return self._lanes[lane]

    def forget(self, lane: str) -> None:
        """The lane's run is gone: its copy stops counting it."""
        with self._lock:
            self._lanes.pop(lane, None)

    def submit(
        self,
        lane: str,
        fn: Callable[[], Any],
        timeout: float | None = None,
        batch: Batchable | None = None,
    ) -> Future:
        return self.workers[self.replica_of(lane)].submit(lane, fn, timeout, batch)

    def pending(self) -> int:
        return sum(worker.pending() for worker in self.workers)

    def cancel_lane(self, lane: str, reason: str) -> None:
        with self._lock:
            replica = self._lanes.get(lane)
        if replica is not None:
            self.workers[replica].cancel_lane(lane, reason)

    @property
    def busy_lanes(self) -> frozenset[str]:
        return frozenset().union(*(worker.busy_lanes for worker in self.workers))

    def stop(self) -> None:
        for worker in self.workers:
            worker.stop()
