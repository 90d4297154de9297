"""CheckpointEngine: how a weight sync's payloads travel from the trainer to the sampler.

``InProcessEngine`` hands tensors to a sampler in the same process; ``BroadcastEngine``
broadcasts them in buckets over a torch.distributed group (gloo on CPU, NCCL/HCCL on
accelerators), the transport between a trainer group and a sampler group.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from twinkle.checkpoint_engine.payload import Payload
from twinkle.sampler.base import Sampler


@dataclass
class TransferStats:
    """What one sync moved: tensors, bytes, buckets and seconds, and what kinds."""

    tensors: int = 0
    bytes: int = 0
    buckets: int = 0
    seconds: float = 0.0
    kinds: tuple[str, ...] = ()

    def add(self, other: TransferStats) -> TransferStats:
        return TransferStats(
            self.tensors + other.tensors,
            self.bytes + other.bytes,
            self.buckets + other.buckets,
            self.seconds + other.seconds,
            self.kinds + other.kinds,
        )


def apply_payload(sampler: Sampler, payload: Payload) -> None:
    """Install one payload (or one bucket of a base payload) into the sampler."""
    if payload.kind == "base":
        sampler.load_weights(payload.tensors.items())
    elif payload.kind == "lora":
        sampler.load_lora(payload.adapter_name, payload.config, payload.tensors)
    else:
        raise ValueError(f"unknown payload kind {payload.kind!r}")


class CheckpointEngine(ABC):
    """Moves payloads from the trainer to a sampler."""

    @abstractmethod
    def send(self, payloads: list[Payload]) -> TransferStats:
        """Move the payloads (on the trainer's side)."""
