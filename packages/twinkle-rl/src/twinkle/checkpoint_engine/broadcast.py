"""Weight sync across processes: a torch.distributed broadcast in buckets.

The trainer's rank (``src``) packs tensors into flat byte buffers of at most ``bucket_bytes``
and broadcasts, for each bucket, a small header (names, dtypes, shapes, offsets, the
payload's kind) and then the buffer; every other rank of the group unpacks and installs the
bucket in its sampler. The two overlap: a bucket's buffer is in flight while the trainer packs
the next one and the samplers install the previous one, so each side holds at most two
buckets beyond the weights.
A LoRA adapter is installed once all its buckets arrived (an adapter is replaced whole).
A ``None`` header ends the sync. gloo moves CPU buffers; NCCL/HCCL need ``device`` to be
the rank's accelerator.

``group`` is a torch.distributed group (None: the default one; ``src`` is then a global rank)
or a :class:`PeerGroup` (``src`` a rank of it), the group of its own that links two Ray
groups. A receiver that fails to install a bucket keeps receiving to the end of the sync
before it raises, and a trainer that fails before sending calls ``abort``, so neither side
is left waiting in a collective for the other.
"""

from __future__ import annotations

import pickle
import time
from typing import Any

import torch
import torch.distributed as dist

from twinkle.checkpoint_engine.base import CheckpointEngine, TransferStats, apply_payload
from twinkle.checkpoint_engine.payload import BASE, Payload, iter_buckets
from twinkle.checkpoint_engine.peer_group import PeerGroup
from twinkle.sampler.base import Sampler

# Small enough that packing, sending and installing overlap over several buckets (a ~50M
# model between two Ray groups on CPU: 16 MiB 0.16 s, 64 MiB 0.23 s, 256 MiB 0.26 s a sync).
DEFAULT_BUCKET_BYTES = 16 * 2**20


def _dtype(name: str) -> torch.dtype:
    return getattr(torch, name.removeprefix("torch."))


def _pack(
    bucket: list[tuple[str, torch.Tensor]], device: torch.device
) -> tuple[list[tuple], torch.Tensor]:
    entries, offset = [], 0
    for name, tensor in bucket:
        nbytes = tensor.numel() * tensor.element_size()
        entries.append((name, str(tensor.dtype), tuple(tensor.shape), offset, nbytes))
        offset += nbytes
    buffer = torch.empty(offset, dtype=torch.uint8, device=device)
    for (_, _, _, start, nbytes), (_, tensor) in zip(entries, bucket, strict=True):
        flat = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
        buffer[start : start + nbytes].copy_(flat)
    return entries, buffer


def _unpack(entries: list[tuple], buffer: torch.Tensor) -> dict[str, torch.Tensor]:
    return {
        name: buffer[start : start + nbytes].view(_dtype(dtype)).reshape(shape)
        for name, dtype, shape, start, nbytes in entries
    }


def _wait(in_flight: tuple | None) -> None:
    """Finish a broadcast started with ``async_op`` (its buffer is kept alive until then)."""
    if in_flight is not None:
        in_flight[0].wait()


