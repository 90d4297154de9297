"""Weight sync between two Ray DeviceGroups: a bucketed broadcast from the model group's rank 0
to every sampler worker, over a process group of their own (:class:`PeerGroup`).

Two small components carry it, each built on its side's group next to the component it
serves (so they reach the TransformersModel and the sampler in their own worker process):

* ``WeightSender`` on every rank of the model's group. Rank 0 hosts the rendezvous, gathers
  full tensors (``full_tensor()`` of FSDP2 DTensors) and broadcasts them in buckets. The other
  ranks take part only when the model is sharded, because gathering a DTensor is a
  collective over the whole model group; a replicated (DDP) model is read on rank 0 alone.
* ``WeightReceiver`` on every rank of the sampler's group: installs each bucket as it comes.

The driver's :class:`GroupBroadcast` starts the receivers' half lazily, runs the sender's
half, then waits for the receivers (``wait_for``), so no tensor passes through the driver.
Which payloads go (plain base weights once, then only the adapter, or the merged weights
each time) is decided by the driver's CheckpointEngineManager and built on the model's
ranks by ``sync_payloads``, as in process.
"""

from __future__ import annotations

import contextlib
import os
from datetime import timedelta
from typing import Any

import torch
from torch.distributed.tensor import DTensor

from twinkle.checkpoint_engine.base import TransferStats
from twinkle.checkpoint_engine.broadcast import DEFAULT_BUCKET_BYTES, BroadcastEngine
from twinkle.checkpoint_engine.payload import hf_module, sync_payloads
from twinkle.checkpoint_engine.peer_group import (
    PeerGroup,
    connect_store,
    open_store,
)
from twinkle.infra import remote_class, remote_function
from twinkle.mesh import Platform
from twinkle.sampler.weights import plain_tensors

DEFAULT_TIMEOUT_S = 600.0


def _backend(device: torch.device) -> str:
    return Platform.dist_backend(device.type)


