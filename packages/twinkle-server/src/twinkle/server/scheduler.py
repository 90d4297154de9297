"""FairWorker: one thread that runs a component's blocking work, fairly across tenants.

A model's adapters share one base model and one peft wrapper whose active adapter is
global state, so its work runs on one thread, never on the event loop. Each lane (one
adapter, i.e. one tenant's training run) is a FIFO: one tenant's requests run in the
order they arrived. Lanes are served round robin, one task per turn, so a tenant that
queues a hundred steps delays another tenant's next request by at most one task.

Cancellation is real for queued work: a task whose deadline passes before it starts is
dropped and never runs. A task already running finishes (torch offers no safe point to
stop it); its future then holds the result, which a retry with the same idempotency key
receives instead of running the work twice.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from twinkle.server.errors import Timeout
from twinkle.utils import get_logger

logger = get_logger()


@dataclass
class Task:
    fn: Callable[[], Any]
    lane: str
    deadline: float | None
    future: Future = field(default_factory=Future)


class FairWorker:
    """Runs submitted callables on one thread: FIFO per lane, round robin across lanes."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._lanes: OrderedDict[str, deque[Task]] = OrderedDict()
        self._cond = threading.Condition()
        self._stopped = False
        self.busy_lane: str | None = None
        self._thread = threading.Thread(target=self._loop, name=f"twinkle-{name}", daemon=True)
        self._thread.start()

    def submit(self, lane: str, fn: Callable[[], Any], timeout: float | None = None) -> Future:
        task = Task(fn, lane, None if timeout is None else time.monotonic() + timeout)
        with self._cond:
            if self._stopped:
                raise RuntimeError(f"worker {self.name} is stopped")
            self._lanes.setdefault(lane, deque()).append(task)
            self._cond.notify()
        return task.future

    def pending(self) -> int:
        with self._cond:
            return sum(len(q) for q in self._lanes.values())

    def cancel_lane(self, lane: str, reason: str) -> None:
        """Drop a lane's queued tasks (its adapter is going away)."""
        with self._cond:
            tasks = self._lanes.pop(lane, deque())
        for task in tasks:
            task.future.set_exception(Timeout(reason))

    def _next(self) -> Task | None:
        with self._cond:
            while not self._stopped and not self._lanes:
                self._cond.wait()
            if self._stopped:
                return None
            lane, queue = next(iter(self._lanes.items()))
            task = queue.popleft()
            # Round robin: this lane goes to the back, or away when empty.
            del self._lanes[lane]
            if queue:
                self._lanes[lane] = queue
            self.busy_lane = lane
            return task

    def _loop(self) -> None:
        while (task := self._next()) is not None:
            try:
                if task.deadline is not None and time.monotonic() > task.deadline:
                    task.future.set_exception(
                        Timeout("the request timed out in the queue and was not run")
                    )
                    continue
                if not task.future.set_running_or_notify_cancel():
                    continue
                try:
                    task.future.set_result(task.fn())
                except BaseException as exc:  # noqa: BLE001 - handed to the waiting request
                    task.future.set_exception(exc)
            finally:
                self.busy_lane = None

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            lanes, self._lanes = self._lanes, OrderedDict()
            self._cond.notify_all()
        for queue in lanes.values():
            for task in queue:
                task.future.cancel()
        self._thread.join(timeout=5)
