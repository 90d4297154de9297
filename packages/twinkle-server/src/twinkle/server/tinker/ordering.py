"""Run each Tinker model's requests in seq_id order, once each.

The SDK numbers every request of a training client (1, 2, 3, ...) and sends the chunks of
one forward_backward concurrently, so they can arrive out of order (2, 3, 1). Requests wait
here until every smaller seq_id has been released, then go to the model's worker lane,
which runs them first in, first out. A seq_id that never comes (its submit was refused
before its seq_id was read, or the client crashed) would stall the model forever, so after
``gap_timeout_s`` (the SDK's own retry horizon, 5 minutes) the held requests FAIL with an
error naming the missing seq_id: running them without it would apply an optimizer step
without some of its gradients, silently. A request that arrives after its successors were
failed fails too. A resubmit of the same
``(model_id, seq_id)`` (the SDK retries with a fresh idempotency key) gets the first
request's future id back and runs nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from twinkle.server.errors import Conflict

DEFAULT_GAP_TIMEOUT_S = 300.0
KEPT_IDS = 4096


@dataclass
class _ModelQueue:
    next_seq: int
    held: dict[int, tuple[Callable[[], None], Callable[[Exception], None]]] = field(
        default_factory=dict
    )
    seen: dict[int, str] = field(default_factory=dict)  # seq_id -> future id
    timer: threading.Timer | None = None


class SeqOrdering:
    """A reorder buffer per model id; ``release`` callables run under no lock of ours."""

    def __init__(self, gap_timeout_s: float = DEFAULT_GAP_TIMEOUT_S) -> None:
        self.gap_timeout_s = gap_timeout_s
        self._models: dict[str, _ModelQueue] = {}
        self._lock = threading.Lock()

    def open(self, model_id: str, future_id: str) -> None:
        """Start ordering a new model whose creation (seq_id 0) is ``future_id``; its first
        training request carries seq_id 1."""
        with self._lock:
            self._models[model_id] = _ModelQueue(1, seen={0: future_id})

    def close(self, model_id: str) -> None:
        with self._lock:
            queue = self._models.pop(model_id, None)
        if queue is not None and queue.timer is not None:
            queue.timer.cancel()

    def known(self, model_id: str, seq_id: int) -> str | None:
        """The future id of an earlier request with this seq_id, if any."""
        with self._lock:
            queue = self._models.get(model_id)
            return None if queue is None else queue.seen.get(seq_id)

    def submit(
        self,
        model_id: str,
        seq_id: int,
        future_id: str,
        release: Callable[[], None],
        fail: Callable[[Exception], None],
    ) -> None:
        """Record the request's future; call ``release`` when its turn comes, or ``fail``
        when a seq_id before it is given up on."""
        with self._lock:
            queue = self._models.get(model_id)
            if queue is None:  # a run made before a restart, or by the Twinkle API
                queue = self._models[model_id] = _ModelQueue(seq_id)
            queue.seen[seq_id] = future_id
            while len(queue.seen) > KEPT_IDS:
                queue.seen.pop(next(iter(queue.seen)))
            late = seq_id < queue.next_seq  # its successors were already given up on
            if not late:
                queue.held[seq_id] = (release, fail)
                ready = self._ready(queue)
            self._arm_timer(model_id, queue)
        if late:
            fail(
                Conflict(
                    f"seq_id {seq_id} of model {model_id} arrived after the requests behind it "
                    "were failed for its absence; create a new training client from the last "
                    "checkpoint"
                )
            )
            return
        for fn in ready:
            fn()

    def skip(self, model_id: str, seq_id: int) -> None:
        """A request with this seq_id was rejected before it could be queued: do not wait
        for it."""
        with self._lock:
            queue = self._models.get(model_id)
            if queue is None or seq_id < queue.next_seq or seq_id in queue.held:
                return
            queue.held[seq_id] = (_nothing, _ignore)
            ready = self._ready(queue)
            self._arm_timer(model_id, queue)
        for fn in ready:
            fn()

    @staticmethod
    def _ready(queue: _ModelQueue) -> list[Callable[[], None]]:
        ready = []
        while queue.next_seq in queue.held:
            ready.append(queue.held.pop(queue.next_seq)[0])
            queue.next_seq += 1
        return ready

    def _arm_timer(self, model_id: str, queue: _ModelQueue) -> None:
        """Held requests start the gap clock; an empty buffer stops it."""
        if queue.held and queue.timer is None:
            queue.timer = threading.Timer(self.gap_timeout_s, self._give_up_gap, (model_id,))
            queue.timer.daemon = True
            queue.timer.start()
        elif not queue.held and queue.timer is not None:
            queue.timer.cancel()
            queue.timer = None

    def _give_up_gap(self, model_id: str) -> None:
        """The missing seq_id did not come in time: fail what waits for it (running it
        out of order would train on the wrong gradients), and go on after it."""
        with self._lock:
            queue = self._models.get(model_id)
            if queue is None:
                return
            queue.timer = None
            missing, held = queue.next_seq, sorted(queue.held.items())
            queue.held.clear()
            if held:
                queue.next_seq = held[-1][0] + 1
        error = Conflict(
            f"seq_id {missing} of model {model_id} never arrived within "
            f"{self.gap_timeout_s:g}s, so the requests after it were not run; create a new "
            "training client from the last checkpoint"
        )
        for _, (_, fail) in held:
            fail(error)


def _nothing() -> None:
    return None


def _ignore(error: Exception) -> None:
    return None
