"""Weight sync across processes: a torch.distributed broadcast in buckets.

The trainer's rank (``src``) packs tensors into flat byte buffers of at most ``bucket_bytes``
and broadcasts, for each bucket, a small header (names, dtypes, shapes, offsets, the
payload's kind) and then the buffer; every other rank of the group unpacks and installs the
bucket in its sampler at once, so no side holds more than one bucket beyond the weights.
A LoRA adapter is installed once all its buckets arrived (an adapter is replaced whole).
A ``None`` header ends the sync. gloo moves CPU buffers; NCCL/HCCL need ``device`` to be
the rank's accelerator.
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist

from twinkle.checkpoint_engine.base import CheckpointEngine, TransferStats, apply_payload
from twinkle.checkpoint_engine.payload import BASE, Payload, iter_buckets
from twinkle.sampler.base import Sampler

DEFAULT_BUCKET_BYTES = 256 * 2**20


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


class BroadcastEngine(CheckpointEngine):
    """``send`` on rank ``src``, ``receive(sampler)`` on the others, in the same order."""

    def __init__(
        self,
        group: Any = None,
        src: int = 0,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        device: str | torch.device = "cpu",
    ) -> None:
        if not dist.is_initialized():
            raise RuntimeError(
                "BroadcastEngine needs torch.distributed: run under torchrun or in a Ray group "
                "that joined a process group, or use InProcessEngine for one process"
            )
        if bucket_bytes < 1:
            raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
        self.group, self.src, self.bucket_bytes = group, src, bucket_bytes
        self.device = torch.device(device)

    def _header(self, header: dict | None) -> dict | None:
        box = [header]
        dist.broadcast_object_list(box, src=self.src, group=self.group)
        return box[0]

    def send(self, payloads: list[Payload]) -> TransferStats:
        if dist.get_rank() != self.src:
            raise RuntimeError(f"send runs on the source rank {self.src}; call receive here")
        start, stats = time.perf_counter(), TransferStats()
        for payload in payloads:
            buckets = list(iter_buckets(payload.tensors, self.bucket_bytes)) or [[]]
            for index, bucket in enumerate(buckets):
                entries, buffer = _pack(bucket, self.device)
                last = index == len(buckets) - 1
                self._header({"meta": payload.meta, "entries": entries, "last": last})
                dist.broadcast(buffer, src=self.src, group=self.group)
                stats.tensors += len(bucket)
                stats.bytes += buffer.numel()
                stats.buckets += 1
            stats.kinds += (payload.kind,)
        self._header(None)
        stats.seconds = time.perf_counter() - start
        return stats

    def receive(self, sampler: Sampler) -> TransferStats:
        start, stats = time.perf_counter(), TransferStats()
        pending: dict[str, torch.Tensor] = {}
        while (header := self._header(None)) is not None:
            size = sum(entry[4] for entry in header["entries"])
            buffer = torch.empty(size, dtype=torch.uint8, device=self.device)
            dist.broadcast(buffer, src=self.src, group=self.group)
            tensors = _unpack(header["entries"], buffer)
            meta = header["meta"]
            stats.tensors += len(tensors)
            stats.bytes += size
            stats.buckets += 1
            if meta["kind"] == BASE:
                apply_payload(sampler, Payload(BASE, tensors))
            else:
                pending.update(tensors)
            if header["last"]:
                stats.kinds += (meta["kind"],)
                if meta["kind"] != BASE:
                    apply_payload(sampler, Payload(tensors=pending, **meta))
                    pending = {}
        stats.seconds = time.perf_counter() - start
        return stats
