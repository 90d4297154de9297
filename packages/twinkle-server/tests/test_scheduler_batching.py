"""FairWorker groups lanes' batchable tasks into passes, fairly, each future its own outcome."""

import threading
import time

import pytest

from twinkle.server.errors import Timeout
from twinkle.server.scheduler import Batchable, FairWorker


class Recorder:
    """A run_many that records each pass's items and answers each item with its double."""

    def __init__(self) -> None:
        self.passes: list[list] = []

    def run_many(self, items: list) -> list:
        self.passes.append(list(items))
        return [ValueError(f"bad {i}") if i < 0 else 2 * i for i in items]

    def submit(self, worker, lane, item, rows=1, kind="fb", timeout=None):
        batch = Batchable(kind, item, self.run_many, rows=rows)
        solo = lambda: self.passes.append([item]) or 2 * item  # noqa: E731
        return worker.submit(lane, solo, timeout, batch=batch)


def _hold(worker) -> threading.Event:
    gate = threading.Event()
    worker.submit("block", gate.wait)
    return gate


@pytest.fixture
def worker():
    w = FairWorker("test", max_items=3, max_rows=8)
    yield w
    w.stop()


def test_lanes_share_a_pass_in_round_robin_order_and_plain_work_keeps_its_turn(worker):
    recorder, order = Recorder(), []
    gate = _hold(worker)
    futures = [recorder.submit(worker, "a", 1), recorder.submit(worker, "a", 2)]
    futures.append(recorder.submit(worker, "b", 3))
    futures.append(worker.submit("c", lambda: order.append(("c", len(recorder.passes)))))
    futures.append(recorder.submit(worker, "d", 4))
    gate.set()
    assert [f.result(timeout=5) for f in futures] == [2, 4, 6, None, 8]
    # a, b and d's first tasks share the first pass; c runs in its own turn, before a's second.
    assert recorder.passes == [[1, 3, 4], [2]]
    assert order == [("c", 1)]


def test_a_pass_holds_at_most_max_items_tasks_and_max_rows_rows(worker):
    recorder = Recorder()
    gate = _hold(worker)
    futures = [recorder.submit(worker, f"lane{i}", i) for i in range(4)]
    futures.append(recorder.submit(worker, "wide", 9, rows=7))
    futures.append(recorder.submit(worker, "narrow", 10))
    gate.set()
    for f in futures:
        f.result(timeout=5)
    assert recorder.passes[0] == [0, 1, 2]  # max_items 3
    # lane3 (1 row) with wide (7) fills max_rows 8; narrow waits for the next pass.
    assert recorder.passes[1:] == [[3, 9], [10]]


def test_kinds_do_not_mix_and_one_items_error_fails_its_future_alone(worker):
    recorder = Recorder()
    gate = _hold(worker)
    bad = recorder.submit(worker, "a", -1)
    good = recorder.submit(worker, "b", 5)
    other_kind = recorder.submit(worker, "c", 6, kind="sample")
    gate.set()
    assert good.result(timeout=5) == 10 and other_kind.result(timeout=5) == 12
    with pytest.raises(ValueError, match="bad -1"):
        bad.result(timeout=5)
    assert recorder.passes == [[-1, 5], [6]]


def test_a_failing_pass_fails_each_of_its_futures_and_the_worker_goes_on(worker):
    def broken(items):
        raise RuntimeError("the pass broke")

    gate = _hold(worker)
    futures = [
        worker.submit(lane, lambda: 0, batch=Batchable("fb", i, broken))
        for i, lane in enumerate("ab")
    ]
    after = worker.submit("c", lambda: "still serving")
    gate.set()
    for future in futures:
        with pytest.raises(RuntimeError, match="the pass broke"):
            future.result(timeout=5)
    assert after.result(timeout=5) == "still serving"


def test_a_task_past_its_deadline_leaves_the_pass_and_timing_reaches_the_others(worker):
    recorder = Recorder()
    gate = _hold(worker)
    doomed = recorder.submit(worker, "a", 1, timeout=0.05)
    batches = [Batchable("fb", i, recorder.run_many) for i in (2, 3)]
    kept = [
        worker.submit(lane, lambda: None, batch=b) for lane, b in zip("bc", batches, strict=True)
    ]
    time.sleep(0.2)
    gate.set()
    assert [f.result(timeout=5) for f in kept] == [4, 6]
    with pytest.raises(Timeout):
        doomed.result(timeout=5)
    assert recorder.passes == [[2, 3]]
    assert all(b.timing["pass_size"] == 2 and b.timing["compute_ms"] >= 0 for b in batches)


def _closed_loop_passes(linger_s: float) -> list[list]:
    """Two tenants that each send their next task only after their answer (b a little
    later than a): the passes the worker forms."""
    recorder = Recorder()
    worker = FairWorker("loop", linger_s=linger_s)
    try:
        gate = _hold(worker)
        first = [recorder.submit(worker, lane, 1) for lane in "ab"]
        gate.set()
        for f in first:
            f.result(timeout=5)
        nxt = recorder.submit(worker, "a", 2)
        time.sleep(0.05)
        late = recorder.submit(worker, "b", 3)
        nxt.result(timeout=5), late.result(timeout=5)
    finally:
        worker.stop()
    return recorder.passes


def test_the_worker_lingers_for_a_lane_of_the_last_pass():
    assert _closed_loop_passes(linger_s=2.0) == [[1, 1], [2, 3]]
    assert _closed_loop_passes(linger_s=0.0) == [[1, 1], [2], [3]]
