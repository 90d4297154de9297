"""PeerGroup: a torch.distributed process group of its own, between processes that already
belong to other groups.

A weight sync between Ray groups joins the model group's rank 0 and every sampler worker.
Each of them already has a default process group (its own DeviceGroup's), and torch allows
one default group per process, so this group is built directly from a TCPStore rendezvous
(``ProcessGroupGloo``/``ProcessGroupNCCL`` over a ``PrefixStore``) instead of through
``init_process_group`` or ``new_group``, which only split the default group. Its collectives
are called on the group object itself; only ``broadcast`` is needed.

The sender hosts the store (``open_store`` picks a free port), the receivers connect to it;
building a PeerGroup blocks until all ``world_size`` members have joined. gloo moves CPU
tensors; NCCL needs the rank's CUDA device set beforehand and CUDA tensors (that branch is
written but has not run here: this machine has no GPU).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

PREFIX = "twinkle-weight-sync"
BACKENDS = ("gloo", "nccl")


def open_store(host: str, world_size: int, timeout: timedelta) -> dist.TCPStore:
    """The rendezvous, hosted by rank 0 on a free port of ``host`` (``store.port``)."""
    return dist.TCPStore(
        host, 0, world_size, is_master=True, wait_for_workers=False, timeout=timeout
    )


def connect_store(host: str, port: int, world_size: int, timeout: timedelta) -> dist.TCPStore:
    return dist.TCPStore(host, port, world_size, is_master=False, timeout=timeout)


class PeerGroup:
    """Rank ``rank`` of a ``world_size``-process group built on ``store``."""

    def __init__(
        self,
        store: dist.Store,
        rank: int,
        world_size: int,
        backend: str = "gloo",
        timeout: timedelta = timedelta(minutes=10),
    ) -> None:
        if backend not in BACKENDS:
            raise ValueError(
                f"a weight-sync group runs on {' or '.join(BACKENDS)}, not {backend!r}; on "
                "other accelerators sync through a shared folder "
                "(CheckpointEngineManager(..., transport='folder'))"
            )
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside a group of {world_size}")
        self.rank, self.world_size, self.backend = rank, world_size, backend
        prefixed = dist.PrefixStore(PREFIX, store)
        if backend == "gloo":
            self._group = dist.ProcessGroupGloo(prefixed, rank, world_size, timeout)
        else:
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = timeout
            self._group = dist.ProcessGroupNCCL(prefixed, rank, world_size, options)

    def broadcast(self, tensor: torch.Tensor, src: int, async_op: bool = False) -> Any:
        """In place, as ``dist.broadcast``; ``src`` is a rank of this group. With ``async_op``
        returns the work to ``wait()`` on (keep ``tensor`` alive until then)."""
        options = dist.BroadcastOptions()
        options.rootRank = src
        work = self._group.broadcast([tensor], options)
        if async_op:
            return work
        work.wait()
        return None
