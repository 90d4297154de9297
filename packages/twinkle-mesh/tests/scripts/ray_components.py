"""Small remote components for the Ray tests of twinkle-mesh (no data or model packages).

Importable by the Ray workers: the tests put this folder on their PYTHONPATH.
"""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import torch
import torch.distributed as dist

from twinkle import DeviceMesh, remote_class, remote_function
from twinkle.infra import get_global_device_mesh, get_mode, get_worker_group


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def halves(length, i, args, kwargs, device_mesh):
    """A dispatch function: worker i gets every other item starting at i."""
    return tuple(a[i::length] for a in args), kwargs


def rank_table(all_results, device_mesh):
    """A collect function: {rank: result}."""
    return {rank: result for rank, result in enumerate(all_results)}


@remote_class(execute="all")
class Shard:
    """Every rank holds one; methods cover the dispatch and collect modes."""

    def __init__(self, scale: int = 1, device_mesh: DeviceMesh | None = None) -> None:
        self.scale = scale
        self.device_mesh = device_mesh or get_global_device_mesh()

    @remote_function(dispatch="all", collect="none", lazy_collect=False)
    def whoami(self) -> dict:
        """What the worker's process sees: its rank, env and a gloo all_reduce of ranks."""
        value = torch.tensor([float(_rank())])
        dist.all_reduce(value)
        return {
            "rank": _rank(),
            "world_size": dist.get_world_size(),
            "backend": dist.get_backend(),
            "env_rank": os.environ["RANK"],
            "master": os.environ["MASTER_ADDR"],
            "local_rank": os.environ["LOCAL_RANK"],
            "sum_of_ranks": value.item(),
            "mode": get_mode(),
            "worker_group": get_worker_group(),
            "pid": os.getpid(),
        }

    @remote_function(dispatch="slice", collect="none", lazy_collect=False)
    def take_slice(self, batch, tag="t"):
        return (_rank(), list(batch), tag)

    @remote_function(dispatch="all", collect="none", lazy_collect=False)
    def take_all(self, batch):
        return (_rank(), list(batch))

    @remote_function(dispatch="slice_dp", collect="flatten", lazy_collect=False)
    def times_scale(self, batch):
        return [x * self.scale for x in batch]

    @remote_function(dispatch=halves, collect=rank_table, lazy_collect=False)
    def take_halves(self, batch):
        return list(batch)

    @remote_function(dispatch="all", collect="mean", lazy_collect=False)
    def rank_mean(self):
        return {"rank": float(_rank()), "arr": np.full(2, float(_rank()))}

    @remote_function(dispatch="all", collect="sum", lazy_collect=False)
    def rank_sum(self):
        return float(_rank() + 1)

    @remote_function(dispatch="all", collect="first", lazy_collect=False)
    def first_rank(self):
        return _rank()

    @remote_function(dispatch="all", collect="last_pp", lazy_collect=False)
    def stage(self):
        return [f"stage of rank {_rank()}"]

    @remote_function(dispatch="all", execute="first", collect="none", lazy_collect=False)
    def only_first(self):
        return _rank()

    @remote_function(dispatch="slice_dp", collect="flatten")
    def lazy_double(self, batch):
        return [2 * x for x in batch]

    @remote_function(dispatch="all", collect="none", sync=True)
    def sync_fail(self, bad_rank):
        if _rank() == bad_rank:
            raise ValueError(f"sync failure on rank {bad_rank}")
        return _rank()

    @remote_function(dispatch="all", collect="first", lazy_collect=False)
    def fail_on(self, bad_rank):
        if _rank() == bad_rank:
            raise ValueError(f"bad input on rank {bad_rank}")
        return _rank()

    @remote_function(dispatch="all", collect="first")
    def lazy_fail_on(self, bad_rank):
        if _rank() == bad_rank:
            raise KeyError("lazy failure")
        return _rank()

    @remote_function(dispatch="all", collect="none", lazy_collect=False)
    def die_on(self, bad_rank):
        """The bad rank kills its own process; the others wait for it in a collective."""
        if _rank() == bad_rank:
            time.sleep(0.5)
            os.kill(os.getpid(), signal.SIGKILL)
        dist.barrier()
        return _rank()


@remote_class(execute="first")
class Numbers:
    """An iterator of batches, like a DataLoader built on one worker."""

    def __init__(self, count: int, batch_size: int) -> None:
        self.rows = list(range(count))
        self.batch_size = batch_size
        self.position = 0

    @remote_function(dispatch="all", collect="first", lazy_collect=False)
    def __len__(self) -> int:
        return -(-len(self.rows) // self.batch_size)

    @remote_function(dispatch="all", collect="first")
    def __iter__(self):
        self.position = 0
        return self

    @remote_function(dispatch="all", collect="first")
    def __next__(self):
        if self.position >= len(self.rows):
            raise StopIteration
        batch = self.rows[self.position : self.position + self.batch_size]
        self.position += self.batch_size
        return batch

    @remote_function(dispatch="all", collect="first", lazy_collect=False)
    def where(self):
        return (get_worker_group(), _rank(), os.getpid())


@remote_class(execute="all")
class Summer:
    """On a second group: receives lazy results produced on the first."""

    def __init__(self) -> None:
        self.seen = []

    @remote_function(dispatch="slice", collect="none", lazy_collect=False)
    def total(self, values):
        self.seen.append(list(values))
        return (_rank(), sum(values))


@remote_class(execute="first")
class Head:
    """Takes another component of its group as a constructor argument."""

    def __init__(self, source) -> None:
        self.source = source

    @remote_function(dispatch="all", collect="first", lazy_collect=False)
    def first_batch(self):
        return next(iter(self.source))


# ---- the RemoteClass page's samples ---------------------------------------------------------


@remote_class(execute="first")
class MyComponent:
    """The page's MyComponent: built on the group's first worker."""

    def __init__(self, **kwargs):
        self.kwargs = kwargs

    @remote_function(dispatch="slice_dp", collect="first")
    def func(self, *args, **kwargs):
        return {"args": args, "kwargs": kwargs, "worker_group": get_worker_group()}


def _dispatcher(length, i, args, kwargs, device_mesh):
    # length is the number of workers, i this worker's rank; device_mesh is the component's
    # mesh, bound to worker i: the share of the batch that worker i's data rank reads.
    share = device_mesh.get_slice(len(args[0]))
    seen = {"data_rank": device_mesh.data_rank, "of": device_mesh.data_world_size, "i": i}
    return (args[0][share],), {**kwargs, "seen": seen}


def _collect(all_results, device_mesh):
    # One result per data rank (the ranks whose tp coordinate is 0), in data-rank order.
    tp_axis = device_mesh.mesh_dim_names.index("tp")
    first_tp = device_mesh.mesh.take(0, axis=tp_axis).ravel().tolist()
    return [
        item
        for rank in sorted(first_tp, key=device_mesh.data_rank_of)
        for item in all_results[rank]
    ]


@remote_class(execute="all")
class PageShard:
    """A component whose method dispatches and collects with the page's functions."""

    def __init__(self, device_mesh: DeviceMesh) -> None:
        self.device_mesh = device_mesh

    @remote_function(dispatch=_dispatcher, collect=_collect)
    def tag(self, batch, seen):
        return [(item, seen, _rank()) for item in batch]
