"""CheckpointEngineManager: keeps the sampler's weights equal to the trained model's.

``sync_weights(merge_and_sync=True)`` sends the full weights with the adapter merged in, each
time (what an engine without LoRA support needs). ``merge_and_sync=False`` sends the plain
base weights once, then only the adapter's tensors, which the sampler runs as a LoRA adapter:
for a rank-8 adapter that is well under 1% of the bytes. A model without adapters always
sends its full weights. One manager keeps to one of the two modes.

When model and sampler are Ray components on two DeviceGroups, ``transport='broadcast'``
(the default) links the model group's rank 0 and every sampler worker in a process group of
their own and broadcasts the same payloads in buckets of ``bucket_bytes``
(``between_groups.GroupBroadcast``; gloo on CPU, NCCL on CUDA). ``transport='folder'`` goes
through a checkpoint folder instead: the model's workers ``save`` (adapter only, or the full
weights without an adapter; no optimizer state) into ``sync_dir`` and the sampler's workers
``load_checkpoint`` it; the folder must be on a filesystem both groups see, and the sampler
builds its base from the same ``model_id``, so an adapter alone brings it level with a
merged sync. Neither way passes a tensor through the driver.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from twinkle.checkpoint_engine.base import CheckpointEngine, TransferStats
from twinkle.checkpoint_engine.broadcast import DEFAULT_BUCKET_BYTES
from twinkle.checkpoint_engine.in_process import InProcessEngine
from twinkle.checkpoint_engine.payload import Payload, sync_payloads
from twinkle.sampler.base import Sampler

TRANSPORTS = ("broadcast", "folder")


def check_same_architecture(payload: Payload, sampler: Sampler) -> None:
    """A clear error when the model's weights do not fit the sampler's."""
    check_same_shapes(
        {n: tuple(t.shape) for n, t in payload.tensors.items()},
        {n: tuple(shape) for n, (shape, _) in sampler.weight_names().items()},
    )


def check_same_shapes(ours: dict[str, tuple], theirs: dict[str, tuple]) -> None:
    """A clear error when the model's base weight shapes (``ours``) differ from the sampler's."""
    missing = sorted(set(ours) - set(theirs))
    extra = sorted(set(theirs) - set(ours))
    shapes = sorted(n for n in set(ours) & set(theirs) if ours[n] != tuple(theirs[n]))
    if missing or extra or shapes:
        details = []
        if missing:
            details.append(f"the sampler lacks {missing[:3]}")
        if extra:
            details.append(f"the model lacks {extra[:3]}")
        if shapes:
            name = shapes[0]
            details.append(
                f"shapes differ for {len(shapes)} weights, e.g. {name}: model {ours[name]}, "
                f"sampler {tuple(theirs[name])}"
            )
        raise ValueError(
            "sync_weights: model and sampler have different architectures ("
            + "; ".join(details)
            + "); build the sampler from the same model_id as the model"
        )


class CheckpointEngineManager:
    """Syncs ``model`` (a TransformersModel, or a torch module) into ``sampler``.

    ``engine`` defaults to ``InProcessEngine(sampler)``; pass a ``BroadcastEngine`` to send to
    samplers in other processes, which call ``engine.receive(their_sampler)`` meanwhile
    (``sampler`` is then None on the trainer's side, and each receiving sampler checks the
    names and shapes it gets). Between Ray groups ``transport``, ``bucket_bytes`` and
    ``timeout_s`` (per collective) choose how the weights travel (module docstring).
    ``last_stats`` holds what the last sync moved.
    """

    def __init__(
        self,
        model: Any,
        sampler: Sampler | None,
        engine: CheckpointEngine | None = None,
        *,
        transport: str = "broadcast",
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        timeout_s: float = 600.0,
    ) -> None:
        if sampler is None and engine is None:
            raise ValueError("pass the sampler, or an engine that reaches samplers elsewhere")
        if transport not in TRANSPORTS:
            raise ValueError(
                f"unknown transport {transport!r}; use one of {', '.join(map(repr, TRANSPORTS))}"
            )
        if bucket_bytes < 1:
            raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
        self.model = model
        self.sampler = sampler
        self.engine = engine if engine is not None else InProcessEngine(sampler)
        self.transport, self.bucket_bytes, self.timeout_s = transport, bucket_bytes, timeout_s
        self._between_groups: Any = None
        self.sync_dir: Path | None = None
        self._syncs = 0
        self._mode: bool | None = None
        self._base_sent = False
        self.last_stats: TransferStats | None = None

    def payloads(self, merge_and_sync: bool, adapter_name: str | None = None) -> list[Payload]:
        """What this sync sends, in order."""
        return sync_payloads(self.model, merge_and_sync, adapter_name, not self._base_sent)

    def sync_weights(
        self, merge_and_sync: bool = True, *, adapter_name: str | None = None
    ) -> TransferStats:
        if self._mode is not None and self._mode != merge_and_sync:
            raise ValueError(
                f"this manager synced with merge_and_sync={self._mode} before; the sampler then "
                "holds weights of that mode, so keep to it (or build a new sampler and manager)"
            )
        if not _in_process(self.model):
            if self.transport == "folder":
                return self._sync_through_folder(merge_and_sync, adapter_name)
            return self._sync_by_broadcast(merge_and_sync, adapter_name)
        payloads = self.payloads(merge_and_sync, adapter_name)
        if self.sampler is not None and payloads[0].kind == "base" and self._mode is None:
            check_same_architecture(payloads[0], self.sampler)
        self.last_stats = self.engine.send(payloads)
        self._mode = merge_and_sync
        self._base_sent = True
        if self.sampler is not None:
            self.sampler.reset_prefix_cache()
        return self.last_stats

    def _sync_by_broadcast(self, merge_and_sync: bool, adapter_name: str | None) -> TransferStats:
        """Ray groups: the model group's rank 0 broadcasts to the sampler workers."""
        if self.sampler is None:
            raise ValueError("a sync between Ray groups needs the sampler component")
        if self._between_groups is None:
            from twinkle.checkpoint_engine.between_groups import GroupBroadcast

            link = GroupBroadcast(self.model, self.sampler, self.bucket_bytes, self.timeout_s)
            check_same_shapes(*link.architecture())
            self._between_groups = link
        with_base = not self._base_sent
        self.last_stats = self._between_groups.sync(merge_and_sync, adapter_name, with_base)
        self._mode = merge_and_sync
        self._base_sent = True
        return self.last_stats

    def _sync_through_folder(self, merge_and_sync: bool, adapter_name: str | None) -> TransferStats:
        """Ray groups: the model's workers save, the sampler's workers load (no driver copy)."""
        if self.sampler is None:
            raise ValueError("a sync between Ray groups needs the sampler component")
        start = time.perf_counter()
        if self.sync_dir is None:
            self.sync_dir = Path(tempfile.mkdtemp(prefix="twinkle-weight-sync-"))
        self._syncs += 1
        folder = self.model.save(
            f"sync-{self._syncs}",
            output_dir=str(self.sync_dir),
            adapter_name=adapter_name,
            save_optimizer=False,
        )
        self.sampler.load_checkpoint(folder)
        self.sampler.reset_prefix_cache()
        sent = sum(f.stat().st_size for f in Path(folder).glob("*.safetensors"))
        shutil.rmtree(folder, ignore_errors=True)  # loaded: the next sync writes a new one
        self._mode = merge_and_sync
        self.last_stats = TransferStats(
            tensors=0,
            bytes=sent,
            buckets=1,
            seconds=time.perf_counter() - start,
            kinds=("checkpoint",),
        )
        return self.last_stats


def _in_process(model: Any) -> bool:
    """Whether the model's module lives in this process (not a Ray component's handle)."""
    return isinstance(model, torch.nn.Module) or isinstance(
        getattr(model, "model", None), torch.nn.Module
    )
