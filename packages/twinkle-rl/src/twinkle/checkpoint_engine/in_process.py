"""The engine for a sampler living in the trainer's process: tensors are handed over, with one
copy into the sampler's own weights."""

from __future__ import annotations

import time

from twinkle.checkpoint_engine.base import CheckpointEngine, TransferStats, apply_payload
from twinkle.checkpoint_engine.payload import Payload
from twinkle.sampler.base import Sampler


class InProcessEngine(CheckpointEngine):
    def __init__(self, sampler: Sampler) -> None:
        self.sampler = sampler

    def send(self, payloads: list[Payload]) -> TransferStats:
        start = time.perf_counter()
        for payload in payloads:
            apply_payload(self.sampler, payload)
        return TransferStats(
            tensors=sum(len(p.tensors) for p in payloads),
            bytes=sum(p.num_bytes for p in payloads),
            buckets=len(payloads),
            seconds=time.perf_counter() - start,
            kinds=tuple(p.kind for p in payloads),
        )
