"""FairWorker: one thread that runs a component's blocking work, fairly across tenants.

A model's adapters share one base model and one peft wrapper whose active adapter is
global state, so its work runs on one thread, never on the event loop. Each lane (one
adapter, i.e. one tenant's training run) is a FIFO: one tenant's requests run in the
order they arrived. Lanes are served round robin, one task per turn, so a tenant that
queues a hundred steps delays another tenant's next request by at most one task.

Work that can share a pass (a ``Batchable``: several tenants' forward_backward calls on one
base model) is grouped at its lane's turn: the lanes after it whose next task is of the same
kind join it, in round-robin order, up to ``max_items`` tasks and ``max_rows`` rows, and
every lane served goes to the back. A lane still gets one task per turn, so grouping changes
how many turns share a pass, never whose turn comes first. When a lane of the previous pass
has not sent its next task yet (its tenant is reading the last answer), the pass waits up to
``linger_s`` for it: clients that wait for each answer otherwise split into passes of one
and of the rest. What cannot share a pass runs alone in its turn, as before.

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
class Batchable:
    """A task's work as an item that may share one pass with other lanes' items of the same
    ``kind``: ``run_many(items)`` returns each item's result, or the exception that failed
    it alone, in order. A pass of one runs the task's own ``fn`` instead. ``timing`` receives
    the pass's ``compute_ms`` and ``pass_size`` before the task's future is resolved."""

    kind: str
    item: Any
    run_many: Callable[[list[Any]], list[Any]]
    rows: int = 1
    timing: dict[str, float] = field(default_factory=dict)


@dataclass
class Task:
    fn: Callable[[], Any]
    lane: str
    deadline: float | None
    future: Future = field(default_factory=Future)
    batch: Batchable | None = None


class FairWorker:
    """Runs submitted callables on one thread: FIFO per lane, round robin across lanes,
    batchable work of several lanes grouped into one pass."""

    def __init__(
        self,
        name: str,
        *,
        max_items: int = 16,
        max_rows: int | None = None,
        linger_s: float = 0.0,
    ) -> None:
        self.name = name
        self.max_items, self.max_rows, self.linger_s = max_items, max_rows, linger_s
        self._lanes: OrderedDict[str, deque[Task]] = OrderedDict()
        self._cond = threading.Condition()
        self._stopped = False
        self._last_pass: set[str] = set()  # the lanes of the last batchable pass
        self.busy_lanes: frozenset[str] = frozenset()
        self._thread = threading.Thread(target=self._loop, name=f"twinkle-{name}", daemon=True)
        self._thread.start()

    def submit(
        self,
        lane: str,
        fn: Callable[[], Any],
        timeout: float | None = None,
        batch: Batchable | None = None,
    ) -> Future:
        """Queue ``fn`` on ``lane``; with ``batch``, it may run in a pass with other lanes'."""
        task = Task(fn, lane, None if timeout is None else time.monotonic() + timeout, batch=batch)
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
            self._last_pass.discard(lane)
        for task in tasks:
            task.future.set_exception(Timeout(reason))

    def _next(self) -> list[Task] | None:
        with self._cond:
            lingered = False
            while True:
                while not self._stopped and not self._lanes:
                    self._cond.wait()
                if self._stopped:
                    return None
                head = next(iter(self._lanes.values()))[0]
                if lingered or head.batch is None or self.linger_s <= 0:
                    break
                self._linger(head.batch.kind)  # releases the lock: look at the queues again
                lingered = True
            tasks = self._take_pass()
            self.busy_lanes = frozenset(t.lane for t in tasks)
            return tasks

    def _heads_of(self, kind: str) -> set[str]:
        return {lane for lane, queue in self._lanes.items() if _kind(queue[0]) == kind}

    def _linger(self, kind: str) -> None:
        """Wait (up to ``linger_s``, the lock released) for the lanes of the last pass that
        have nothing queued to send their next task."""
        deadline = time.monotonic() + self.linger_s
        while not self._stopped and self._last_pass - self._heads_of(kind):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            self._cond.wait(remaining)

    def _take_pass(self) -> list[Task]:
        """The first lane's next task and, when it can share a pass, the next task of each
        following lane of its kind that fits; every lane served goes to the back."""
        order = list(self._lanes)
        first = self._lanes[order[0]][0]
        kind, rows = _kind(first), 0
        chosen: list[str] = []
        for lane in order:
            task = self._lanes[lane][0]
            if chosen and (kind is None or _kind(task) != kind or len(chosen) >= self.max_items):
                continue
            if chosen and self.max_rows is not None and rows + task.batch.rows > self.max_rows:
                continue
            chosen.append(lane)
            rows += task.batch.rows if task.batch is not None else 0
        tasks = []
        for lane in chosen:
            queue = self._lanes.pop(lane)
            tasks.append(queue.popleft())
            if queue:
                self._lanes[lane] = queue
        if kind is not None:  # a lane that did not come within the linger leaves the set
            self._last_pass = set(chosen)
        return tasks

    def _loop(self) -> None:
        while (tasks := self._next()) is not None:
            try:
                live = [task for task in tasks if _starts(task)]
                if len(live) == 1:
                    _run_alone(live[0])
                elif live:
                    _run_pass(live)
            finally:
                self.busy_lanes = frozenset()

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            lanes, self._lanes = self._lanes, OrderedDict()
            self._cond.notify_all()
        for queue in lanes.values():
            for task in queue:
                task.future.cancel()
        self._thread.join(timeout=5)


def _kind(task: Task) -> str | None:
    return None if task.batch is None else task.batch.kind


def _starts(task: Task) -> bool:
    """Whether a task taken from its queue runs: not past its deadline, not cancelled."""
    if task.deadline is not None and time.monotonic() > task.deadline:
        task.future.set_exception(Timeout("the request timed out in the queue and was not run"))
        return False
    return task.future.set_running_or_notify_cancel()


def _run_alone(task: Task) -> None:
    try:
        task.future.set_result(task.fn())
    except BaseException as exc:  # noqa: BLE001 - handed to the waiting request
        task.future.set_exception(exc)


def _run_pass(tasks: list[Task]) -> None:
    """Run several lanes' items as one pass; each future gets its own item's outcome."""
    start = time.perf_counter()
    try:
        outcomes = tasks[0].batch.run_many([task.batch.item for task in tasks])
        if len(outcomes) != len(tasks):
            raise RuntimeError(f"a pass of {len(tasks)} items returned {len(outcomes)} results")
    except BaseException as exc:  # noqa: BLE001 - the pass itself failed: every item with it
        outcomes = [exc] * len(tasks)
    elapsed_ms = (time.perf_counter() - start) * 1e3
    for task, outcome in zip(tasks, outcomes, strict=True):
        task.batch.timing.update(compute_ms=elapsed_ms, pass_size=len(tasks))
        if isinstance(outcome, BaseException):
            task.future.set_exception(outcome)
        else:
            task.future.set_result(outcome)
