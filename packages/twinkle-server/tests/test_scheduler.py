"""FairWorker: FIFO per lane, round robin across lanes, queued work really cancelled."""

import threading
import time

import pytest

from twinkle.server.errors import Timeout
from twinkle.server.scheduler import FairWorker


@pytest.fixture
def worker():
    w = FairWorker("test")
    yield w
    w.stop()


def test_one_lane_runs_in_order_and_lanes_alternate(worker):
    gate, order = threading.Event(), []
    worker.submit("block", gate.wait)  # hold the worker while the queues fill
    futures = [worker.submit("a", lambda i=i: order.append(f"a{i}")) for i in range(4)]
    futures += [worker.submit("b", lambda i=i: order.append(f"b{i}")) for i in range(2)]
    gate.set()
    for f in futures:
        f.result(timeout=5)
    assert order == ["a0", "b0", "a1", "b1", "a2", "a3"]


def test_a_long_queue_does_not_starve_a_newcomer(worker):
    gate, order = threading.Event(), []
    worker.submit("block", gate.wait)
    for i in range(50):
        worker.submit("greedy", lambda i=i: order.append(("greedy", i)))
    late = worker.submit("late", lambda: order.append(("late", 0)))
    gate.set()
    late.result(timeout=5)
    assert order.index(("late", 0)) <= 1


def test_a_task_past_its_deadline_never_runs(worker):
    gate, ran = threading.Event(), []
    worker.submit("block", gate.wait)
    doomed = worker.submit("a", lambda: ran.append(1), timeout=0.05)
    time.sleep(0.2)
    gate.set()
    with pytest.raises(Timeout):
        doomed.result(timeout=5)
    assert ran == []


def test_cancelling_a_queued_task_skips_it_and_errors_reach_the_caller(worker):
    gate, ran = threading.Event(), []
    worker.submit("block", gate.wait)
    queued = worker.submit("a", lambda: ran.append(1))
    assert queued.cancel()
    failing = worker.submit("a", lambda: 1 / 0)
    gate.set()
    with pytest.raises(ZeroDivisionError):
        failing.result(timeout=5)
    assert ran == []


def test_a_request_timeout_cancels_queued_work_and_a_retry_gets_the_first_result(worker):
    import asyncio

    from twinkle.server.futures import FutureManager
    from twinkle.server.store import SQLiteStore

    futures = FutureManager(SQLiteStore(":memory:"))
    gate, ran = threading.Event(), []
    worker.submit("block", gate.wait)
    doomed = futures.submit("alice", "step", worker, "a", lambda: ran.append("doomed"), "k1", None)
    with pytest.raises(Timeout, match="cancelled before it ran"):
        asyncio.run(futures.wait("alice", doomed, 0.05))
    kept = futures.submit("alice", "step", worker, "a", lambda: ran.append("kept") or 7, "k2", None)
    assert (
        futures.submit("alice", "step", worker, "a", lambda: ran.append("dup"), "k2", None) == kept
    )
    gate.set()
    assert asyncio.run(futures.wait("alice", kept, 5)) == 7
    assert ran == ["kept"]
    assert futures.status("alice", doomed).status == "failed"
    with pytest.raises(Exception, match="no request"):
        futures.status("bob", kept)
