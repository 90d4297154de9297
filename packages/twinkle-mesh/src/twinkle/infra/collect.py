"""Collect: how the results of a remote component's workers become one return value.

A pure function of (mode, per-worker results in worker order, mesh), tested
without Ray. Structures must agree across workers (same dict keys, same list
lengths for 'mean'/'sum'); a mismatch names the key path and the worker, since
silently dropping or broadcasting a worker's result would corrupt a metric.
"""

from __future__ import annotations

import functools
import numbers
import operator
from collections.abc import Callable
from typing import Any

import numpy as np

from twinkle.mesh import DeviceMesh

COLLECT_MODES = ("none", "flatten", "mean", "sum", "first", "last_pp")
Collector = Callable[[list, DeviceMesh | None], Any]


def check_collect_mode(mode: str | Collector) -> None:
    """Reject a mode that is neither a known name nor a function."""
    if callable(mode) or mode in COLLECT_MODES:
        return
    raise ValueError(
        f"unknown collect mode {mode!r}; use one of {', '.join(map(repr, COLLECT_MODES))}, "
        "or a function (all_results, device_mesh) -> result"
    )


def collect(mode: str | Collector, results: list, device_mesh: DeviceMesh | None = None) -> Any:
    """Combine ``results`` (one per worker, in worker order) according to ``mode``.

    - ``'none'``: the list as is.
    - ``'flatten'``: what a single worker would have returned for the whole
      batch. Lists and tuples are concatenated in worker order, numpy arrays
      along axis 0, dicts key by key (recursively). Scalars (numbers, strings,
      0-d arrays, any other object) cannot be concatenated, so they are
      gathered into a list with one entry per worker; when every worker
      returned None the result is None.
    - ``'mean'`` / ``'sum'``: element-wise over numbers and numpy arrays,
      recursively through dicts, lists and tuples. Every worker's result
      counts, so tp/pp peers that return the same value are summed as many
      times as there are peers ('mean' is unaffected). Anything that is not a
      number (bools and None included) raises TypeError naming its key path.
    - ``'first'``: worker 0's result.
    - ``'last_pp'``: the results of the last pipeline stage, one per data rank
      (its first tp/cp/Ulysses peer), flattened in data-rank order; a single
      one is returned as is. Needs the component's device_mesh.
    - a function ``(all_results, device_mesh) -> result``.
    """
    check_collect_mode(mode)
    if not isinstance(results, list | tuple):
        raise TypeError(f"results must be a list with one entry per worker, got {type(results)}")
    results = list(results)
    if callable(mode):
        return mode(results, device_mesh)
    if mode == "none":
        return results
    if not results:
        raise ValueError(f"collect={mode!r} got no results (zero workers)")
    if mode == "first":
        return results[0]
    if mode == "flatten":
        return _flatten(results, "")
    if mode == "last_pp":
        return _last_pp(results, device_mesh)
    return _reduce(results, "", mode)


def _where(path: str) -> str:
    return f"result{path}" if path else "the result"


def _kind(value: Any) -> str:
    if value is None:
        return "None"
    if isinstance(value, dict):
        return "dict"
    if isinstance(value, list | tuple):
        return "list"
    if isinstance(value, np.ndarray) and value.ndim > 0:
        return "array"
    return "scalar"


def _check_same_kind(values: list, path: str, mode: str) -> str:
    kinds = [_kind(v) for v in values]
    for worker, (kind, value) in enumerate(zip(kinds, values, strict=True)):
        if kind != kinds[0]:
            raise TypeError(
                f"collect={mode!r}: workers disagree at {_where(path)}: worker 0 returned "
                f"{type(values[0]).__name__}, worker {worker} returned {type(value).__name__}"
            )
    return kinds[0]


def _check_same_keys(values: list[dict], path: str, mode: str) -> None:
    keys = list(values[0])
    for worker, value in enumerate(values):
        if set(value) != set(keys):
            raise ValueError(
                f"collect={mode!r}: {_where(path)} has keys {sorted(map(str, keys))} on worker 0 "
                f"but {sorted(map(str, value))} on worker {worker}"
            )


def _flatten(values: list, path: str) -> Any:
    if all(v is None for v in values):
        return None
    kind = _check_same_kind(values, path, "flatten")
    if kind == "dict":
        _check_same_keys(values, path, "flatten")
        return {key: _flatten([v[key] for v in values], f"{path}[{key!r}]") for key in values[0]}
    if kind == "list":
        joined = [item for value in values for item in value]
        return tuple(joined) if isinstance(values[0], tuple) else joined
    if kind == "array":
        try:
            return np.concatenate(values, axis=0)
        except ValueError as exc:
            shapes = [v.shape for v in values]
            raise ValueError(
                f"collect='flatten': arrays at {_where(path)} cannot be joined along axis 0 "
                f"(shapes per worker: {shapes})"
            ) from exc
    return list(values)


def _is_number(value: Any) -> bool:
    if isinstance(value, np.ndarray):
        return np.issubdtype(value.dtype, np.number)
    return isinstance(value, numbers.Number) and not isinstance(value, bool)


def _reduce(values: list, path: str, mode: str) -> Any:
    kind = _check_same_kind(values, path, mode)
    if kind == "dict":
        _check_same_keys(values, path, mode)
        return {
            key: _reduce([v[key] for v in values], f"{path}[{key!r}]", mode) for key in values[0]
        }
    if kind == "list":
        lengths = [len(v) for v in values]
        if len(set(lengths)) > 1:
            raise ValueError(
                f"collect={mode!r}: {_where(path)} has a different length per worker: {lengths}"
            )
        reduced = [_reduce([v[i] for v in values], f"{path}[{i}]", mode) for i in range(lengths[0])]
        return tuple(reduced) if isinstance(values[0], tuple) else reduced
    for worker, value in enumerate(values):
        if not _is_number(value):
            shown = value.dtype if isinstance(value, np.ndarray) else type(value).__name__
            raise TypeError(
                f"collect={mode!r} needs numbers, but worker {worker} returned {shown} at "
                f"{_where(path)}"
            )
    shapes = [np.shape(v) for v in values]
    if len(set(shapes)) > 1:
        raise ValueError(
            f"collect={mode!r}: {_where(path)} has a different shape per worker: {shapes}"
        )
    total = functools.reduce(operator.add, values)
    return total / len(values) if mode == "mean" else total


def _last_pp(results: list, device_mesh: DeviceMesh | None) -> Any:
    if not isinstance(device_mesh, DeviceMesh):
        raise ValueError(
            "collect='last_pp' needs the component's device_mesh to find the last pipeline stage; "
            f"got {device_mesh!r}"
        )
    if device_mesh.world_size != len(results):
        raise ValueError(
            f"collect='last_pp': {len(results)} results for a device_mesh of world_size "
            f"{device_mesh.world_size}; expected one result per rank"
        )
    last_stage = device_mesh.size("pp") - 1
    by_data_rank: dict[int, Any] = {}
    for rank, result in enumerate(results):
        if device_mesh.coords(rank).get("pp", 0) == last_stage:
            by_data_rank.setdefault(device_mesh.data_rank_of(rank), result)
    picked = [by_data_rank[k] for k in sorted(by_data_rank)]
    return picked[0] if len(picked) == 1 else _flatten(picked, "")
