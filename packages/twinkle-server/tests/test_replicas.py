"""Copies of the model as one model and one worker: a run's calls reach the copy that holds
its adapter, lanes are spread over the copies' threads, and the copies' threads run at
once. (Two copies on real Ray groups: test_ray_mode.py.)"""

from __future__ import annotations

import threading
import time

import pytest

from twinkle.model.transformers.tenant_pass import TenantRequest
from twinkle.server.config import ServerConfig
from twinkle.server.replicas import ReplicaModels, ReplicaWorkers
from twinkle.server.scheduler import FairWorker


class Copy:
    """Records which calls reached it."""

    def __init__(self, name: str) -> None:
        self.name, self.calls = name, []

    def vocab_size(self) -> int:
        self.calls.append("vocab_size")
        return 7

    def add_adapter_to_model(self, adapter: str, config=None) -> None:
        self.calls.append(("add", adapter))

    def set_loss(self, loss: str, *, adapter_name: str) -> None:
        self.calls.append(("set_loss", adapter_name))

    def forward_backward_many(self, requests) -> list:
        self.calls.append(("many", [r.adapter_name for r in requests]))
        return []

    def remove_adapter(self, adapter: str) -> None:
        self.calls.append(("remove", adapter))


def test_calls_reach_the_copy_holding_the_adapter():
    first, second = Copy("a"), Copy("b")
    models = ReplicaModels([first, second])
    models.place("x", 1)
    models.add_adapter_to_model("x", None)
    models.set_loss("CrossEntropyLoss", adapter_name="x")
    models.forward_backward_many([TenantRequest("x", [])])
    assert models.vocab_size() == 7  # no adapter: the first copy
    models.remove_adapter("x")
    assert second.calls == [("add", "x"), ("set_loss", "x"), ("many", ["x"]), ("remove", "x")]
    assert first.calls == ["vocab_size"]
    assert models.holder("x") == 0  # forgotten once removed


def test_lanes_spread_over_the_copies_and_their_threads_run_at_once():
    workers = ReplicaWorkers([FairWorker("c0"), FairWorker("c1")])
    try:
        assert [workers.replica_of(lane) for lane in ("r1", "r2", "r3")] == [0, 1, 0]
        workers.forget("r2")
        assert workers.replica_of("r4") == 1  # the copy serving fewer lanes
        gate = threading.Event()
        held = workers.submit("r1", gate.wait)  # copy 0's thread is held
        deadline = time.monotonic() + 10
        while workers.busy_lanes != {"r1"} and time.monotonic() < deadline:
            time.sleep(0.01)
        assert workers.submit("r4", lambda: "ran").result(timeout=10) == "ran"
        queued = workers.submit("r3", lambda: "later")
        assert workers.pending() == 1 and workers.busy_lanes == {"r1"}
        workers.cancel_lane("r3", "gone")
        gate.set()
        held.result(timeout=10)
        with pytest.raises(Exception, match="gone"):
            queued.result(timeout=10)
    finally:
        workers.stop()


def test_copies_need_ray_distinct_groups_and_the_groups_declared():
    with pytest.raises(ValueError, match="need mode: ray"):
        ServerConfig.model_validate({"model": {"remote_group": ["a", "b"]}})
    groups = [{"name": n} for n in ("a", "sampler")]
    with pytest.raises(ValueError, match="distinct groups"):
        ServerConfig.model_validate(
            {"mode": "ray", "model": {"remote_group": ["a", "a"]}, "device_groups": groups}
        )
    with pytest.raises(ValueError, match="'b'"):
        ServerConfig.model_validate(
            {"mode": "ray", "model": {"remote_group": ["a", "b"]}, "device_groups": groups}
        )
    config = ServerConfig.model_validate(
        {"mode": "ray", "model": {"remote_group": ["a"]}, "device_groups": groups}
    )
    assert config.model.groups() == ["a"]
