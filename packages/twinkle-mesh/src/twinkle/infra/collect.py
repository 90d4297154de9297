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

COLLECT_MODES = ("none", "flatten", "mean", "sum", "first", "last_pp", "rows")
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
    - ``'rows'``: what one process would have returned for the whole batch of a
      batch method (``forward_backward``, ``forward_only``), the rows cut by
      ``dispatch='slice_dp'``: see :func:`join_rows`. One result per data rank is
      read (the last pipeline stage's first tp/cp/Ulysses peer), in data-rank
      order; without a device_mesh every result is a data rank's.
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
    if mode == "rows":
        shares = results if device_mesh is None else _per_data_rank(results, device_mesh, mode)
        return join_rows(shares)
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


def _per_data_rank(results: list, device_mesh: DeviceMesh | None, mode: str) -> list:
    """One result per data rank, from the last pipeline stage's first peer, in data-rank order."""
    if not isinstance(device_mesh, DeviceMesh):
        raise ValueError(
            f"collect={mode!r} needs the component's device_mesh to find the last pipeline "
            f"stage; got {device_mesh!r}"
        )
    if device_mesh.world_size != len(results):
        raise ValueError(
            f"collect={mode!r}: {len(results)} results for a device_mesh of world_size "
            f"{device_mesh.world_size}; expected one result per rank"
        )
    last_stage = device_mesh.size("pp") - 1
    by_data_rank: dict[int, Any] = {}
    for rank, result in enumerate(results):
        if device_mesh.coords(rank).get("pp", 0) == last_stage:
            by_data_rank.setdefault(device_mesh.data_rank_of(rank), result)
    return [by_data_rank[k] for k in sorted(by_data_rank)]


def _last_pp(results: list, device_mesh: DeviceMesh | None) -> Any:
    picked = _per_data_rank(results, device_mesh, "last_pp")
    return picked[0] if len(picked) == 1 else _flatten(picked, "")


def join_rows(shares: list) -> Any:
    """The result of a batch method for the whole batch, from each data rank's result for its
    rows (in data-rank order, so joining restores the batch's row order).

    A result is a mapping (a ModelOutput, rebuilt as one, or a dict) or a single value:

    - arrays and tensors with a row axis are concatenated along it; shorter trailing axes
      (per-token logps of a share with shorter rows) are right-padded with 0, as a model
      pads its own rows, and a share without rows adds nothing;
    - lists and tuples are concatenated;
    - ``num_tokens`` (the loss's normaliser) is summed, and ``loss``, the mean of a sum over
      the share's ``num_tokens``, becomes the batch's: the shares' sums over the summed
      count. A share without tokens (``num_tokens`` 0 or a ``loss`` of None) adds nothing;
    - any other value must be the same on every share (None counts as missing).
    """
    if not shares:
        raise ValueError("collect='rows' got no results (zero workers)")
    if all(share is None for share in shares):
        return None
    if all(hasattr(share, "keys") and hasattr(share, "__getitem__") for share in shares):
        return _join_mappings(shares)
    return _join_values(shares, "the result")


def _join_mappings(shares: list) -> Any:
    keys = list(dict.fromkeys(key for share in shares for key in share))
    columns = {key: [share.get(key) for share in shares] for key in keys}
    joined = {
        key: _join_values(values, f"result[{key!r}]")
        for key, values in columns.items()
        if key not in ("loss", "num_tokens")
    }
    if "loss" in columns:
        joined["loss"] = _joined_loss(columns["loss"], columns.get("num_tokens"))
    if "num_tokens" in columns:
        counts = [n for n in columns["num_tokens"] if n is not None]
        joined["num_tokens"] = functools.reduce(operator.add, counts) if counts else None
    kind = type(shares[0])
    return dict(joined) if isinstance(shares[0], dict) else kind(**joined)


def _joined_loss(losses: list, counts: list | None) -> Any:
    """Sum over the shares' summed losses over their summed token counts."""
    present = [(i, loss) for i, loss in enumerate(losses) if loss is not None]
    if not present:
        return None
    if counts is None or any(counts[i] is None for i, _ in present):
        if len(present) == 1:
            return present[0][1]
        raise ValueError(
            "collect='rows': several workers returned a loss without its num_tokens, so the "
            "batch's loss (their summed losses over their summed tokens) cannot be formed; "
            "return num_tokens beside the loss"
        )
    weighted = [(float(loss) * float(counts[i]), float(counts[i])) for i, loss in present]
    tokens = sum(count for _, count in weighted)
    if tokens <= 0:
        return None
    return sum(total for total, _ in weighted) / tokens


def _rows_of(value: Any) -> int | None:
    """The number of rows of an array or tensor with a row axis, else None."""
    shape = getattr(value, "shape", None)
    if shape is None or len(shape) == 0 or not hasattr(value, "__getitem__"):
        return None
    return int(shape[0])


def _join_values(values: list, where: str) -> Any:
    present = [v for v in values if v is not None]
    if not present:
        return None
    if all(isinstance(v, list | tuple) for v in present):
        joined = [item for value in present for item in value]
        return tuple(joined) if isinstance(present[0], tuple) else joined
    if all(_rows_of(v) is not None for v in present):
        return _concat_rows(present, where)
    first = present[0]
    for share, value in enumerate(values):
        if value is not None and not _same(value, first):
            raise ValueError(
                f"collect='rows': {where} is {first!r} on one data rank but {value!r} on data "
                f"rank {share}; a per-row value must be a list or an array with a row axis"
            )
    return first


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except (TypeError, ValueError):
        return a is b


def _concat_rows(parts: list, where: str) -> Any:
    with_rows = [p for p in parts if _rows_of(p) > 0] or parts[:1]
    if len(with_rows) == 1:
        return with_rows[0]
    ndims = {len(p.shape) for p in with_rows}
    if len(ndims) > 1:
        shapes = [tuple(p.shape) for p in with_rows]
        raise ValueError(
            f"collect='rows': {where} has a different number of axes per worker ({shapes})"
        )
    width = [max(int(p.shape[axis]) for p in with_rows) for axis in range(1, ndims.pop())]
    if isinstance(with_rows[0], np.ndarray):
        padded = [np.pad(p, _np_padding(p.shape, width)) for p in with_rows]
        return np.concatenate(padded, axis=0)
    import torch  # a tensor came back, so torch is installed

    padded = [torch.nn.functional.pad(p, _torch_padding(p.shape, width)) for p in with_rows]
    return torch.cat(padded, dim=0)


def _np_padding(shape: tuple, width: list[int]) -> list[tuple[int, int]]:
    return [(0, 0)] + [(0, w - int(n)) for n, w in zip(shape[1:], width, strict=True)]


def _torch_padding(shape: tuple, width: list[int]) -> tuple[int, ...]:
    """torch's pad sizes run from the last axis backwards, (left, right) each."""
    pads: list[int] = []
    for n, w in reversed(list(zip(shape[1:], width, strict=True))):
        pads += [0, w - int(n)]
    return tuple(pads)
