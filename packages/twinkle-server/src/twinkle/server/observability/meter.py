"""The service's numbers: one Prometheus registry per app (so several apps in one process,
as the tests build, never share counters), per-key usage written to the store, and each
run's loss history for the dashboard.

Counters and histograms are updated as requests and work finish; the queue depth and the
LoRA slots are read from the services when /metrics is scraped (``ServiceCollector``).
Usage per key and UTC day (``requests``, ``train_tokens``, ``sampled_tokens``,
``prompt_tokens``) and each run's loss curve (its last ``LOSS_POINTS`` finite losses) are
durable: both live in the store, so a restarted server shows them again.
"""

from __future__ import annotations

import collections
import math
import time
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily

from twinkle.server.observability.work_results import (
    SAMPLING,
    TRAINING,
    sampled_tokens,
    trained_tokens,
)
from twinkle.server.state import ServerState
from twinkle.utils import get_logger

logger = get_logger()
LOSS_POINTS = 2000
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)


def workers_of(state: ServerState) -> dict[str, Any]:
    """The loaded services' workers by name (``model``, ``sampler``)."""
    services = {"model": state.model, "sampler": state.sampler}
    return {name: s.worker for name, s in services.items() if s is not None}


class ServiceCollector:
    """Gauges read at scrape time: queued work per worker, whether it is busy, LoRA slots;
    the same per copy of the model (``twinkle_replica_*``, ``replica`` "0" to copies - 1;
    the ``worker="model"`` figures are their sums)."""

    def __init__(self, state: ServerState) -> None:
        self.state = state

    def collect(self):
        queue = GaugeMetricFamily(
            "twinkle_queue_depth", "Work waiting on a worker", labels=["worker"]
        )
        busy = GaugeMetricFamily(
            "twinkle_worker_busy", "1 while a worker runs work", labels=["worker"]
        )
        for name, worker in workers_of(self.state).items():
            queue.add_metric([name], worker.pending())
            busy.add_metric([name], 1 if worker.busy_lanes else 0)
        slots = GaugeMetricFamily("twinkle_lora_slots", "LoRA slots of the pool", labels=["state"])
        held = GaugeMetricFamily("twinkle_lora_slots_held", "LoRA slots per key", labels=["tenant"])
        replica_queue = GaugeMetricFamily(
            "twinkle_replica_queue_depth",
            "Work waiting on one copy of the model",
            labels=["replica"],
        )
        replica_busy = GaugeMetricFamily(
            "twinkle_replica_busy", "1 while one copy of the model runs work", labels=["replica"]
        )
        replica_slots = GaugeMetricFamily(
            "twinkle_replica_lora_slots",
            "LoRA slots of one copy of the model",
            labels=["replica", "state"],
        )
        model = self.state.model
        if model is not None:
            free = model.free_slots()
            slots.add_metric(["used"], model.max_loras - free)
            slots.add_metric(["free"], free)
            owners = collections.Counter(live.run.owner for live in list(model.live.values()))
            for owner, count in sorted(owners.items()):
                held.add_metric([owner], count)
            for replica, use in enumerate(model.replica_use()):
                replica_queue.add_metric([str(replica)], use["queued"])
                replica_busy.add_metric([str(replica)], use["busy"])
                replica_slots.add_metric([str(replica), "used"], use["used"])
                replica_slots.add_metric([str(replica), "free"], use["free"])
        yield from (queue, busy, slots, held, replica_queue, replica_busy, replica_slots)


class Meter:
    def __init__(self, state: ServerState) -> None:
        self.state = state
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "twinkle_http_requests",
            "HTTP requests answered, by route template and status",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "twinkle_http_request_duration_seconds",
            "Time to answer, by route template",
            ["method", "route"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.trained = Counter(
            "twinkle_tokens_trained",
            "Tokens trained on, per key",
            ["tenant"],
            registry=self.registry,
        )
        self.sampled = Counter(
            "twinkle_tokens_sampled",
            "Tokens generated, per key",
            ["tenant"],
            registry=self.registry,
        )
        self.registry.register(ServiceCollector(state))

    def observe_request(self, method: str, route: str, status: int, seconds: float) -> None:
        self.requests.labels(method, route, str(status)).inc()
        self.latency.labels(method, route).observe(seconds)

    def on_finished(self, owner: str, operation: str, lane: str | None, result: Any) -> None:
        """A future's work finished well: count its tokens, keep a training step's loss."""
        amounts = {"requests": 1.0}
        if operation in TRAINING:
            tokens, loss = trained_tokens(result)
            amounts["train_tokens"] = tokens
            if loss is not None and lane is not None and math.isfinite(loss):
                self.state.store.add_loss(owner, lane, time.time(), loss, LOSS_POINTS)
        elif operation in SAMPLING:
            amounts["sampled_tokens"] = sampled_tokens(result)
        self.add_usage(owner, amounts)

    def add_usage(self, owner: str, amounts: dict[str, float]) -> None:
        """Usage of one request: to the store (durable, per day) and to the counters."""
        if amounts.get("train_tokens"):
            self.trained.labels(owner).inc(amounts["train_tokens"])
        if amounts.get("sampled_tokens"):
            self.sampled.labels(owner).inc(amounts["sampled_tokens"])
        self.state.store.add_usage(owner, amounts, time.time())

    def losses(self, owner: str, run_id: str) -> list[tuple[float, float]]:
        return self.state.store.losses(owner, run_id)
