"""Dispatch: which part of a call's inputs each worker of a remote component receives.

A pure function of (mode, worker count, worker index, inputs, mesh), so the
Ray backend and the tests share one definition of how a batch is split.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from twinkle.mesh import DeviceMesh

DISPATCH_MODES = ("slice", "all", "slice_dp")
Dispatcher = Callable[[int, int, tuple, dict, DeviceMesh | None], tuple[tuple, dict]]


def check_dispatch_mode(mode: str | Dispatcher) -> None:
    """Reject a mode that is neither a known name nor a function."""
    if callable(mode) or mode in DISPATCH_MODES:
        return
    raise ValueError(
        f"unknown dispatch mode {mode!r}; use one of {', '.join(map(repr, DISPATCH_MODES))}, "
        "or a function (length, i, args, kwargs, device_mesh) -> (args, kwargs)"
    )


def even_slice(total: int, parts: int, index: int) -> slice:
    """Contiguous share ``index`` of ``range(total)`` cut in ``parts``; the lowest get the rest."""
    base, remainder = divmod(total, parts)
    start = index * base + min(index, remainder)
    return slice(start, start + base + (1 if index < remainder else 0))


def _split(value: Any, slice_of: Callable[[int], slice]) -> Any:
    """Cut every list, tuple and array (axis 0) inside ``value``; dicts are cut value-wise."""
    if isinstance(value, list | tuple):
        return value[slice_of(len(value))]
    if isinstance(value, np.ndarray) and value.ndim > 0:
        return value[slice_of(value.shape[0])]
    if isinstance(value, dict):
        return {key: _split(item, slice_of) for key, item in value.items()}
    return value


def _check_workers(num_workers: int, worker_index: int) -> None:
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
        raise ValueError(f"num_workers must be a positive integer, got {num_workers!r}")
    if isinstance(worker_index, bool) or not isinstance(worker_index, int):
        raise TypeError(f"worker_index must be an int, got {worker_index!r}")
    if not 0 <= worker_index < num_workers:
        raise ValueError(f"worker_index {worker_index} is outside 0..{num_workers - 1}")


def dispatch(
    mode: str | Dispatcher,
    num_workers: int,
    worker_index: int,
    args: tuple,
    kwargs: dict,
    device_mesh: DeviceMesh | None = None,
) -> tuple[tuple, dict]:
    """The ``(args, kwargs)`` that worker ``worker_index`` of ``num_workers`` receives.

    Modes:

    - ``'slice'``: every list or tuple argument is cut into ``num_workers``
      contiguous shares whose sizes differ by at most one (the lowest workers
      take the remainder); numpy arrays are cut along axis 0; dicts are cut
      value-wise and recursively, so a dict of equal-length columns stays
      aligned. Anything else (strings, numbers, objects) goes whole to every
      worker.
    - ``'all'``: every worker receives everything.
    - ``'slice_dp'``: like ``'slice'``, but the share is
      ``device_mesh.get_slice(len, rank=worker_index)``: workers that are
      tp/pp/cp/Ulysses peers read the same data. The mesh must have one rank
      per worker.
    - a function ``(length, i, args, kwargs, device_mesh) -> (args, kwargs)``
      where ``length`` is the number of workers and ``i`` this worker's index.
      ``device_mesh`` is the component's mesh bound to worker ``i``
      (``DeviceMesh.at_rank``), so its ``data_rank``, ``dp_rank``, ... are that
      worker's wherever the function runs; None when the call's workers are not
      the mesh's ranks (``execute='first'`` on a larger mesh).

    A batch shorter than the number of shares is not an error: the workers
    past the data receive empty lists (empty tuples, arrays with 0 rows), so
    every worker still runs and the results keep their worker order.
    """
    check_dispatch_mode(mode)
    _check_workers(num_workers, worker_index)
    args, kwargs = tuple(args), dict(kwargs)
    if callable(mode):
        return _call_dispatcher(mode, num_workers, worker_index, args, kwargs, device_mesh)
    if mode == "all":
        return args, kwargs
    if mode == "slice":

        def slice_of(total: int) -> slice:
            return even_slice(total, num_workers, worker_index)

    else:
        _check_dp_mesh(device_mesh, num_workers)

        def slice_of(total: int) -> slice:
            return device_mesh.get_slice(total, rank=worker_index)

    return (
        tuple(_split(arg, slice_of) for arg in args),
        {key: _split(value, slice_of) for key, value in kwargs.items()},
    )


def _check_dp_mesh(device_mesh: DeviceMesh | None, num_workers: int) -> None:
    if not isinstance(device_mesh, DeviceMesh):
        raise ValueError(
            "dispatch='slice_dp' needs the component's device_mesh to know which workers share "
            f"a data slice; got {device_mesh!r}"
        )
    if device_mesh.world_size != num_workers:
        raise ValueError(
            f"dispatch='slice_dp': the device_mesh has world_size {device_mesh.world_size} but "
            f"there are {num_workers} workers; the mesh must have one rank per worker"
        )


def _call_dispatcher(
    dispatcher: Dispatcher,
    num_workers: int,
    worker_index: int,
    args: tuple,
    kwargs: dict,
    device_mesh: DeviceMesh | None,
) -> tuple[tuple, dict]:
    if device_mesh is not None and device_mesh.world_size == num_workers:
        device_mesh = device_mesh.at_rank(worker_index)
    out = dispatcher(num_workers, worker_index, args, kwargs, device_mesh)
    if (
        not isinstance(out, tuple | list)
        or len(out) != 2
        or not isinstance(out[0], tuple | list)
        or not isinstance(out[1], dict)
    ):
        name = getattr(dispatcher, "__qualname__", repr(dispatcher))
        got = type(out).__name__
        if isinstance(out, tuple | list):
            got += "(" + ", ".join(type(item).__name__ for item in out) + ")"
        raise TypeError(
            f"dispatch function {name} must return (args, kwargs), a (tuple, dict); got {got}"
        )
    return tuple(out[0]), out[1]
