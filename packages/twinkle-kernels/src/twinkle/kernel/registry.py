"""Which implementation of an op runs: the torch reference, or a registered fast path.

Every op has a torch reference that runs anywhere (CPU tests use it). A fast path names
the package it needs and the device types it runs on; it is chosen only when the tensors
are on such a device AND the package is installed. Whether it is installed is checked
with ``importlib.util.find_spec``, which does not import it: flash-linear-attention, once
imported, makes transformers pick its Triton kernels for every model, which breaks CPU
runs, so nothing here imports a fast-path package until a tensor on its device asks.
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass

import torch

REFERENCE = "torch"


@dataclass(frozen=True)
class FastPath:
    """A faster implementation of an op: ``load()`` imports ``package`` and returns it."""

    backend: str
    package: str
    device_types: frozenset[str]
    load: Callable[[], Callable]


_references: dict[str, Callable] = {}
_fast_paths: dict[str, list[FastPath]] = {}


def register_reference(op: str, implementation: Callable) -> None:
    _references[op] = implementation
    _fast_paths.setdefault(op, [])


def register_fast_path(op: str, path: FastPath) -> None:
    """Add ``path`` for ``op``; earlier registrations win when several apply."""
    others = [p for p in _fast_paths[_known(op)] if p.backend != path.backend]
    _fast_paths[op] = [*others, path]


def is_installed(package: str) -> bool:
    """Whether ``package`` can be imported, without importing it."""
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):
        return False


def backends(op: str, device: torch.device) -> list[str]:
    """The backends that can run ``op`` on ``device``, fastest first; the reference last."""
    usable = [
        p.backend
        for p in _fast_paths[_known(op)]
        if device.type in p.device_types and is_installed(p.package)
    ]
    return [*usable, REFERENCE]


def select(op: str, device: torch.device, backend: str | None = None) -> Callable:
    """The implementation of ``op`` for tensors on ``device``.

    ``backend=None`` picks the first usable fast path, else the reference;
    ``backend='torch'`` forces the reference; a fast path's name forces it, and is an
    error where it cannot run.
    """
    usable = backends(op, device)
    name = usable[0] if backend is None else backend
    if name == REFERENCE:
        return _references[op]
    if name not in usable:
        known = {p.backend: p for p in _fast_paths[op]}
        if name not in known:
            raise ValueError(
                f"unknown backend {name!r} for {op}; known: {', '.join([*known, REFERENCE])}"
            )
        path = known[name]
        raise ValueError(
            f"backend {name!r} cannot run {op} on {device.type}: it needs the "
            f"{path.package!r} package and a device of type {', '.join(sorted(path.device_types))}"
            f"; use backend='torch' (the reference) or None (choose automatically)"
        )
    return _load(op, name)


@functools.cache
def _load(op: str, backend: str) -> Callable:
    return next(p for p in _fast_paths[op] if p.backend == backend).load()


def _known(op: str) -> str:
    if op not in _references:
        raise ValueError(f"unknown op {op!r}; known: {', '.join(sorted(_references))}")
    return op