@remote_class(execute="all")
class WeightSender:
    """The model group's end. ``model`` is the TransformersModel (or torch module) of this
    worker; ``bucket_bytes`` bounds each broadcast; ``timeout_s`` bounds each collective."""

    def __init__(
        self,
        model: Any,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        self.model, self.bucket_bytes = model, bucket_bytes
        self.timeout = timedelta(seconds=timeout_s)
        self.rank = Platform.get_rank()
        self.device = next(hf_module(model).parameters()).device
        self.store: Any = None
        self.engine: BroadcastEngine | None = None

    @remote_function(execute="first", dispatch="all", collect="first", lazy_collect=False)
    def weight_shapes(self) -> dict[str, tuple[int, ...]]:
        """The base weights' full shapes (DTensors report theirs), for the architecture check."""
        return {n: tuple(t.shape) for n, t in plain_tensors(hf_module(self.model)).items()}

    @remote_function(execute="first", dispatch="all", collect="first", lazy_collect=False)
    def open(self, world_size: int) -> tuple[str, int]:
        """Host the rendezvous on this node (the group's MASTER_ADDR is rank 0's own)."""
        host = os.environ.get("MASTER_ADDR", "127.0.0.1")
        self.store = open_store(host, world_size, self.timeout)
        return host, self.store.port

    @remote_function(execute="first", dispatch="all", collect="first", lazy_collect=False)
    def connect(self, world_size: int) -> None:
        if self.store is None:
            raise RuntimeError("call open() before connect()")
        group = PeerGroup(self.store, 0, world_size, _backend(self.device), self.timeout)
        self.engine = BroadcastEngine(group, 0, self.bucket_bytes, self.device)

    @remote_function(dispatch="all", collect="first", lazy_collect=False)
    def send(
        self, merge_and_sync: bool, adapter_name: str | None, with_base: bool
    ) -> TransferStats:
        """Rank 0 broadcasts the payloads (module docstring); the other ranks gather a sharded
        model's tensors with it (sharding is decided now: FSDP2 applies at the first step)."""
        module = hf_module(self.model)
        if self.rank != 0 and not any(isinstance(p, DTensor) for p in module.parameters()):
            return TransferStats()
        if self.rank == 0 and self.engine is None:
            raise RuntimeError("call connect() before send()")
        try:
            payloads = sync_payloads(self.model, merge_and_sync, adapter_name, with_base)
        except Exception as exc:
            if self.rank == 0:  # the receivers wait for a header: tell them none will come
                self.engine.abort(f"{type(exc).__name__}: {exc}")
            raise
        return self.engine.send(payloads) if self.rank == 0 else TransferStats()


@remote_class(execute="all")
class WeightReceiver:
    """The sampler group's end. ``sampler`` is the sampler of this worker."""

    def __init__(self, sampler: Any, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.sampler = sampler
        self.timeout = timedelta(seconds=timeout_s)
        self.device = torch.device(getattr(sampler, "device", "cpu"))
        self.engine: BroadcastEngine | None = None

    @remote_function(execute="first", dispatch="all", collect="first", lazy_collect=False)
    def weight_shapes(self) -> dict[str, tuple[int, ...]]:
        return {n: shape for n, (shape, _) in self.sampler.weight_names().items()}

    @remote_function(execute="first", dispatch="all", collect="first", lazy_collect=False)
    def group_size(self) -> int:
        return Platform.get_world_size()

    @remote_function(dispatch="all", collect="none", lazy_collect=True)
    def connect(self, host: str, port: int, world_size: int, bucket_bytes: int) -> None:
        """Join as rank 1 + this worker's rank; returns once the sender joined too."""
        store = connect_store(host, port, world_size, self.timeout)
        rank = 1 + Platform.get_rank()
        group = PeerGroup(store, rank, world_size, _backend(self.device), self.timeout)
        self.engine = BroadcastEngine(group, 0, bucket_bytes, self.device)

    @remote_function(dispatch="all", collect="none", lazy_collect=True)
    def receive(self) -> TransferStats:
        if self.engine is None:
            raise RuntimeError("call connect() before receive()")
        stats = self.engine.receive(self.sampler)
        self.sampler.reset_prefix_cache()
        return stats


class GroupBroadcast:
    """The driver's side: builds the two ends beside ``model`` and ``sampler`` (Ray
    components on two groups), links them on the first sync, and runs each sync."""

    def __init__(
        self,
        model: Any,
        sampler: Any,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        if bucket_bytes < 1:
            raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
        self.bucket_bytes = bucket_bytes
        self.sender = WeightSender(model, bucket_bytes, timeout_s, remote_group=model.remote_group)
        self.receiver = WeightReceiver(sampler, timeout_s, remote_group=sampler.remote_group)
        self.connected = False

    def architecture(self) -> tuple[dict, dict]:
        """The model's and the sampler's base weight shapes."""
        return self.sender.weight_shapes(), self.receiver.weight_shapes()

    def connect(self) -> None:
        from twinkle.infra.ray.component import wait_for

        world_size = 1 + self.receiver.group_size()
        host, port = self.sender.open(world_size)
        joined = self.receiver.connect(host, port, world_size, self.bucket_bytes)
        self.sender.connect(world_size)
        wait_for(joined)
        self.connected = True

    def sync(
        self, merge_and_sync: bool, adapter_name: str | None, with_base: bool
    ) -> TransferStats:
        """One sync (``with_base``: send the plain base weights before the adapter)."""
        from twinkle.infra.ray.component import wait_for

        if not self.connected:
            self.connect()
        received = self.receiver.receive()
        try:
            stats = self.sender.send(merge_and_sync, adapter_name, with_base)
        except Exception:
            with contextlib.suppress(Exception):  # the receivers' abort notice repeats it
                wait_for(received)
            raise
        wait_for(received)
        return stats