class BroadcastEngine(CheckpointEngine):
    """``send`` on rank ``src``, ``receive(sampler)`` on the others, in the same order."""

    def __init__(
        self,
        group: Any = None,
        src: int = 0,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        device: str | torch.device = "cpu",
    ) -> None:
        if not isinstance(group, PeerGroup) and not dist.is_initialized():
            raise RuntimeError(
                "BroadcastEngine needs torch.distributed: run under torchrun or in a Ray group "
                "that joined a process group, pass a PeerGroup, or use InProcessEngine for one "
                "process"
            )
        if bucket_bytes < 1:
            raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
        self.group, self.src, self.bucket_bytes = group, src, bucket_bytes
        self.device = torch.device(device)

    @property
    def rank(self) -> int:
        """This process's rank in the terms ``src`` uses."""
        return self.group.rank if isinstance(self.group, PeerGroup) else dist.get_rank()

    def _broadcast(self, tensor: torch.Tensor, async_op: bool = False) -> Any:
        """Broadcast in place; with ``async_op`` returns the work to ``wait()`` on."""
        if isinstance(self.group, PeerGroup):
            return self.group.broadcast(tensor, self.src, async_op=async_op)
        return dist.broadcast(tensor, src=self.src, group=self.group, async_op=async_op)

    def _header(self, header: dict | None) -> dict | None:
        """The source's header on every rank: its pickled size, then its bytes (the peers are
        processes of one job, not clients: pickle is safe here)."""
        sending = self.rank == self.src
        data = pickle.dumps(header) if sending else b""
        size = torch.tensor([len(data)], dtype=torch.int64, device=self.device)
        self._broadcast(size)
        if sending:
            buffer = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(self.device)
        else:
            buffer = torch.empty(int(size.item()), dtype=torch.uint8, device=self.device)
        self._broadcast(buffer)
        return header if sending else pickle.loads(buffer.cpu().numpy().tobytes())

    def _check_source(self) -> None:
        if self.rank != self.src:
            raise RuntimeError(f"send runs on the source rank {self.src}; call receive here")

    def abort(self, reason: str) -> None:
        """Tell the receivers waiting for a sync that none will come (the trainer failed)."""
        self._check_source()
        self._header({"abort": reason})

    def send(self, payloads: list[Payload]) -> TransferStats:
        self._check_source()
        start, stats = time.perf_counter(), TransferStats()
        in_flight = None  # the previous bucket's broadcast, running while this one packs
        for payload in payloads:
            buckets = list(iter_buckets(payload.tensors, self.bucket_bytes)) or [[]]
            for index, bucket in enumerate(buckets):
                try:
                    entries, buffer = _pack(bucket, self.device)
                except Exception as exc:  # between two messages: the receivers can be told
                    _wait(in_flight)
                    self.abort(f"packing {[name for name, _ in bucket][:3]} failed: {exc}")
                    raise
                last = index == len(buckets) - 1
                self._header({"meta": payload.meta, "entries": entries, "last": last})
                _wait(in_flight)
                in_flight = self._broadcast(buffer, async_op=True), buffer
                stats.tensors += len(bucket)
                stats.bytes += buffer.numel()
                stats.buckets += 1
            stats.kinds += (payload.kind,)
        _wait(in_flight)
        self._header(None)
        stats.seconds = time.perf_counter() - start
        return stats

    def receive(self, sampler: Sampler) -> TransferStats:
        start, stats = time.perf_counter(), TransferStats()
        pending: dict[str, torch.Tensor] = {}
        failure: Exception | None = None
        arrived = None  # the previous bucket (header, buffer), installed during the next one
        while (header := self._header(None)) is not None:
            if "abort" in header:
                raise RuntimeError(f"the trainer stopped the weight sync: {header['abort']}")
            size = sum(entry[4] for entry in header["entries"])
            buffer = torch.empty(size, dtype=torch.uint8, device=self.device)
            work = self._broadcast(buffer, async_op=True)
            failure = failure or self._install_safely(sampler, arrived, pending)
            work.wait()
            arrived = header, buffer
            stats.tensors += len(header["entries"])
            stats.bytes += size
            stats.buckets += 1
            if header["last"]:
                stats.kinds += (header["meta"]["kind"],)
        failure = failure or self._install_safely(sampler, arrived, pending)
        if failure is not None:
            raise failure  # only now: the trainer had to be able to finish sending
        stats.seconds = time.perf_counter() - start
        return stats

    def _install_safely(
        self, sampler: Sampler, arrived: tuple | None, pending: dict
    ) -> Exception | None:
        """Install one bucket; an error is returned, for ``receive`` to raise at the end."""
        if arrived is None:
            return None
        header, buffer = arrived
        try:
            self._install(sampler, header, _unpack(header["entries"], buffer), pending)
        except Exception as exc:
            return exc
        return None

    @staticmethod
    def _install(
        sampler: Sampler, header: dict, tensors: dict[str, torch.Tensor], pending: dict
    ) -> None:
        meta = header["meta"]
        if meta["kind"] == BASE:
            apply_payload(sampler, Payload(BASE, tensors))
            return
        pending.update(tensors)
        if header["last"]:
            apply_payload(sampler, Payload(tensors=dict(pending), **meta))
            pending.clear()
